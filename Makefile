# tfdist — `make help` lists the targets. Everything runs inside .venv, created on first use.
VENV ?= .venv
PYTHON ?= python3
PORT ?= 5000
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)

.DEFAULT_GOAL := help
.PHONY: help install allocator browser-deps postgres slurm repro test test-fast lint lock ui server s3 push pull experiments plots clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(VENV)/.installed vega/offline.html allocator ## Create .venv and install tfdist with its dev extras, the offline plots template and jemalloc

# jemalloc for the training processes (runtime.allocator: auto; docs/performance/parallelism.md 8b): glibc's malloc
# faults TensorFlow's exchange buffers in again every step. Optional: without root or sudo, or offline, training
# runs with glibc's malloc, only slower.
allocator: ## Install Debian's libjemalloc2 for the training processes, if it is missing (root or sudo; optional)
	@/sbin/ldconfig -p | grep -q libjemalloc.so.2 || { \
	  echo "installing Debian's libjemalloc2 for the training processes (runtime.allocator)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo -n ); \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libjemalloc2 >/dev/null; } \
	  || echo "warning: libjemalloc2 not installed; training runs with glibc's malloc (runtime.allocator: auto)"; }

# Every package at the version uv.lock pins (hashes checked): the environment the tests ran on.
# Extras: dev (tests, lint), postgres (a PostgreSQL tracking store), auth (MLflow's basic-auth server), ray (Ray launcher), s3 (DVC remote and MLflow artifacts on S3).
EXTRAS ?= dev postgres auth ray s3 tensorboard
UV_VERSION := 0.13.9
UV := $(BIN)/uv
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))

# --compile-bytecode: uv (unlike pip) installs no .pyc, and where PYTHONDONTWRITEBYTECODE is set (as on the
# project's machines) none is ever written, so every process compiled TensorFlow's and MLflow's sources again:
# import tensorflow 11 s without, 4-5 s with (docs/performance.md, "Start-up").
$(VENV)/.installed: pyproject.toml uv.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	$(UV) sync --frozen $(EXTRAS:%=--extra %) --inexact --compile-bytecode
	touch $@

# dvc plots show draws with Vega inlined in its page (no CDN): from vl-convert-python, pinned in uv.lock (no Node.js).
vega/offline.html: $(VENV)/.installed vega/build_template.py
	$(BIN)/python vega/build_template.py

repro: install ## Run the pipeline: dvc repro (only stages whose inputs changed)
	dvc repro

# The browser tests drive Debian's Chromium (Playwright with the system executable: nothing is downloaded).
CHROMIUM ?= /usr/bin/chromium

browser-deps: ## Install Debian's chromium for the browser tests, if it is missing (needs root or sudo)
	@test -x $(CHROMIUM) || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }
	@test -x $(CHROMIUM) || { echo "error: no Chromium at $(CHROMIUM); install Debian's chromium package"; exit 1; }

# A PostgreSQL store for MLflow (the team store): Debian's cluster, a role for you, and a database.
PG_DATABASE ?= tfdist
PG_USER ?= $(shell id -un)

postgres: ## Start Debian's PostgreSQL (installed if missing), with a role for you and a database $(PG_DATABASE) (root or sudo)
	@SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	AS_PG=$$( [ "$$(id -u)" = 0 ] && echo "runuser -u postgres --" || echo "sudo -u postgres" ); \
	command -v pg_ctlcluster >/dev/null || { \
	  echo "installing Debian's postgresql for the team-store tests"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; }; \
	VERSION=$$(pg_lsclusters --no-header | awk '$$2 == "main" {print $$1}' | sort -n | tail -1); \
	test -n "$$VERSION" || { echo "error: no PostgreSQL cluster named main (pg_createcluster <version> main)"; exit 1; }; \
	pg_lsclusters --no-header $$VERSION main | grep -q online || \
	  $$SUDO pg_ctlcluster --skip-systemctl-redirect $$VERSION main start; \
	$$AS_PG psql -qtAc "SELECT 1 FROM pg_roles WHERE rolname = '$(PG_USER)'" | grep -q 1 || \
	  $$AS_PG createuser --createdb $(PG_USER); \
	psql -d postgres -qtAc "SELECT 1 FROM pg_database WHERE datname = '$(PG_DATABASE)'" | grep -q 1 || \
	  createdb $(PG_DATABASE); \
	echo "PostgreSQL $$VERSION is up: mlflow.tracking_uri postgresql://$(PG_USER)@/$(PG_DATABASE)?host=/var/run/postgresql"

