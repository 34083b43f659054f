# spectune: `make test` installs what is missing and runs every test; `make demo` runs the main job.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint demo models bench-models clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[engine,operator,dev]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest

models: install
	$(BIN)/spectune-engine models build --size tiny

bench-models: install
	$(BIN)/spectune-engine models build --size bench

demo: models
	@hack/demo.sh

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
