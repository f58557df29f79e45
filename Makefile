# Set-up and entry points. `make demo` and `make test` work on a fresh machine: they create
# .venv, install torch/torchvision (pinned), build torch-scatter against that torch, and install
# fxlrp with its test extras. optimum-quanto's CPU kernels (its 4-bit unpacking, which it compiles
# into its own package folder on first use: one to five minutes on 2 cores) are built here with
# the other compiled dependencies, not inside the first test that quantizes to 4 bits.
# zennit-crp (tests/models/test_crp_parity.py) is installed without its dependencies: it asks for
# zennit <= 0.4.6, which the test extra's zennit 0.5.1 rules out (pip cannot resolve both), and
# runs on 0.5.1.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all test-portable test-fresh-clone test-lxt lint bench setup chromium clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet setuptools wheel
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet --no-build-isolation torch-scatter
	$(BIN)/pip install --quiet -e ".[test,pictures,pyg]"
	$(BIN)/pip install --quiet --no-deps zennit-crp==0.6.0
	$(BIN)/pip install --quiet --no-deps accelerate==1.15.0 torchao==0.18.0 optimum-quanto==0.2.7 bitsandbytes==0.50.2
	$(BIN)/python -c "from optimum.quanto.library.extensions import get_extension; get_extension('quanto_cpp').lib"
	touch $(STAMP)

setup: $(STAMP)

# Chromium from the system's packages, for the test that runs the generation page's script in a
# browser (tests/app/test_generation_pictures.py, driven by playwright, which the test extra
# installs; no browser is downloaded). Without it that test is skipped.
chromium:
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq chromium; }

demo: $(STAMP)
	$(BIN)/fxlrp demo --out out/demo

# The fast lane: every unit and integration test, without the sweeps over model zoos and
# families, long searches, compiles and large models (marked `slow`), in under five minutes on
# 2 cores. It runs in TEST_JOBS processes (pytest-xdist), each on one thread: the tests are small,
# and two processes of one thread keep two cores busier than one process of two.
TEST_JOBS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow" -n $(TEST_JOBS)

# Everything: the fast lane, then the tests marked `slow`. CI runs this.
test-all: test
	$(BIN)/python -m pytest -q -m slow

# Tests whose bounds depend on rounding, run as on other CPUs: one thread with oneDNN and ATen
# limited to older instruction sets (AVX2, no vectorisation), then four threads. A test that
# holds only on this machine's kernels fails here.
PORTABLE_TESTS := tests/unit/test_properties.py tests/unit/test_robustness.py tests/unit/test_outputs_equal.py \
	tests/models/test_models_lrp0.py tests/unit/test_rules.py tests/unit/test_replay.py tests/unit/test_gradient_form.py \
	tests/unit/test_operations.py tests/unit/test_attention_rules.py
test-portable: $(STAMP)
	OMP_NUM_THREADS=1 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=default \
		$(BIN)/python -m pytest -q -m "not slow" $(PORTABLE_TESTS)
	OMP_NUM_THREADS=4 $(BIN)/python -m pytest -q -m "not slow" $(PORTABLE_TESTS)

# The fast lane from a fresh clone of HEAD in a temporary folder whose path holds "tmp" and a
# space, on one thread with oneDNN and ATen held to AVX2 and no vectorisation (.ci/fresh-clone-test):
# a test that holds only in this folder or on this machine's kernels fails here.
test-fresh-clone: $(STAMP)
	.ci/fresh-clone-test

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
