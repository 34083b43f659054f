#!/usr/bin/env bash
# `make images`: both images, as users build them, with podman (no daemon): FROM a Debian
# bookworm made from Debian's packages by mmdebstrap (Docker Hub is not reachable here; the
# Dockerfiles name the Debian release, this is the same release), imported once as a local image.
# The tags are the chart's defaults. Installs podman, runc and mmdebstrap when missing (as root,
# from Debian's packages). The engine's wheels stay in a build cache and its packages' layer
# comes before the project's: a code change rebuilds in seconds.
#
# Usage: hack/images.sh [operator] [engine]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/hack/podman/containers.conf"
BASE="${SPECTUNE_IMAGE_BASE:-localhost/spectune/debian:bookworm}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)"
images=("$@")
((${#images[@]})) || images=(operator engine)

need=()
for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
if ((${#need[@]})); then
  ((EUID == 0)) || { echo "images: install ${need[*]} (Debian's packages) first" >&2; exit 1; }
  echo "images: installing ${need[*]} from Debian's packages"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! podman image exists "$BASE"; then
  echo "images: making $BASE from Debian's packages (mmdebstrap --variant=minbase, about a minute)"
  start=$SECONDS
  mmdebstrap --quiet --variant=minbase bookworm - \
      "deb http://deb.debian.org/debian bookworm main" \
      "deb http://deb.debian.org/debian bookworm-updates main" \
      "deb http://deb.debian.org/debian-security bookworm-security main" |
    podman import --quiet - "$BASE" >/dev/null
  echo "images: $BASE in $((SECONDS - start)) s"
fi

# The machine's CA bundle, for pip inside the build when the network needs it: a build secret,
# never a layer.
ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
secret=()
[[ -s "$ca" ]] && secret=(--secret "id=ca,src=$ca")

for image in "${images[@]}"; do
  case "$image" in operator | engine) ;; *) echo "images: no image $image (operator, engine)" >&2; exit 2 ;; esac
  tag="ghcr.io/spectune/spectune-$image:$version"
  echo "images: building $tag"
  start=$SECONDS
  podman build --network=host --build-arg "BASE=$BASE" "${secret[@]}" \
    -f "docker/$image.Dockerfile" -t "$tag" .
  size="$(podman image inspect --format '{{.Size}}' "$tag")"
  echo "images: $tag in $((SECONDS - start)) s, $((size / 1000000)) MB"
done
# A rebuild leaves the image it replaced untagged: gigabytes each for the engine.
podman image prune --force >/dev/null
