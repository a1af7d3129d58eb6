# Every target does its own set-up first (scripts/setup.sh is idempotent and
# takes about 30 s once the environment exists).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test test-slow demo bench clean

setup:
	scripts/setup.sh

# The test command the README gives and CI runs.
test: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Longer fault-injection and scaling cases.
test-slow: setup
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

# The main job end to end on the embedded default (Spark local[*], local storage).
demo: setup
	scripts/demo.sh

clean:
	rm -rf .venv .airflow .pytest_cache spark-warehouse
