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
    }
