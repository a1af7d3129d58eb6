"""Distributed PyTorch training with Horovod on Spark, end to end.

prepare  -> writes the digits data set (scikit-learn's 8x8 MNIST stand-in, or a real
            MNIST .npz given as the ``mnist_path`` param) to storage as one shard per rank
train    -> HorovodRunnerOperator: 2 ranks in a Spark barrier stage, timeline on,
            checkpoints on rank 0
wait     -> HorovodArtifactSensor: the timeline and this run's checkpoint are in storage
evaluate -> test accuracy of the checkpoint (the task fails below ``min_accuracy``)

Runs unchanged with ``airflow dags test hvd_mnist_pytorch`` on Spark local[*] and
local files, and on a cluster once ``spark_default`` and ``horovod_default`` point there.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task
from airflow_provider_hvd.examples.digits import evaluate_digits, prepare_digits, train_digits

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
from airflow_provider_hvd.sensors.horovod_artifact import HorovodArtifactSensor

NP = 2
DATA = "data/hvd_mnist_pytorch"


@dag(
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "pytorch", "example"],
    params={
        "storage": Param(os.environ.get("HVD_EXAMPLE_STORAGE", "file:///tmp/airflow-provider-hvd"), type="string",
                         description="ObjectStoragePath URL for data, payloads, timelines, checkpoints"),
        "mnist_path": Param(None, type=["null", "string"], description="optional MNIST .npz to use instead"),
        "epochs": Param(20, type="integer", minimum=1),
        "min_accuracy": Param(0.9, type="number"),
    },
)
def hvd_mnist_pytorch():
    @task
    def prepare(params=None) -> str:
        info = prepare_digits(f"{params['storage']}/{DATA}", np=NP, mnist_path=params["mnist_path"])
        print(f"prepared {info}")
        return info["data_dir"]

    data_dir = prepare()

    train = HorovodRunnerOperator(
        task_id="train",
        python_callable=train_digits,
        np=NP,
        # Rendered from params rather than pulled from XCom, so that
        # `airflow tasks test hvd_mnist_pytorch train` works on its own after prepare ran once.
        op_kwargs={"data_dir": "{{ params.storage }}/" + DATA, "epochs": "{{ params.epochs }}", "lr": 0.05},
        storage_path="{{ params.storage }}",
        timeline=True,
        render_template_as_native_obj=True,  # epochs renders as an int
    )

    wait = HorovodArtifactSensor(
        task_id="wait_for_artifacts",
        timeline_path="{{ ti.xcom_pull(task_ids='train', key='timeline') }}",
        checkpoint_dir="{{ ti.xcom_pull(task_ids='train', key='checkpoint_dir') }}",
        poke_interval=5,
        timeout=600,
    )

    @task
    def evaluate(data_dir: str, artifacts: dict, params=None) -> dict:
        result = evaluate_digits(data_dir, artifacts["checkpoint"])
        print(f"test accuracy {result['test_accuracy']:.4f} after {result['epoch']} epochs "
              f"({result['n_test']} test images); timeline: {artifacts['timeline']}")
        if result["test_accuracy"] < params["min_accuracy"]:
            raise ValueError(f"test accuracy {result['test_accuracy']} is below {params['min_accuracy']}")
        return result

    data_dir >> train >> wait
    evaluate(data_dir, wait.output)


hvd_mnist_pytorch()
