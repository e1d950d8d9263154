# bertjax: the two Quick start commands.
#   make demo   -- create .venv, install bertjax, run the main job on the bundled corpus
#   make test   -- create .venv, install bertjax with its test extras (and libtpu, for the TPU
#                  compiler tests of `bertjax compile`), check the formatting and the import
#                  contracts, run the test suite
#   make test-fast -- the unit tests only (no subprocess, multi-host or end-to-end test)
#   make test-gpu  -- the GPU compiler tests of `bertjax compile --accelerator h100-8`, in a venv
#                     with the `gpu` extra
#   make test-beam -- the tests of `bertjax prepare --runner beam`, in a venv with the `beam` extra
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo
# torch is only needed by the parity/interop tests and the benchmark; pin the CPU build.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?= -n 2

.PHONY: demo test test-fast test-gpu test-beam lint format bench install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test,interop,tpu]"  # tpu: the TPU compiler tests
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(BIN)/bertjax demo --workdir $(DEMO_DIR)

test: $(VENV)/.installed-test lint
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests

# The unit tier: no subprocess, multi-host or end-to-end test (marked process, multihost, slow).
test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m "not slow and not multihost and not process" tests

FORMATTED := bertjax experiments launch tests data/make_corpus.py data/make_movie_snippets.py data/make_chinese.py data/make_austen_retrieval.py
# The import contracts (.importlinter) are read from this tree (PYTHONPATH), not from
# whichever checkout the venv's editable install points at.
lint: $(VENV)/.installed-test
	$(BIN)/pyink --check $(FORMATTED)
	PYTHONPATH=$(CURDIR) $(BIN)/lint-imports --no-cache .importlinter

format: $(VENV)/.installed-test
	$(BIN)/pyink $(FORMATTED)

# The GPU compiler tests (tests/test_compile_gpu.py: `bertjax compile --accelerator h100-8`)
# need the `gpu` extra (jax's CUDA plugin and cuDNN, about 1.6 GB to download), in a venv of its
# own: installed in $(VENV), the plugin would load into every JAX process the suite starts.
GPU_VENV ?= .venv-gpu
$(GPU_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GPU_VENV)/bin/python -m pip install --quiet "$(TORCH)"  # the test extra's sentence-transformers needs torch: the CPU build
	$(GPU_VENV)/bin/python -m pip install --quiet -e ".[test,gpu]"
	touch $@

test-gpu: $(GPU_VENV)/.installed
	$(GPU_VENV)/bin/python -m pytest $(PYTEST_ARGS) tests/test_compile_gpu.py

# The tests of `bertjax prepare --runner beam` (tests/test_beam_prepare.py) need the `beam` extra,
# in a venv of its own: apache-beam pins protobuf and pyarrow below the versions in $(VENV)
# (docs/testing.md), and `make test` skips them, saying so.
BEAM_VENV ?= .venv-beam
$(BEAM_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(BEAM_VENV)
	$(BEAM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BEAM_VENV)/bin/python -m pip install --quiet "$(TORCH)"  # the test extra's sentence-transformers needs torch: the CPU build
	$(BEAM_VENV)/bin/python -m pip install --quiet -e ".[test,beam]"
	touch $@

test-beam: $(BEAM_VENV)/.installed
	$(BEAM_VENV)/bin/python -m pytest $(PYTEST_ARGS) tests/test_beam_prepare.py

# The Flax peer of `bertjax bench --compare hf-flax` needs transformers 4.x (5.x has no Flax
# models), in a venv of its own.
HF4_VENV ?= .venv-hf4
$(HF4_VENV)/bin/python:
	$(PYTHON) -m venv $(HF4_VENV)
	$(HF4_VENV)/bin/python -m pip install --quiet 'transformers>=4.57,<5' flax==0.12.8 jax==0.10.2 optax==0.2.8

bench: $(VENV)/.installed-test $(HF4_VENV)/bin/python
	$(BIN)/bertjax bench --preset mini --batch-size 32 --seq-len 128 --steps 10 --compare hf-torch,hf-flax,keras-hub
	$(BIN)/bertjax bench --preset base --batch-size 16 --seq-len 128 --steps 8 --compare hf-torch,hf-flax

clean:
	rm -rf $(VENV) $(HF4_VENV) $(GPU_VENV) $(BEAM_VENV) runs
