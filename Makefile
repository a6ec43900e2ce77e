# Every target sets up its own virtual environment (.venv) first: a fresh clone needs only
# Python 3.11+, pip, git, make and, for the PostgreSQL tests, the PostgreSQL server binaries.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BASE   := $(VENV)/.installed-base

.PHONY: install demo test test-fast typecheck lint chaos proto proto-check proto-lint proto-breaking proto-baseline node-deps reference reference-check docs docs-serve bench-spread bench-burst clean tools screenshots

# pip -qq: errors only, so a first `make demo` shows the demo, not the installer's notes (a
# machine's own pip configuration may add warnings about its package locations). setuptools'
# note on editable installs (fastlane.bench is mapped from bench/) is information, not a fault.
PIP := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip -qq
# Material for MkDocs prints a notice about MkDocs 2 at every build; the build itself is strict.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
# buf lints proto/ and checks it for breaking changes; npm installs it (the package ships the
# binary) from tools/package-lock.json, so every machine runs the same version.
BUF := tools/node_modules/.bin/buf
NPM_CI := npm ci --no-audit --no-fund --loglevel=error

# The package alone (what the demo needs), then the test and benchmark extras on top.
$(BASE): pyproject.toml
	@echo "setting up $(VENV): fastlane and its dependencies (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e .
	touch $(BASE)

$(STAMP): $(BASE)
	@echo "adding the test and benchmark tools to $(VENV) (first run only)"
	$(PIP) install -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

## demo: a daemon on SQLite, a demo worker and demo jobs; prints each run with its trigger lag
## (DURATION=SECONDS: how long it runs, default 300; Ctrl-C stops it earlier)
DURATION ?= 300
demo: $(BASE)
	$(BIN)/fastlane demo --duration $(DURATION)

## test: lint and type check, then the whole suite, SQLite and PostgreSQL (a throwaway cluster unless FASTLANE_TEST_PG_DSN is set)
test: $(STAMP) proto-check proto-lint proto-breaking reference-check docs lint typecheck tools node-deps
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
test-fast: $(STAMP) tools $(BUF) node-deps
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

$(BUF): tools/package-lock.json
	$(NPM_CI) --prefix tools
	touch $(BUF)

## proto-lint: buf lint (STANDARD rules) over proto/
proto-lint: $(BUF)
	$(BUF) lint

## proto-breaking: buf breaking against the v1 baseline and against the previous commit's protos
proto-breaking: $(BUF)
	bash scripts/proto_breaking.sh $(BUF)

## proto-baseline: record proto/ as the compatibility baseline (only when a version is declared)
proto-baseline: $(BUF)
	$(BUF) build --exclude-source-info -o proto/baseline/v1.binpb

## node-deps: the Node example's packages (examples/node), for its end-to-end test
node-deps: examples/node/node_modules/.installed

examples/node/node_modules/.installed: examples/node/package-lock.json
	$(NPM_CI) --prefix examples/node
	touch $@

## reference: regenerate docs/reference/ (CLI, settings, environment, metrics, gRPC API) from the code
reference: $(STAMP)
	$(BIN)/python scripts/gen_reference.py

reference-check: $(STAMP)
	$(BIN)/python scripts/gen_reference.py --check

## docs: build the documentation site into site/, strictly (a broken link or anchor fails it)
docs: $(STAMP)
	$(MKDOCS) build --strict --quiet

## docs-serve: the documentation site on http://127.0.0.1:8000 with live reload
docs-serve: $(STAMP)
	$(MKDOCS) serve --dev-addr 127.0.0.1:8000

## bench-spread, bench-burst: the headline benchmarks at full size (see docs/benchmarks.md)
bench-spread: $(STAMP)
	$(BIN)/fastlane bench spread --out bench/results/spread

bench-burst: $(STAMP)
	$(BIN)/fastlane bench burst --out bench/results/burst

clean:
	rm -rf $(VENV) build site *.egg-info
