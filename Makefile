# Set-up and entry points. `make demo` and `make test` work on a fresh machine: they create
# .venv, install torch/torchvision (pinned), build torch-scatter against that torch, and install
# fxlrp with its test extras.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-lxt lint bench setup clean

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

# A second environment for the parity tests against LXT (tests_lxt/): LXT 2.1 patches
# transformers' model code and needs transformers 4.x (the main environment has 5.x). Only what
# `import lxt.efficient` needs: torchvision (its ViT patches), zennit without its dependencies
# (LXT warns without it); not bitsandbytes, open_clip_torch, accelerate, matplotlib, tabulate.
LXT_VENV := .venv-lxt
LXT_BIN := $(LXT_VENV)/bin
LXT_STAMP := $(LXT_VENV)/.installed

$(LXT_STAMP): pyproject.toml
	test -x $(LXT_BIN)/python || $(PYTHON) -m venv $(LXT_VENV)
	$(LXT_BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(LXT_BIN)/pip install --quiet "transformers==4.54.1" pytest
	$(LXT_BIN)/pip install --quiet --no-deps lxt==2.1 zennit==0.5.1
	$(LXT_BIN)/pip install --quiet -e .
	touch $(LXT_STAMP)

test-lxt: $(LXT_STAMP)
	$(LXT_BIN)/python -m pytest -q tests_lxt

lint: $(STAMP)
	$(BIN)/ruff check fxlrp tests tests_lxt examples benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(LXT_VENV) out
