# gpuconf: every target sets up what it needs (venv, packages, upstream binaries) on a fresh machine.
# The README names two of them: `make conformance` and `make test`.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
STAMP  := $(VENV)/.installed

.PHONY: setup binaries conformance test unit integration lint bench sandbox-up sandbox-down clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP) binaries

# Builds etcd, kube-apiserver, kube-controller-manager and kube-scheduler once per machine
# (cached per user, outside the checkout); later calls only print the cached folder.
binaries: $(STAMP)
	$(BIN)/gpuconf sandbox build

# One command: set everything up, bring the sandbox up, run the conformance suite, write the report.
conformance: setup
	$(BIN)/gpuconf run --output-dir gpuconf-results

# One command: set everything up and run the tests (unit, then integration on the sandbox).
# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
test: setup
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: setup
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# The same four checks as `tox -e lint` and CI: style, formatting, types (mypy, configured in
# pyproject.toml), and the import layers (import-linter: the five parts import downward only).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Speed and memory figures (printed as JSON lines); not pass/fail.
bench: setup
	@for b in tests/bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done
	@echo "== tests/bench/bench_sandbox.py --full"; $(BIN)/python tests/bench/bench_sandbox.py --full --runs 2

sandbox-up: setup
	$(BIN)/gpuconf sandbox up

sandbox-down: $(STAMP)
	$(BIN)/gpuconf sandbox down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis gpuconf-results *.egg-info
