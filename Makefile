# gpuconf: every target sets up what it needs (venv, packages, upstream binaries) on a fresh machine.
# The README names two of them: `make conformance` and `make test`.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
STAMP  := $(VENV)/.installed

# Every check run, simulated container and sandbox component is a fresh Python process: without
# bytecode caches each compiles the modules it imports again (a second or two of CPU apiece, on every
# one of the thousands a `make test` starts). An environment that forbids writing them loses that.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup system-packages binaries runtime conformance test test-loaded unit integration lint bench bench-load mutation gpu-check sandbox-up sandbox-down clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP) system-packages binaries runtime

# What the tests need from the operating system (runc and a static busybox, for the NRI test): installed
# with apt-get where this is root on a Debian-like system, otherwise `make setup` stops here, before any
# test, naming the packages and the command (fixtures/sandbox/system.py). SYSTEM_PACKAGES=skip goes on
# without them.
SYSTEM_PACKAGES ?=
system-packages: $(STAMP)
	SYSTEM_PACKAGES=$(SYSTEM_PACKAGES) $(BIN)/python -m fixtures.sandbox.system

# Builds etcd, kube-apiserver, kube-controller-manager and kube-scheduler once per machine
# (cached per user, outside the checkout); later calls only print the cached folder.
binaries: $(STAMP)
	$(BIN)/gpuconf sandbox build

# The real node runtime of the NRI test (tests/integration/test_nri_containerd.py): containerd 2.x,
# ctr, crictl and gpuconf's NRI plugin, and the kubelet of the real-node test
# (tests/integration/test_real_kubelet.py), built once per machine and cached beside the binaries above
# (runc and busybox come from the system's packages: system-packages). A failure here does not
# stop the other tests: the NRI and real-node tests then fail themselves, saying what is missing.
runtime: binaries system-packages
	-$(BIN)/gpuconf sandbox build --runtime --kubelet

# One command: set everything up, bring the sandbox up, run the conformance suite, write the report.
# (Not the NRI test's runtime nor the system's packages: the suite needs neither.)
conformance: $(STAMP) binaries
	$(BIN)/gpuconf run --output-dir gpuconf-results

# One command: set everything up and run the tests (tests/runner.py): the unit half on TEST_WORKERS
# pytest-xdist workers, then the integration half (on the sandbox) on INTEGRATION_WORKERS. The unit
# tests keep a core busy each; the integration tests mostly wait (on Pods, sandboxes, a process's
# start): on 2 cores, three workers still used only 1.4 of them. TEST_BESIDE=1 runs the unit half
# beside the integration half at nice 10, in that idle CPU (on 2 cores 516-551 s against 645 s), but
# it starves the unit tests that measure real time, which then fail now and then: for a machine with
# cores to spare. Modules go whole to a worker (--dist loadfile: they share their module's sandbox),
# the heaviest first (tests/integration/conftest.py). TEST_WORKERS=0 runs both halves serially.
# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
# The integration half ends with its 25 slowest tests (--durations), so every CI log shows where the
# time went.
TEST_WORKERS ?= 2
INTEGRATION_WORKERS ?= $(if $(filter 0,$(TEST_WORKERS)),0,3)
TEST_BESIDE ?=
xdist = $(if $(filter 0,$(1)),,-n $(1) --dist loadfile)
XDIST = $(call xdist,$(TEST_WORKERS))
XDIST_INTEGRATION = $(call xdist,$(INTEGRATION_WORKERS))
test: setup
	$(BIN)/python tests/runner.py $(if $(filter 0,$(TEST_WORKERS)),--serial) $(if $(TEST_BESIDE),--beside) \
	  --unit-workers $(TEST_WORKERS) --integration-workers $(INTEGRATION_WORKERS) \
	  --integration-arg=--durations=25 -- $(PYTEST_ARGS)

# make test RUNS times in a row beside a CPU hog of twice the cores (tests/repeat.py): every failure of
# every run named, with its first line; logs and summary.json in .repeat/. A test that fails once
# under load is a defect to find, never to retry.
RUNS ?= 5
test-loaded: setup
	$(BIN)/python tests/repeat.py --runs $(RUNS)

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(XDIST) $(PYTEST_ARGS)

integration: setup
	$(BIN)/python -m pytest tests/integration $(XDIST_INTEGRATION) $(PYTEST_ARGS)