# Slurm for the engine tests: they start their own munged, and a slurmctld and slurmds on test hosts.
slurm: ## Install Debian's slurm-wlm and munge for the Slurm tests, if missing (root or sudo)
	@command -v slurmd >/dev/null && command -v munged >/dev/null || { \
	  echo "installing Debian's slurm-wlm and munge for the Slurm tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null; }
	@command -v slurmd >/dev/null || { echo "error: slurmd not found; install Debian's slurm-wlm"; exit 1; }

# Two xdist workers, a test file whole on one (tests/conftest.py's scheduler hook), the longest files first:
# the whole suite in 16.9 min against about 40 serially (docs/performance.md, "CI"). Bounded waits leave a loaded
# machine room (about 3x what one test alone measured): the other half of the suite runs meanwhile.
ON_BOTH_CORES := -n 2 --dist loadscope --no-loadscope-reorder

test: install browser-deps postgres slurm ## Run the whole test suite, slow end-to-end, browser, PostgreSQL and engine tests included (as CI does)
	python -m pytest $(ON_BOTH_CORES) --durations=25

test-fast: install ## Run the tests but the slow end-to-end ones
	python -m pytest $(ON_BOTH_CORES) -m "not slow"

# mypy, not pyright: it runs from the Python index alone (pyright needs Node.js and downloads its own), and reads
# pyproject.toml, where TensorFlow's, tf_keras's and MLflow's untyped parts are declared Any in one place.
lint: install ## Check style with ruff, types with mypy (src, stages), and that uv.lock matches pyproject.toml
	ruff check src stages tests benchmarks vega
	mypy
	$(UV) lock --check

lock: ## Update uv.lock to the newest versions pyproject.toml allows, then reinstall (commit uv.lock)
	test -x $(UV) || { $(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install --quiet uv==$(UV_VERSION); }
	$(UV) lock --upgrade
	$(UV) sync --frozen $(EXTRAS:%=--extra %) --inexact --compile-bytecode

ui: install ## Open the MLflow UI on params.yaml's store at http://127.0.0.1:$(PORT) (make ui PORT=5001)
	tfdist ui --port $(PORT)

server: install ## A team's MLflow server on PostgreSQL (make postgres first), artifacts proxied (ARGS="--artifacts-destination s3://tfdist/mlflow")
	tfdist server --port $(PORT) $(ARGS)

S3_PORT ?= 8333
s3: install ## A local S3 store (SeaweedFS) on 127.0.0.1:$(S3_PORT) for the DVC remote and MLflow artifacts (needs AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)
	tfdist s3 --port $(S3_PORT)

push: install ## dvc push to the team's S3 remote, checked first (one line if the endpoint, keys or bucket are wrong)
	tfdist push $(ARGS)

pull: install ## dvc pull from the team's S3 remote: a fresh clone's dvc repro is then a no-op
	tfdist pull $(ARGS)

experiments: install ## List experiments: the params that decide a result and the headline metrics (dvc exp show, trimmed)
	tfdist experiments

plots: install ## Render every run's curves, confusion matrices and compare figures (dvc plots show; ARGS="diff main")
	tfdist plots $(ARGS)

clean: ## Remove pipeline outputs and the MLflow store (keeps .venv)
	rm -rf data/prepared models repeats reports/train reports/eval reports/compare reports/data.json mlruns dvc.lock
