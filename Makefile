# tfdist — `make help` lists the targets. Everything runs inside .venv, created on first use.
VENV ?= .venv
PYTHON ?= python3
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)

.DEFAULT_GOAL := help
.PHONY: help install repro test test-fast lint ui clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(VENV)/.installed ## Create .venv and install tfdist with its dev extras

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

repro: install ## Run the pipeline: dvc repro (only stages whose inputs changed)
	dvc repro

test: install ## Run the whole test suite, slow end-to-end tests included (as CI does)
	python -m pytest

test-fast: install ## Run the tests but the slow end-to-end ones
	python -m pytest -m "not slow"

lint: install ## Check style with ruff
	ruff check src stages tests benchmarks

ui: install ## Open the MLflow UI on the project's store at http://127.0.0.1:5000
	@echo "MLflow UI: http://127.0.0.1:5000 (Ctrl-C to stop)"
	mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db --host 127.0.0.1 --port 5000

clean: ## Remove pipeline outputs and the MLflow store (keeps .venv)
	rm -rf data/prepared models reports/train reports/eval reports/compare reports/data.json mlruns dvc.lock
