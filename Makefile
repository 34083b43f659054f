# spectune: `make test` installs what is missing and runs every test; `make demo` runs the main job;
# `make check` is the inner loop: lint and every test that needs neither the local cluster nor a
# Go-built tool nor the images and is not slow (the minute-long soak, the clean install, the SKU
# sweeps): about 4 minutes. The markers say which; collection fails on a test that lacks the
# marker it needs. `make images` builds both images with podman (hack/images.sh).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test check lint images demo bench-demo demo-down models bench-models crds chart-readme \
	clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[engine,operator,dev]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The tiny pair first: every lane of hack/test.sh uses it, and none must train it beside the
# others.
test: lint models
	@hack/test.sh

check: lint
	$(BIN)/pytest -m "not cluster and not tools and not slow and not images"

models: install
	$(BIN)/spectune-engine models build --size tiny

bench-models: install
	$(BIN)/spectune-engine models build --size bench

images:
	@hack/images.sh

crds: install
	$(BIN)/spectune-operator crd > crds/specdeployments.spectune.io.yaml

# charts/spectune/README.md from values.yaml's `# --` comments (a test fails when it is stale).
chart-readme: install
	$(BIN)/python hack/chart_readme.py

# The operator's story on the local cluster: builds binaries, models and the cluster when
# missing; the report goes to .cache/demo/. `make demo-down` stops what it left running, the
# cluster included.
demo: install
	@hack/demo.sh

# The engine's story: the bench on the tiny models (crossover, threshold, three policies).
bench-demo: models
	@hack/bench-demo.sh

demo-down:
	@hack/demo.sh down

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache

# --- local Kubernetes cluster (hack/cluster.sh): real etcd, kube-apiserver (RBAC), controller
# manager, scheduler, kwok fake GPU nodes, two Prometheus servers (one hand-configured, one the
# Prometheus Operator configures) and the pod runner, all on 127.0.0.1.
# `binaries` builds them from their Go modules (hack/tools/*) into .local/bin once, then is a
# no-op; a cold build takes tens of minutes on 2 cores.
.PHONY: binaries cluster-up cluster-down cluster-status

binaries:
	@hack/build-binaries.sh

cluster-up: install binaries
	@hack/cluster.sh up

cluster-down:
	@hack/cluster.sh down

cluster-status:
	@hack/cluster.sh status
