# Every target sets up its own virtual environment (.venv) first: a fresh clone needs only
# Python 3.11+, pip, git, make and, for the PostgreSQL tests, the PostgreSQL server binaries.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BASE   := $(VENV)/.installed-base

.PHONY: install demo test test-fast typecheck lint chaos proto proto-check bench-spread bench-burst clean tools screenshots

# The package alone (what the demo needs), then the test and benchmark extras on top.
$(BASE): pyproject.toml
	@echo "setting up $(VENV): fastlane and its dependencies (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(BASE)

$(STAMP): $(BASE)
	@echo "adding the test and benchmark tools to $(VENV) (first run only)"
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

## demo: a daemon on SQLite, a demo worker and demo jobs; prints each run with its trigger lag
demo: $(BASE)
	$(BIN)/fastlane demo

## test: lint and type check, then the whole suite, SQLite and PostgreSQL (a throwaway cluster unless FASTLANE_TEST_PG_DSN is set)
test: $(STAMP) proto-check lint typecheck tools
	$(BIN)/python -m pytest

## tools: what the suite needs beyond Python packages (promtool, for the alert rules), fetched into .venv if missing
tools: $(BASE)
	bash scripts/ensure_tools.sh $(BIN)

## typecheck: mypy over the package, as configured in pyproject.toml
typecheck: $(STAMP)
	$(BIN)/python -m mypy

## lint: ruff over the package, the benchmarks and the tests
lint: $(STAMP)
	$(BIN)/ruff check fastlane bench tests scripts

## test-fast: everything but the end-to-end process tests
test-fast: $(STAMP) tools
	$(BIN)/python -m pytest -m "not e2e and not chaos"

## chaos: only the long failure-injection tests
chaos: $(STAMP)
	$(BIN)/python -m pytest -m chaos

## screenshots: the README's pictures of the web console, taken by its browser test into docs/console
screenshots: $(STAMP) tools
	FASTLANE_SCREENSHOTS=docs/console $(BIN)/python -m pytest tests/browser -q

## proto: regenerate fastlane/_proto from proto/
proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

proto-check: $(STAMP)
	$(BIN)/python scripts/gen_proto.py --check

## bench-spread, bench-burst: the headline benchmarks at full size (see bench/README.md)
bench-spread: $(STAMP)
	$(BIN)/fastlane bench spread --out bench/results/spread

bench-burst: $(STAMP)
	$(BIN)/fastlane bench burst --out bench/results/burst

clean:
	rm -rf $(VENV) build *.egg-info