# The same four checks as `tox -e lint` and CI: style, formatting, types (mypy, configured in
# pyproject.toml), and the import layers (import-linter: the five parts import downward only).
# The suite against every seeded fault of the reference scheduler and agent; records the score that
# every report shows (conformance/mutation-score.json). Fails when a fault escapes. (`make test` runs
# the same mutation run as tests/integration/test_mutation.py.) On six GPU nodes, so six fault runs go
# at once (on 2 cores, ideal fidelity: 4 nodes 778 s, 6 nodes 652 s, 8 nodes 671 s: the CPU is then
# the limit).
mutation: setup
	$(BIN)/gpuconf mutate --fidelity ideal --fidelity h200 --control-workers 2 --nodes 6 --report-dir gpuconf-mutation --write-score

# On a machine with one GPU (prepared for an H200, driver 580 / CUDA 13.0): the CuPy workload's
# alloc-until-oom at the real granularity, touch, calibrated kernels, `gpuconf probe --backend mps`,
# and the suite's real-GPU judgements on what they measured; JSON and text summary under
# $(GPU_CHECK_DIR) (at most about 8 minutes). Exit 2 where there is no usable GPU.
GPU_CHECK_DIR ?= gpu-check-results/$(shell date -u +%Y%m%dT%H%M%SZ)
gpu-check: $(STAMP)
	@$(BIN)/python -c "import cupy, pynvml" 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[gpu]'
	timeout 480 $(BIN)/python tests/gpu/gpu_check.py --out $(GPU_CHECK_DIR)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Speed and memory figures, measurements not pass/fail (about 15 minutes on 2 cores). Every script in
# tests/bench/ prints JSON into $(BENCH_DIR)/<name>.json, BENCH_RUNS times (the sandbox and suite
# benchmarks repeat inside: --runs); tests/bench/report.py writes their medians, with the command
# that reproduces each, to docs/benchmarks.json and docs/benchmarks.md.
BENCH_RUNS ?= 3
BENCH_DIR  ?= .bench
bench: setup
	@rm -rf $(BENCH_DIR) && mkdir -p $(BENCH_DIR)
	@for i in $$(seq $(BENCH_RUNS)); do for b in tests/bench/bench_*.py; do \
	  n=$$(basename $$b .py); n=$${n#bench_}; case $$n in sandbox|suite|load) continue;; esac; \
	  echo "== $$b ($$i/$(BENCH_RUNS))"; $(BIN)/python $$b >> $(BENCH_DIR)/$$n.json || exit 1; \
	done; done
	@echo "== tests/bench/bench_sandbox.py"
	@$(BIN)/python tests/bench/bench_sandbox.py --runs $(BENCH_RUNS) > $(BENCH_DIR)/sandbox.json
	@echo "== tests/bench/bench_sandbox.py --full"
	@$(BIN)/python tests/bench/bench_sandbox.py --full --runs $(BENCH_RUNS) > $(BENCH_DIR)/sandbox-full.json
	@echo "== tests/bench/bench_suite.py"
	@$(BIN)/python tests/bench/bench_suite.py --runs $(BENCH_RUNS) > $(BENCH_DIR)/suite.json
	@echo "== tests/bench/bench_suite.py --fidelity h200"
	@$(BIN)/python tests/bench/bench_suite.py --runs $(BENCH_RUNS) --fidelity h200 > $(BENCH_DIR)/suite-h200.json
	$(BIN)/python tests/bench/report.py $(BENCH_DIR)

# Verdicts idle and beside a CPU hog of twice the cores, side by side (tests/bench/bench_load.py): the
# whole suite and the quick mutation run, both fidelities; the differences first (the goal is none).
# Hours on 2 cores: BENCH_LOAD_ARGS narrows it (--fidelity ideal, --no-mutation, --check ID).
BENCH_LOAD_ARGS ?=
bench-load: setup
	@mkdir -p $(BENCH_DIR)
	$(BIN)/python tests/bench/bench_load.py $(BENCH_LOAD_ARGS) > $(BENCH_DIR)/load.json
	@$(BIN)/python -c "import json,sys; d=json.load(open('$(BENCH_DIR)/load.json')); print(json.dumps({f: {k: v for k, v in e.items() if k.endswith('Differences')} for f, e in d['fidelities'].items()}, indent=2)); print('same verdicts idle and loaded:', d['sameVerdicts'])"

sandbox-up: setup
	$(BIN)/gpuconf sandbox up

sandbox-down: $(STAMP)
	$(BIN)/gpuconf sandbox down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis gpuconf-results *.egg-info
