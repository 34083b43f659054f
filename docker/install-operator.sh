#!/bin/sh
# Installs the operator from the source tree SRC into a new virtual environment VENV: only the
# `operator` extra, at the versions pinned in docker/operator-requirements.txt, so torch can
# never get in. docker/operator.Dockerfile runs exactly this, and tests/chart/test_images.py
# runs it on the host.
# Usage: install-operator.sh SRC VENV
set -eu
src="$(cd "$1" && pwd)"
venv="$2"
# Not from SRC: its operator/ folder would shadow the standard library's `operator` module.
cd /
python3 -m venv "$venv"
"$venv/bin/pip" install --no-cache-dir --disable-pip-version-check --quiet \
  --constraint "$src/docker/operator-requirements.txt" "$src[operator]"
