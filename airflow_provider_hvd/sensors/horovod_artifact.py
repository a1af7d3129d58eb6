"""HorovodArtifactSensor: wait for a run's Horovod timeline and/or rank-0 checkpoint."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue

from airflow_provider_hvd.triggers.horovod_artifact import HorovodArtifactTrigger, find_artifacts, parse_when
from airflow_provider_hvd.version_compat import AirflowException, conf


class HorovodArtifactSensor(BaseSensorOperator):
    """Wait until the Horovod timeline and/or a rank-0 checkpoint exist in storage; return their paths.

    Follows the standard provider's FileSensor: with ``deferrable=True`` it defers
    to :class:`HorovodArtifactTrigger` only when its first poke finds nothing.

    :param timeline_path: timeline file (templated), e.g. ``{{ ti.xcom_pull('train', key='timeline') }}``:
        the complete timeline, written once when training ends (also when it fails). To watch
        training while it runs, open the live view instead (XCom ``timeline_live``), which the
        runner refreshes during training and removes at the end.
    :param checkpoint_dir: folder of checkpoints (templated), e.g. ``{{ ti.xcom_pull('train', key='checkpoint_dir') }}``.
    :param newer_than: only artifacts modified after this time count (templated; ISO string
        or datetime), e.g. ``{{ dag_run.start_date }}`` for this run's own checkpoint.
    :param deferrable: defer to the triggerer instead of occupying a worker slot.
    :param end_from_trigger: once deferred, the triggerer ends the task (its XCom pushed there)
        instead of handing it back to a worker: no worker slot at all after the first poke.
    """

    template_fields: Sequence[str] = ("timeline_path", "checkpoint_dir", "newer_than")
    ui_color = "#dff0d8"

    def __init__(self, *, timeline_path: str | None = None, checkpoint_dir: str | None = None,
                 newer_than: str | datetime.datetime | None = None,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 end_from_trigger: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not timeline_path and not checkpoint_dir:
            raise ValueError("HorovodArtifactSensor needs timeline_path, checkpoint_dir or both")
        self.timeline_path = timeline_path
        self.checkpoint_dir = checkpoint_dir
        self.newer_than = newer_than
        self.deferrable = deferrable
        self.end_from_trigger = end_from_trigger

    def _newer_than_iso(self) -> str | None:
        when = parse_when(self.newer_than)
        return when.isoformat() if when else None

    def poke(self, context: Context) -> PokeReturnValue:
        self.log.info("Looking for timeline=%s checkpoint under=%s newer than %s", self.timeline_path,
                      self.checkpoint_dir, self.newer_than)
        found = find_artifacts(self.timeline_path or None, self.checkpoint_dir or None,
                               parse_when(self.newer_than))
        return PokeReturnValue(is_done=found is not None, xcom_value=found)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context=context)
        first = self.poke(context)
        if first.is_done:
            return first.xcom_value
        self.defer(
            timeout=datetime.timedelta(seconds=self.timeout),
            trigger=HorovodArtifactTrigger(timeline_path=self.timeline_path or None,
                                           checkpoint_dir=self.checkpoint_dir or None,
                                           newer_than=self._newer_than_iso(), poke_interval=self.poke_interval,
                                           end_from_trigger=self.end_from_trigger),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | str | None = None) -> dict[str, Any]:
        if event == "success" and self.end_from_trigger:
            # The trigger ended the task, but `airflow dags test` (which runs triggers inline) hands
            # the task back here with the event's state only, not its XCom: look once more.
            found = self.poke(context)
            if found.is_done:
                return found.xcom_value
        if not isinstance(event, dict) or event.get("status") != "success":
            raise AirflowException(f"HorovodArtifactTrigger ended without the artifacts: {event!r}")
        return event["found"]
