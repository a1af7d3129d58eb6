"""Names that moved between Airflow 3 minors, imported from where the running Airflow has them.

Airflow 3.0 has them in core (``airflow.hooks.base``, ``airflow.exceptions``,
``airflow.configuration``); from 3.1 the Task SDK (``airflow.sdk``) exports them, and core's
copies start to warn. Airflow's own providers keep the same kind of module.
"""

from __future__ import annotations

try:  # Airflow >= 3.1
    from airflow.sdk import BaseHook, conf
    from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException
except ImportError:  # Airflow 3.0
    from airflow.configuration import conf  # type: ignore[no-redef]
    from airflow.exceptions import AirflowException, AirflowNotFoundException  # type: ignore[no-redef]
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]

try:  # Airflow >= 3.1
    from airflow.sdk.log import mask_secret
except ImportError:  # Airflow 3.0
    from airflow.sdk.execution_time.secrets_masker import mask_secret  # type: ignore[no-redef]

__all__ = ["AirflowException", "AirflowNotFoundException", "BaseHook", "conf", "mask_secret"]
