# Every target does its own set-up first (scripts/setup.sh is idempotent and
# takes about 30 s once the environment exists).
PY := .venv/bin/python
# The TensorFlow flavour lives in its own environment, so the default one stays PyTorch-only.
TF_VENV := .venv-tf
PYTEST_ARGS ?=

.PHONY: setup setup-tensorflow test test-tensorflow faults demo bench clean

setup:
	scripts/setup.sh

setup-tensorflow:
	VENV=$(TF_VENV) HVD_FLAVOUR=tensorflow HVD_EXTRAS=airflow,examples,test scripts/setup.sh

# The test command the README gives and CI runs.
test: setup
	$(PY) -m pytest -m "not tensorflow" $(PYTEST_ARGS)

# The TensorFlow flavour's tests, in .venv-tf (first time: ~10 min of set-up, most of it
# building horovod's TensorFlow plugin). CI runs it after `make test`.
test-tensorflow: setup-tensorflow
	$(TF_VENV)/bin/python -m pytest -m tensorflow $(PYTEST_ARGS)

# The fault-injection suite alone (also part of `make test`): writes docs/reliability.md (~10 min).
faults: setup
	HVD_RELIABILITY_REPORT=docs/reliability.md $(PY) -m pytest -m faults $(PYTEST_ARGS)

# The main job end to end on the embedded default (Spark local[*], local storage).
demo: setup
	scripts/demo.sh

# Against the peers, same run, same session: writes docs/benchmarks.md and its plots (~20 min;
# `bench/run.py --only timeline` measures one section again).
bench: setup
	$(PY) bench/run.py

clean:
	rm -rf .venv $(TF_VENV) .airflow .pytest_cache spark-warehouse
