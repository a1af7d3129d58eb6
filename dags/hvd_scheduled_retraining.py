"""Retraining whenever new data lands, continuing from the last checkpoint: two DAGs.

``hvd_digits_ingest`` (daily; in production, whatever lands your data):
land_data    -> writes the training data; updates the ``hvd_digits_data`` Asset

``hvd_scheduled_retraining`` (scheduled on that Asset: each update starts a run):
retrain      -> HorovodRunnerOperator resuming from the newest checkpoint in a stable
                folder (``resume_from_checkpoint``) and adding ``epochs`` more
wait         -> HorovodArtifactSensor: a checkpoint written by *this* run (newer than its start)
evaluate     -> its test accuracy, on the training side (np=-1); fails below ``min_accuracy``
publish      -> publishes it as models/digits/latest.pt; updates the ``hvd_digits_model``
                Asset for downstream DAGs (serving, reports)

To retrain on a clock as well (say weekly, new data or not), schedule it on
``AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 3 * * 0", timezone="UTC"), assets=DIGITS_DATA)``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Asset, Param, dag, task
from airflow_provider_hvd.examples.digits import evaluate_and_check, evaluate_digits, prepare_digits, train_digits

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
from airflow_provider_hvd.sensors.horovod_artifact import HorovodArtifactSensor

NP = 2
# Where data, checkpoints and models live; parse-time, since Asset URIs are static.
STORAGE = os.environ.get("HVD_EXAMPLE_STORAGE", "file:///tmp/airflow-provider-hvd")
DIGITS_DATA = Asset(name="hvd_digits_data", uri=f"{STORAGE}/data/hvd_scheduled_retraining")
DIGITS_MODEL = Asset(name="hvd_digits_model", uri=f"{STORAGE}/models/digits")
CHECKPOINTS = f"{STORAGE}/models/digits/checkpoints"


@dag(
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "example", "retraining"],
)
def hvd_digits_ingest():
    @task(outlets=[DIGITS_DATA])
    def land_data(dag_run=None) -> str:
        # A real pipeline would land the interval's new examples; the digits are reshuffled per run.
        info = prepare_digits(DIGITS_DATA.uri, np=NP, seed=int(dag_run.run_after.timestamp()) % 1000)
        print(f"landed {info}")
        return info["data_dir"]

    land_data()


@dag(
    schedule=[DIGITS_DATA],  # every update of the data asset starts a run
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # two runs must not resume from, and write, the same checkpoints at once
    render_template_as_native_obj=True,  # epochs, max_restarts and min_accuracy render as numbers
    tags=["horovod", "pytorch", "example", "retraining"],
    params={"epochs": Param(10, type="integer", minimum=1), "min_accuracy": Param(0.9, type="number"),
            "max_restarts": Param(2, type="integer", minimum=0)},
)
def hvd_scheduled_retraining():
    retrain = HorovodRunnerOperator(
        task_id="retrain",
        python_callable=train_digits,
        np=NP,
        op_kwargs={"data_dir": DIGITS_DATA.uri, "epochs": "{{ params.epochs }}", "lr": 0.05},
        storage_path=STORAGE,
        checkpoint_path=CHECKPOINTS,
        resume_from_checkpoint=CHECKPOINTS,
        timeline=True,
        max_restarts="{{ params.max_restarts }}",  # a lost executor restarts inside the run ...
        retries=1,  # ... and anything else gets one Airflow retry, resuming from the checkpoint
    )

    wait = HorovodArtifactSensor(
        task_id="wait_for_checkpoint",
        checkpoint_dir=CHECKPOINTS,
        newer_than="{{ dag_run.start_date }}",
        poke_interval=5,
        timeout=600,
    )

    # On the training side (one process on the Spark driver): the Airflow image needs no torch.
    evaluate = HorovodRunnerOperator(
        task_id="evaluate",
        python_callable=evaluate_and_check,
        np=-1,
        op_kwargs={"evaluate": evaluate_digits, "data_dir": DIGITS_DATA.uri,
                   "checkpoint": "{{ ti.xcom_pull(task_ids='wait_for_checkpoint')['checkpoint'] }}",
                   "min_accuracy": "{{ params.min_accuracy }}"},
        storage_path=STORAGE,
    )

    @task(outlets=[DIGITS_MODEL])
    def publish(artifacts: dict, result: dict) -> dict:
        import fsspec

        from airflow_provider_hvd.runner.common.storage import atomic_write

        with fsspec.open(artifacts["checkpoint"], "rb") as f:
            latest = atomic_write(f"{DIGITS_MODEL.uri}/latest.pt", f.read())
        print(f"published {latest}: test accuracy {result['test_accuracy']:.4f} after {result['epoch']} epochs")
        return {**result, "model": latest}

    retrain >> wait >> evaluate
    publish(wait.output, evaluate.output)


hvd_digits_ingest()
hvd_scheduled_retraining()
