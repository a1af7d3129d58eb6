"""The task's buttons in Airflow's UI: the Spark UI of its application, its Horovod timeline, its checkpoints.

Airflow 3 computes a link on the worker when the task ends and keeps it in XCom under
``xcom_key``; the UI reads it from there. A training run's links are wanted while it runs,
so HorovodRunnerOperator pushes each to that XCom key as soon as it knows the URL (the
Spark UI's once the driver says where it is), and ``get_link`` gives the same URL at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class _RunLink(BaseOperatorLink):
    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return getattr(operator, "link_urls", {}).get(self.name, "")


class SparkUILink(_RunLink):
    """The Spark driver's web UI (jobs, stages, executors), while the application runs."""

    name = "Spark UI"


class HorovodTimelineLink(_RunLink):
    """The Horovod timeline (Chrome trace JSON): open it in https://ui.perfetto.dev or chrome://tracing."""

    name = "Horovod timeline"


class CheckpointsLink(_RunLink):
    """The folder rank 0's ``save_checkpoint`` writes to."""

    name = "Checkpoints"


def publish_link(operator: BaseOperator, ti: Any, link: type[_RunLink], url: str) -> None:
    """Show the link in the UI now, while training runs (Airflow itself pushes links only at the end)."""
    operator.link_urls[link.name] = url
    ti.xcom_push(key=link().xcom_key, value=url)
