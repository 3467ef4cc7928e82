# Two commands do all set-up on a fresh machine:
#   make demo   -- create .venv, install pbsdk, compile and run the demo on the host CPU
#   make test   -- create .venv, install pbsdk with its dev extras, run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pbsdk-installed

.PHONY: demo test test-all lint typecheck docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/pbsdk demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

# Everything, including the long sweeps behind the `slow` marker.
test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 --runslow tests

lint: $(STAMP)
	$(VENV)/bin/ruff check pbsdk tests

typecheck: $(STAMP)
	$(VENV)/bin/mypy pbsdk

docs: $(STAMP)
	$(PY) scripts/gen_spec_docs.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis

# The deploy runtime as its own pip distribution (docs/deploy.md): dist/pbsdk_runtime-<version>-py3-none-any.whl.
.PHONY: runtime-wheel
runtime-wheel:
	$(PYTHON) scripts/runtime_wheel.py -o dist

# The deploy runtime's C API (docs/deploy.md): libpbsdk_runtime.so and its header, with the system C compiler.
RUNTIME_BUILD ?= build/runtime
CC ?= cc
.PHONY: runtime-c
runtime-c: $(RUNTIME_BUILD)/libpbsdk_runtime.so

$(RUNTIME_BUILD)/libpbsdk_runtime.so: pbsdk/runtime/c/pbsdk_runtime.c pbsdk/runtime/c/pbsdk_runtime.h
	mkdir -p $(RUNTIME_BUILD)
	$(CC) -O2 -Wall -Wextra -fPIC -shared -o $@ pbsdk/runtime/c/pbsdk_runtime.c -ldl -lpthread
	cp pbsdk/runtime/c/pbsdk_runtime.h $(RUNTIME_BUILD)/
