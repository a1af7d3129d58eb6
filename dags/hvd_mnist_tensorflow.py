"""Distributed TensorFlow/Keras training with Horovod on Spark, end to end.

The Keras twin of hvd_mnist_pytorch: same data, steps (examples/digits_dag.py), sensor
and evaluation; the training function is airflow_provider_hvd/examples/digits_keras.py
(tf.keras with tf-keras, DistributedOptimizer, BroadcastGlobalVariablesCallback,
MetricAverageCallback, checkpoints on rank 0).

Needs the TensorFlow flavour of the environment on the driver and every worker:
``HVD_FLAVOUR=tensorflow scripts/setup.sh`` (``make test-tensorflow`` sets one up in
.venv-tf). Runs with ``airflow dags test hvd_mnist_tensorflow`` on Spark local[*].
"""

from __future__ import annotations

from airflow_provider_hvd.examples.digits_keras import evaluate_digits_keras, train_digits_keras
from airflow_provider_hvd.examples.digits_dag import digits_training_dag

digits_training_dag("hvd_mnist_tensorflow", train=train_digits_keras, evaluate=evaluate_digits_keras,
                    tags=["tensorflow", "keras"], doc=__doc__)
