# The spectune engine (inference server): Debian's Python, a C/C++ compiler and the `engine`
# extra.
#   docker build -f docker/engine.Dockerfile -t ghcr.io/spectune/spectune-engine:0.1.0 .
# `make images` builds it with podman FROM a bookworm made from Debian's packages (BASE).
# No CUDA base image: PyPI's Linux torch wheel brings its CUDA libraries as nvidia-* wheels
# (CUDA 13, docker/engine-requirements.txt), so a base's CUDA would be dead weight. The node
# needs an NVIDIA driver that runs CUDA 13: version 580 or newer. The compiler and Python's
# headers are not dead weight: Triton (CUDA) and Inductor (CPU) build their launchers and
# kernels with them at run time, for Flex attention and the compiled small ops.
ARG BASE=debian:12.11-slim
FROM ${BASE}
ENV PATH=/opt/spectune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SPECTUNE_CACHE=/cache \
    HOME=/tmp
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
# The packages first, the project last: a change to the code reinstalls only the project, not
# the CUDA wheels. The wheels are kept in a build cache, never a layer, so that a rebuild of the
# packages does not download them again (`pip download` skips a wheel it has; pip's own HTTP
# cache keeps nothing behind a proxy that marks answers uncacheable). A CA bundle the build's
# network needs is a secret (`--secret id=ca,src=FILE`), never a layer either.
COPY docker/engine-requirements.txt /src/docker/
RUN --mount=type=cache,target=/var/cache/wheels --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python3 -m venv /opt/spectune \
    && /opt/spectune/bin/pip download --disable-pip-version-check --no-deps --only-binary=:all: \
       --dest /var/cache/wheels --requirement /src/docker/engine-requirements.txt \
    && /opt/spectune/bin/pip install --disable-pip-version-check --no-cache-dir --no-index \
       --find-links /var/cache/wheels --requirement /src/docker/engine-requirements.txt
COPY pyproject.toml /src/
COPY LICENSE /src/
COPY operator/ /src/operator/
COPY engine/ /src/engine/
COPY demo/ /src/demo/
COPY sim/ /src/sim/
# Built from / : the source's operator/ folder would shadow the standard library's module.
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && cd / && /opt/spectune/bin/pip install --disable-pip-version-check --no-cache-dir \
       --no-deps '/src[engine]' \
    && rm -rf /src
# A fixed non-root user: engine pods run as 10001 (Pod Security `restricted`) with a read-only
# root; what the engine writes goes to volumes the operator mounts: /tmp (HOME: Inductor's and
# Triton's caches), /cache (built-in models) and /dev/shm.
RUN groupadd --gid 10001 spectune && useradd --uid 10001 --gid 10001 --no-create-home spectune \
    && mkdir /cache && chown 10001:10001 /cache
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["spectune-engine"]
CMD ["serve"]
