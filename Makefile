# hooktrace developer commands. `make help` lists them.
# A fresh machine needs only python3 (3.10+), a C++17 compiler and the package index.

PYTHON ?= python3
VENV ?= .venv
# torch is pinned here and only here; override with e.g. `make test TORCH=torch==2.6.0`.
TORCH ?= torch==2.13.0
TEST_DEPS ?= pytest transformers==5.23.0
BUILD_DEPS ?= numpy ninja pybind11 setuptools wheel tqdm

PY := $(VENV)/bin/python
# One stamp per torch spec, so `make test TORCH=...` reinstalls torch and rebuilds
# in an existing .venv; `make clean` removes it so the next target rebuilds.
STAMP := $(VENV)/.hooktrace-installed-$(shell printf '%s' '$(TORCH)' | tr -c 'A-Za-z0-9.' '_')

.PHONY: help venv build demo test test-unit test-integration bench lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): setup.py pyproject.toml $(wildcard csrc/*.cpp csrc/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(BUILD_DEPS) $(TEST_DEPS)
	# --no-build-isolation: compile against the torch installed above, not a fresh
	# (different, multi-GB) torch that an isolated build environment would download.
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) -m pip install -q --no-build-isolation -e .
	rm -f $(VENV)/.hooktrace-installed*
	touch $(STAMP)

venv: $(STAMP)  ## create .venv, install torch + deps, build hooktrace

build: venv  ## rebuild the native core in place after editing csrc/
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py -q build_ext --inplace

demo: venv  ## train the built-in TinyGPT a few steps under hooktrace; writes out/demo/
	$(VENV)/bin/hooktrace demo --out out/demo

test: venv  ## run the whole test suite (unit + integration)
	$(PY) -m pytest -q tests

test-unit: venv  ## pure-Python reader/exporter/CLI tests
	$(PY) -m pytest -q tests/unit

test-integration: venv  ## compiled core with real modules
	$(PY) -m pytest -q tests/integration

bench: venv  ## overhead and export benchmarks (prints tables; see benchmarks/RESULTS.md)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/export.py

lint: venv  ## ruff (pyflakes + pycodestyle rules) and mypy on the package
	$(PY) -m pip install -q ruff mypy
	$(PY) -m ruff check hooktrace benchmarks tests --select E,F,W --ignore E501
	$(PY) -m mypy hooktrace

clean:  ## remove build outputs (keeps .venv)
	rm -rf build *.egg-info hooktrace/_C*.so out $(VENV)/.hooktrace-installed*
