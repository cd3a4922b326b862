# tidegate — run `make help` for the list of targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
VAR     := var
STAMP   := $(VAR)/stamps

export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help setup bytecode up down status observe models test test-fast test-unit test-integration lint fmt docs typecheck demo bench clean

help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP)/venv $(STAMP)/kafka $(STAMP)/apicurio $(STAMP)/system $(STAMP)/deploy-tools bytecode ## Install system packages, the venv, the Kafka jars, a third-party registry for its test, and the deployment checkers.

# Where PYTHONDONTWRITEBYTECODE is set (this project's machines, most container images) Python
# never writes bytecode, and every process compiled the ~300 modules of the source tree again at
# each start: 0.17 s of CPU a worker, a gateway or a restart. compileall skips what is up to date.
PACKAGES := agents cli clients core dlq examples gateway lifecycle models schemas tidegate
bytecode: $(STAMP)/venv ## Compile the source tree's bytecode (run by setup; skips what is up to date).
	@$(BIN)/python -m compileall -q -j 0 $(PACKAGES)

$(STAMP)/system: infra/install-system.sh
	@mkdir -p $(STAMP)
	bash infra/install-system.sh
	@touch $@

# Every extra (a single host runs every part) plus the dev tools, at constraints.txt's exact versions.
$(STAMP)/venv: pyproject.toml constraints.txt
	@mkdir -p $(STAMP)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[all,dev]"
	@touch $@

# kubeconform and the Kubernetes, KEDA and Compose schemas the tests in tests/unit/deploy validate with.
$(STAMP)/deploy-tools: infra/deploy-tools.sh infra/deploy_schemas.py $(STAMP)/venv
	@mkdir -p $(STAMP)
	bash infra/deploy-tools.sh
	@touch $@

$(STAMP)/kafka: infra/kafka/pom.xml
	@mkdir -p $(STAMP) $(VAR)/kafka/lib
	rm -f $(VAR)/kafka/lib/*.jar
	mvn -q -B -f infra/kafka/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(VAR)/kafka/lib -DincludeScope=runtime
	@touch $@

# Apicurio Registry, built from Maven Central into var/apicurio: the registry we did not write that
# tests/integration/schemas/test_third_party_registry.py runs the pipeline against.
$(STAMP)/apicurio: infra/apicurio/pom.xml infra/apicurio/settings.xml infra/apicurio/src/main/resources/application.properties
	@mkdir -p $(STAMP)
	mvn -q -B -s infra/apicurio/settings.xml -f infra/apicurio/pom.xml package -DskipTests
	@touch $@

up: setup ## Start Kafka, the schema registry, PostgreSQL and Redis (idempotent).
	bash infra/stack.sh up

down: ## Stop what `make up` and `make demo DEMO_ARGS=--keep` started (by PID file).
	-test -x $(BIN)/tidegate && $(BIN)/tidegate demo-stop
	bash infra/stack.sh down

observe: setup ## Like `up`, plus a local Prometheus on :9090 scraping the gateway, workers and controller, with the alert rules.
	TIDEGATE_STACK_SERVICES=kafka,registry,postgres,redis,prometheus bash infra/stack.sh up

status: ## Show each server and each topic of the local stack.
	bash infra/stack.sh status

models: setup ## Build the example models (fraud 1/2/3, fraud-lite, minilm) into var/models and var/packages.
	$(BIN)/tidegate models build

# Files run on this many processes, each file whole on one (decision 022): most integration and
# e2e time is spent waiting on Kafka and on child processes, so 3 beat 2 on our 2 cores.
TEST_WORKERS ?= 3
PARALLEL = -n $(TEST_WORKERS) --dist loadfile

test: up models ## Run the whole suite (unit, integration, e2e) against the real stack, files in parallel.
	$(BIN)/pytest $(PARALLEL) -m "not solo" tests/unit tests/integration tests/e2e
	$(BIN)/pytest -m solo tests/e2e

test-fast: $(STAMP)/venv ## The fast tier: unit tests with no servers, subprocesses, wheel builds or torch; needs only the venv.
	$(BIN)/pytest tests/unit -m "not slow"

test-unit: setup ## Run the unit tests only (no servers needed), the slow ones too.
	$(BIN)/pytest tests/unit

test-integration: up ## Run the integration tests against the real stack, files in parallel.
	$(BIN)/pytest $(PARALLEL) tests/integration

lint: setup ## ruff (lint and format check), mypy and the layer contracts, exactly as pre-commit runs them.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: setup ## Format the code with ruff.
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

docs: setup ## Rewrite docs/reference/settings.md from the settings classes.
	$(BIN)/python infra/settings_reference.py --write

typecheck: setup ## mypy only.
	$(BIN)/mypy

demo: up models ## Set up, start the stack, controller, 2 workers and a gateway; traffic, shadow, canary, rollback.
	$(BIN)/tidegate schemas register
	$(BIN)/tidegate demo $(DEMO_ARGS)

# vegeta, the open-loop HTTP generator of the versus and overload parts (tests/bench/vegeta.py).
$(STAMP)/bench-tools: infra/bench-tools.sh
	@mkdir -p $(STAMP)
	bash infra/bench-tools.sh
	@touch $@

bench: up models $(STAMP)/bench-tools ## Run the benchmarks and print the ratios (results go in docs/benchmarks.md).
	$(BIN)/tidegate schemas register
	$(BIN)/python -m tests.bench

clean: down ## Stop the stack and delete var/ (data, logs, jars).
	rm -rf $(VAR)
