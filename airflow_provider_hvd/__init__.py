"""airflow-provider-hvd: HorovodRunner for open-source Apache Spark, scheduled from Airflow.

The runner core (``HorovodRunner``, ``log_to_driver``, checkpoints) needs only
pyspark, cloudpickle and horovod; the Airflow layer lives in ``hooks``,
``operators``, ``sensors`` and ``triggers``. Names are imported lazily so that
Airflow's providers manager, which imports this package to read
``get_provider_info``, does not pay for pyspark.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "HorovodRunner": "airflow_provider_hvd.runner.run",
    "log_to_driver": "airflow_provider_hvd.runner.rank.context",
    "save_checkpoint": "airflow_provider_hvd.runner.checkpoint",
    "load_checkpoint": "airflow_provider_hvd.runner.checkpoint",
    "latest_checkpoint": "airflow_provider_hvd.runner.checkpoint",
    "checkpoint_dir": "airflow_provider_hvd.runner.checkpoint",
    "resume_checkpoint": "airflow_provider_hvd.runner.checkpoint",
    "resume_is_restart": "airflow_provider_hvd.runner.checkpoint",
    "restart_number": "airflow_provider_hvd.runner.checkpoint",
    "HorovodRunError": "airflow_provider_hvd.runner.errors",
    "RankFailedError": "airflow_provider_hvd.runner.errors",
    "PayloadError": "airflow_provider_hvd.runner.errors",
    "StallError": "airflow_provider_hvd.runner.errors",
    "StartTimeoutError": "airflow_provider_hvd.runner.errors",
    "ClusterCapacityError": "airflow_provider_hvd.runner.errors",
    "MpiDaemonCrashError": "airflow_provider_hvd.runner.errors",
    "SparkStageError": "airflow_provider_hvd.runner.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'airflow_provider_hvd' has no attribute {name!r}")
