"""The digits training DAG, for either framework: prepare, train, wait for artifacts, evaluate.

dags/hvd_mnist_pytorch.py and dags/hvd_mnist_tensorflow.py build their DAG from here; only the
training and evaluation functions differ (digits.py, digits_keras.py).

prepare  -> writes the digits data set (scikit-learn's 8x8 MNIST stand-in, or a real
            MNIST .npz given as the ``mnist_path`` param) to storage as one shard per rank
train    -> HorovodRunnerOperator: 2 ranks in a Spark barrier stage, timeline on,
            checkpoints on rank 0, both under ``<storage>/<dag_id>/<run_id>/``
wait     -> HorovodArtifactSensor, *beside* train: it waits for the run's timeline (written when
            training ends) and a checkpoint, holding no worker slot meanwhile: deferred to the
            triggerer (and ended there, their paths as XCom) where sensors are deferrable,
            rescheduled otherwise
evaluate -> test accuracy of the newest checkpoint (the task fails below ``min_accuracy``), on
            the training side (HorovodRunnerOperator, np=-1): the Airflow worker needs no torch
"""

from __future__ import annotations

import os
from typing import Callable

import pendulum
from airflow.sdk import Param, dag, task
from airflow_provider_hvd.examples.digits import evaluate_and_check, prepare_digits

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
from airflow_provider_hvd.sensors.horovod_artifact import HorovodArtifactSensor

NP = 2


def digits_training_dag(dag_id: str, *, train: Callable, evaluate: Callable, tags: list[str], doc: str):
    data = f"data/{dag_id}"
    # Known before train starts (not XCom from it), so that the sensor can wait beside it. One folder
    # for every try: a retry resumes from, and evaluate reads, the newest checkpoint in it.
    run_dir = "{{ params.storage }}/" + dag_id + "/{{ run_id }}"

    @dag(
        dag_id=dag_id,
        doc_md=doc,
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        # epochs, max_restarts and min_accuracy render as numbers (a DAG-level setting: Airflow 3.0
        # has no per-operator one).
        render_template_as_native_obj=True,
        tags=["horovod", *tags, "example"],
        params={
            "storage": Param(os.environ.get("HVD_EXAMPLE_STORAGE", "file:///tmp/airflow-provider-hvd"),
                             type="string",
                             description="ObjectStoragePath URL for data, payloads, timelines, checkpoints"),
            "mnist_path": Param(None, type=["null", "string"], description="optional MNIST .npz to use instead"),
            "epochs": Param(20, type="integer", minimum=1),
            "min_accuracy": Param(0.9, type="number"),
            "max_restarts": Param(2, type="integer", minimum=0,
                                  description="restarts from the last checkpoint after a lost executor or rank"),
            "spark_log_level": Param("WARN", enum=["WARN", "INFO", "DEBUG"],
                                     description="Spark's own lines in the train task's log: INFO for debugging"),
        },
    )
    def digits_training():
        @task
        def prepare(params=None) -> str:
            info = prepare_digits(f"{params['storage']}/{data}", np=NP, mnist_path=params["mnist_path"])
            print(f"prepared {info}")
            return info["data_dir"]

        data_dir = prepare()

        train_task = HorovodRunnerOperator(
            task_id="train",
            python_callable=train,
            np=NP,
            # Rendered from params rather than pulled from XCom, so that
            # `airflow tasks test <dag_id> train` works on its own after prepare ran once.
            op_kwargs={"data_dir": "{{ params.storage }}/" + data, "epochs": "{{ params.epochs }}", "lr": 0.05},
            storage_path="{{ params.storage }}",
            timeline=run_dir + "/timeline.json",
            checkpoint_path=run_dir + "/checkpoints",
            max_restarts="{{ params.max_restarts }}",
            conf={"spark.log.level": "{{ params.spark_log_level }}"},
        )

        wait = HorovodArtifactSensor(
            task_id="wait_for_artifacts",
            timeline_path=run_dir + "/timeline.json",
            checkpoint_dir=run_dir + "/checkpoints",
            poke_interval=5,
            # As long as a training may take: it waits beside it. If train fails before it writes its
            # timeline (killed, marked failed), mark the run failed too, or this waits until then.
            timeout=2 * 3600,
            # Never poke mode: a task blocking beside train. Deferred where the deployment makes sensors
            # deferrable ([operators] default_deferrable, set in docker/compose.yaml), else rescheduled:
            # `airflow dags test` runs one task at a time and a trigger inline to its end, so a deferral
            # there would keep train from ever starting.
            mode="reschedule",
            end_from_trigger=True,
        )

        # Evaluation needs torch (or TensorFlow): it runs on the training side too, as one process
        # on the Spark driver (np=-1), so the Airflow image needs neither.
        evaluate_task = HorovodRunnerOperator(
            task_id="evaluate",
            python_callable=evaluate_and_check,
            np=-1,
            op_kwargs={"evaluate": evaluate, "data_dir": "{{ params.storage }}/" + data,
                       # The folder, not the sensor's find: after a retry, the newest is the last try's.
                       "checkpoint": run_dir + "/checkpoints",
                       "min_accuracy": "{{ params.min_accuracy }}"},
            storage_path="{{ params.storage }}",
            conf={"spark.log.level": "{{ params.spark_log_level }}"},
        )

        data_dir >> [train_task, wait] >> evaluate_task

    return digits_training()
