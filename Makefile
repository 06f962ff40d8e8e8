# The README's two commands: `make demo` (the main job on the bundled fleet) and `make test` (the whole suite).
# Both do all set-up themselves: system packages (scripts/bootstrap.sh), the venv, the requirements.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
SAMPLES := include/samples
SAMPLE_NOW := 2026-11-29T12:00:00Z
SAMPLE_INPUTS := --gce $(SAMPLES)/gce-instances.json --k8s $(SAMPLES)/k8s-objects.json \
	--runs $(SAMPLES)/runs.json --leases $(SAMPLES)/leases.json --writer-health $(SAMPLES)/writer-health.json

.PHONY: venv demo demo-down what-if test lint types check bench clean

# --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set (as on CI), every process would otherwise
# compile Airflow and the SDKs from source on each import: seconds per Airflow task.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) scripts/bootstrap.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -r requirements-dev.txt -e .
	touch $(STAMP)

venv: $(STAMP)

# The main job on the embedded default: emulated fleet, local services, `airflow standalone`, every phase once.
# EXECUTOR=celery: the same on two Celery workers (Redis broker, sweep files on the storage emulator's gs://).
EXECUTOR ?= local
demo: $(STAMP)
	REAPER_DEMO_EXECUTOR=$(EXECUTOR) $(BIN)/python -m include.demo up

demo-down:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m include.demo down

# The offline what-if: every rollout phase on the bundled sample exports, no services at all.
what-if: $(STAMP)
	@for phase in telemetry terminated-cleanup report-only enforcement; do \
		echo "================ $$phase ================"; \
		$(BIN)/reaper evaluate --now $(SAMPLE_NOW) --phase $$phase $(SAMPLE_INPUTS) || exit $$?; \
		echo; \
	done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy

# The type checker alone: strict on plugins/ and dags/, looser on tests/, bench/, include/ ([tool.mypy] in
# pyproject.toml).
types: $(STAMP)
	$(BIN)/python -m mypy

# The edit-test loop (docs/testing.md): lint, then the unit tests but the slowest property tests (marked slow;
# `make test` runs them). One process: on 2 cores, starting two xdist workers costs more than they save here.
check: lint
	$(BIN)/python -m pytest -q -n 0 -m "not slow" tests/unit

# pytest exits 5 when a selection (PYTEST_ARGS) collects nothing: that is not a failure of the suite.
# Two workers (pytest-xdist), each test file on one of them: most end-to-end tests wait on servers, and a
# module's fixtures (an Airflow site, Celery workers) are then set up once. The heaviest files start first (their
# `slow` marker's seconds, tests/conftest.py), so none runs alone at the end; --no-loadscope-reorder keeps that
# order (xdist would otherwise start the files with the most tests first). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); code=$$?; [ $$code -eq 0 ] || [ $$code -eq 5 ] || exit $$code

bench: $(STAMP)
	$(BIN)/python bench/policy.py
	$(BIN)/python bench/gce_sweep.py
	$(BIN)/python bench/k8s_sweep.py
	$(BIN)/python bench/audit.py
	$(BIN)/python bench/sweep.py 2>/dev/null
	$(BIN)/python bench/incident.py 2>/dev/null

clean:
	rm -rf $(VENV) .demo .pytest_cache .ruff_cache .mypy_cache .hypothesis
