"""Where one try of a training task keeps its files: ``<storage>/<dag_id>/<run_id>/<task_id>/try-<n>/``."""

from __future__ import annotations

import json
from dataclasses import dataclass

from airflow.sdk import ObjectStoragePath


def plain_url(path: ObjectStoragePath) -> str:
    """The URL the Spark application opens with fsspec (it has no Airflow connections)."""
    return f"{path.protocol or 'file'}://{path.path}"


@dataclass(frozen=True)
class TryFiles:
    """A try's prefix and the files under it."""

    task_prefix: ObjectStoragePath  # <storage>/<dag_id>/<run_id>/<task_id>
    try_number: int

    @property
    def prefix(self) -> ObjectStoragePath:
        return self.task_prefix / f"try-{self.try_number}"

    def of_try(self, try_number: int) -> TryFiles:
        return TryFiles(self.task_prefix, try_number)

    @property
    def payload(self) -> ObjectStoragePath:
        return self.prefix / "payload.hvd"

    @property
    def result(self) -> ObjectStoragePath:
        return self.prefix / "result.hvd"

    @property
    def error_report(self) -> ObjectStoragePath:
        """What the Spark application writes when it fails (runner/spark_app.py)."""
        return self.prefix / "result.hvd.error.json"

    @property
    def driver_log(self) -> ObjectStoragePath:
        """A driver on the cluster ships its output here."""
        return self.prefix / "driver-log"

    @property
    def driver_record(self) -> ObjectStoragePath:
        """Which driver this try submitted on the cluster (placements/earlier_driver.py)."""
        return self.prefix / "spark-driver.json"

    @property
    def checkpoints(self) -> ObjectStoragePath:
        return self.prefix / "checkpoints"

    @property
    def timeline(self) -> ObjectStoragePath:
        return self.prefix / "timeline.json"

    def earlier(self) -> list[TryFiles]:
        """The files of every earlier try of this task, newest first."""
        return [self.of_try(n) for n in range(self.try_number - 1, 0, -1)]

    def failure_message(self) -> str | None:
        """The Spark application's own word on why it failed, when it left one."""
        try:
            report = json.loads(self.error_report.read_text())
        except (FileNotFoundError, ValueError, OSError):
            return None
        return f"{report['type']}: {report['message']}"
