# Set-up and entry points. `make demo` and `make test` work on a fresh machine: they create
# .venv, install torch/torchvision (pinned), build torch-scatter against that torch, and install
# fxlrp with its test extras.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench setup clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet setuptools wheel
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet --no-build-isolation torch-scatter
	$(BIN)/pip install --quiet -e ".[test,pictures,pyg]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/fxlrp demo --out out/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check fxlrp tests examples benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) out
