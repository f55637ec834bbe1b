# automq-py: `make run` starts the embedded broker, `make test` sets up and runs the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv run test lint unit integration bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv with the package and its test/dev extras

run: $(STAMP)  ## start the broker on 127.0.0.1:9092 (embedded: file WAL, local object store, SQLite)
	@if $(BIN)/automq-py serve --help >/dev/null 2>&1; then $(BIN)/automq-py serve; \
	else echo "make run: the Kafka listener ('automq-py serve') is not built yet; see README 'Status'" >&2; exit 1; fi

lint: $(STAMP)  ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint  ## lint, then every test (unit, integration against a real S3 server, fuzz)
	$(BIN)/pytest -q

unit: $(STAMP)  ## only the tests that need no server
	$(BIN)/pytest -q -m "not integration"

bench: $(STAMP)  ## storage benchmark (prints figures)
	$(BIN)/python bench/storage_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
