# Every target does its own set-up first (scripts/setup.sh is idempotent and
# takes about 30 s once the environment exists).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test faults demo bench clean

setup:
	scripts/setup.sh

# The test command the README gives and CI runs.
test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The fault-injection suite alone (also part of `make test`): writes docs/reliability.md (~6 min).
faults: setup
	HVD_RELIABILITY_REPORT=docs/reliability.md $(PY) -m pytest -m faults $(PYTEST_ARGS)

# The main job end to end on the embedded default (Spark local[*], local storage).
demo: setup
	scripts/demo.sh

# Against the peers, same run, same session: writes docs/benchmarks.md and its plots (~10 min).
bench: setup
	$(PY) bench/run.py

clean:
	rm -rf .venv .airflow .pytest_cache spark-warehouse
