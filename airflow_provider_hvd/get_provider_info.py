"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from airflow_provider_hvd import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-hvd",
        "name": "Horovod on Spark",
        "description": "Run distributed deep-learning training (Horovod, in a Spark barrier stage) "
        "from Apache Airflow: HorovodRunner for open-source Spark.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "Horovod", "external-doc-url": "https://horovod.readthedocs.io/",
             "tags": ["software"]},
        ],
        "hooks": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.hooks.horovod"]},
        ],
        "operators": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.operators.horovod_runner"]},
        ],
        "sensors": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.sensors.horovod_artifact"]},
        ],
        "triggers": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.triggers.horovod_artifact"]},
        ],
        "connection-types": [
            {"connection-type": "horovod", "hook-class-name": "airflow_provider_hvd.hooks.horovod.HorovodHook"},
        ],
    }
