# Every target does its own set-up first (scripts/setup.sh: it returns at once when a finished
# set-up was made from the same pyproject.toml and scripts/).
PY := .venv/bin/python
# The TensorFlow flavour lives in its own environment, so the default one stays PyTorch-only.
TF_VENV := .venv-tf
PYTEST_ARGS ?=

.PHONY: setup setup-tensorflow prepare-tensorflow test test-tensorflow faults demo dist bench cluster cluster-down clean

setup:
	scripts/setup.sh

setup-tensorflow:
	VENV=$(TF_VENV) HVD_FLAVOUR=tensorflow HVD_EXTRAS=airflow,examples,test scripts/setup.sh

# Its slow part alone (TensorFlow and horovod's TensorFlow build into .venv-tf); .ci/run runs it
# at the lowest CPU priority while `make test` runs.
prepare-tensorflow:
	VENV=$(TF_VENV) HVD_FLAVOUR=tensorflow HVD_EXTRAS=airflow,examples,test HVD_PREPARE_ONLY=1 scripts/setup.sh

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

# What a script or notebook installs (README.md): this package's wheel and sdist, the horovod wheel
# the set-up built for its torch, pyspark's wheels (PyPI has only sdists), and the pins as constraints.
# The set-up runs only where .venv is missing: in a copy of the tree (the tests'), it would point
# .venv's editable install at the copy.
dist:
	@test -x $(PY) || $(MAKE) setup
	rm -rf dist
	$(PY) -m build --outdir dist .
	cp "$$(cat .venv/.horovod-wheel)" dist/
	cp "$$(scripts/build_sdist_wheels.sh)"/*.whl dist/
	$(PY) scripts/versions.py constraints > dist/constraints.txt

# Against the peers, same run, same session: writes docs/benchmarks.md and its plots (~20 min;
# `bench/run.py --only timeline` measures one section again).
bench: setup
	$(PY) bench/run.py

# The production shape on this machine (localcluster/, docs/deploy.md): PostgreSQL, moto's S3 server,
# a Spark master and two workers and Airflow's services, each host in its own network and mount
# namespaces on a private bridge. Needs root. The UI and REST API: http://127.0.0.1:8080.
cluster: setup
	$(PY) -m localcluster up

cluster-down:
	$(PY) -m localcluster down

clean:
	rm -rf .venv $(TF_VENV) .airflow .pytest_cache spark-warehouse
