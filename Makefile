# bertjax: the two Quick start commands.
#   make demo   -- create .venv, install bertjax, run the main job on the bundled corpus
#   make test   -- create .venv, install bertjax with its test extras, run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo
# torch is only needed by the parity/interop tests and the benchmark; pin the CPU build.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?= -n 2

.PHONY: demo test install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test,interop]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(BIN)/bertjax demo --workdir $(DEMO_DIR)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) runs
