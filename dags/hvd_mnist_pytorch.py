"""Distributed PyTorch training with Horovod on Spark, end to end.

prepare -> train (HorovodRunnerOperator, 2 ranks) -> wait_for_artifacts -> evaluate;
the steps are in airflow_provider_hvd/examples/digits_dag.py, the training function in
airflow_provider_hvd/examples/digits.py.

Runs unchanged with ``airflow dags test hvd_mnist_pytorch`` on Spark local[*] and
local files, and on a cluster once ``spark_default`` and ``horovod_default`` point there.
"""

from __future__ import annotations

from airflow_provider_hvd.examples.digits import evaluate_digits, train_digits
from airflow_provider_hvd.examples.digits_dag import digits_training_dag

digits_training_dag("hvd_mnist_pytorch", train=train_digits, evaluate=evaluate_digits, tags=["pytorch"],
                    doc=__doc__)
