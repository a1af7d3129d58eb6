"""The checkpoint folder as one run's restarts see it: where to resume, what a crash left.

The folder may be shared with earlier runs (scheduled retraining keeps one folder and
resumes from it), so "the newest checkpoint of this run" is the newest one that is new or
rewritten since the run started; before the run wrote any, a restart resumes from where
the run itself started (the operator's ``resume_from_checkpoint``), or from scratch.
"""

from __future__ import annotations

import logging

from airflow_provider_hvd.runner.common.checkpoint_files import list_checkpoints
from airflow_provider_hvd.runner.common.storage import remove_partial_writes

log = logging.getLogger("airflow_provider_hvd.runner")


class RunCheckpoints:
    """:param directory: the run's checkpoint folder (as the driver reads it: a path or fsspec URL).
    :param run_id: the id that tags this run's temporary files.
    :param initial_resume: what the run's first attempt resumes from (or None)."""

    def __init__(self, directory: str, run_id: str, initial_resume: str | None):
        self.directory = directory
        self.run_id = run_id
        self.initial_resume = initial_resume
        self._before = self._list()

    def _list(self) -> dict[str, tuple]:
        try:
            return list_checkpoints(self.directory)
        except Exception as exc:  # an unreadable folder must not turn a curable failure into another one
            log.warning("HorovodRunner: cannot list the checkpoints under %s from the driver: %s",
                        self.directory, exc)
            return {}

    def newest_of_this_run(self) -> str | None:
        found = {url: step for url, (step, version) in self._list().items()
                 if self._before.get(url, (None, None))[1] != version}
        return max(found, key=found.get) if found else None

    def resume_point(self) -> tuple[str | None, bool]:
        """(the checkpoint a restart resumes from, whether this run wrote it)."""
        own = self.newest_of_this_run()
        return (own, True) if own else (self.initial_resume, False)

    def remove_partial(self) -> None:
        """Remove the temporary files of checkpoints whose writer was killed mid-write. Only this
        run's: another run may be writing to the same folder."""
        try:
            removed = remove_partial_writes(self.directory, self.run_id)
        except Exception as exc:
            log.warning("HorovodRunner: could not clean partial checkpoints under %s: %s", self.directory, exc)
            return
        if removed:
            log.info("HorovodRunner: removed %d partial checkpoint file(s) a killed rank left: %s", len(removed),
                     ", ".join(removed))
