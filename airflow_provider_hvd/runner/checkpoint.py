"""Rank-0-only, atomic, streamed checkpoints on a local path or any fsspec URL.

Horovod's rule: every rank holds the same weights, so only rank 0 writes. ``torch.save``
writes straight into the destination, tensor by tensor, with no copy of the state in
memory: on a file system into a temporary sibling that is then renamed to
``ckpt-<step>.pt``, on an object store as one multipart upload that becomes the key only
when it completes (no server-side copy). So a reader (a resuming run, a restart, a sensor)
never sees a half-written checkpoint: a crash mid-write leaves at most a ``.tmp-*`` file,
which ``latest_checkpoint`` ignores and the runner removes when it restarts or ends the run.
Loading uses ``torch.load(weights_only=True)``, which refuses arbitrary pickled code.
"""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_hvd.runner.common.checkpoint_files import NAME as _NAME
from airflow_provider_hvd.runner.common.checkpoint_files import checkpoint_name, list_checkpoints
from airflow_provider_hvd.runner.common.storage import atomic_open, fs_and_path
from airflow_provider_hvd.runner.rank.context import current_rank



def save_checkpoint(state: Any, directory: str, *, step: int, rank: int | None = None) -> str | None:
    """Save ``state`` (anything ``torch.save`` takes) as checkpoint ``step`` under ``directory``.

    Writes only on rank 0 (``rank`` defaults to this process's Horovod rank; outside
    a run it counts as 0) and returns the checkpoint's URL there, None elsewhere.
    """
    import torch

    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    rank = current_rank() if rank is None else rank
    if rank not in (None, 0):
        return None
    # The run's id tags the temporary file, so that the runner can remove what a rank killed
    # mid-write left (see driver/run_checkpoints.py).
    location = f"{str(directory).rstrip('/')}/{checkpoint_name(step)}"
    try:
        with atomic_open(location, tmp_tag=os.environ.get(RUN_ID_ENV, "")) as f:
            torch.save(state, f)
    except Exception as exc:
        # Storage clients name a mangled URL (percent-encoded, the endpoint's) and no operation:
        # say which checkpoint, where, and what failed.
        raise CheckpointWriteError(f"save_checkpoint: writing checkpoint {step} to {location} failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
    return f.location


class CheckpointWriteError(OSError):
    """save_checkpoint could not write a checkpoint (storage unreachable, denied, full, ...)."""


def latest_checkpoint(directory: str) -> str | None:
    """URL of the newest complete checkpoint under ``directory``, or None when there is none."""
    found = list_checkpoints(directory)
    return max(found, key=lambda url: found[url][0]) if found else None


def checkpoint_step(location: str) -> int:
    """The step a checkpoint URL was saved at."""
    match = _NAME.match(location.rstrip("/").rsplit("/", 1)[-1])
    if not match:
        raise ValueError(f"{location!r} is not a checkpoint written by save_checkpoint (ckpt-<step>.pt)")
    return int(match.group(1))


def load_checkpoint(location: str, map_location: Any = "cpu") -> Any:
    """Load a checkpoint written by ``save_checkpoint`` (tensors, dicts, numbers: no arbitrary code)."""
    import torch

    fs, path = fs_and_path(location)
    with fs.open(path, "rb") as f:  # read as torch asks (seek and read), not all at once
        return torch.load(f, map_location=map_location, weights_only=True)


# Set for every rank by HorovodRunner (checkpoint_dir=, restarts) and HorovodRunnerOperator.
CHECKPOINT_DIR_ENV = "HVD_CHECKPOINT_DIR"
RESUME_FROM_ENV = "HVD_RESUME_FROM"
# "1" when HVD_RESUME_FROM is a checkpoint this same run wrote before a restart.
RESUME_IS_RESTART_ENV = "HVD_RESUME_IS_RESTART"
RESTART_ENV = "HVD_RESTART"
RUN_ID_ENV = "HVD_RUN_ID"


def checkpoint_dir() -> str:
    """Where this run should write its checkpoints (``HorovodRunner(checkpoint_dir=...)``;
    HorovodRunnerOperator sets it per try)."""
    value = os.environ.get(CHECKPOINT_DIR_ENV)
    if not value:
        raise RuntimeError(f"{CHECKPOINT_DIR_ENV} is not set: checkpoint_dir() works inside a run started by "
                           "HorovodRunnerOperator or by HorovodRunner(checkpoint_dir=...); elsewhere pass a "
                           "directory to save_checkpoint yourself.")
    return value


def resume_checkpoint() -> str | None:
    """The checkpoint to resume from, or None to start fresh.

    After a restart (``max_restarts``): the newest complete checkpoint this run wrote before
    it (``resume_is_restart()`` is then True); before this run wrote any, or without
    restarts: the operator's ``resume_from_checkpoint``.
    """
    return os.environ.get(RESUME_FROM_ENV) or None


def resume_is_restart() -> bool:
    """True when ``resume_checkpoint()`` was written by this same run before a restart: carry
    on towards the goal the run had (e.g. its last epoch) rather than starting a new one."""
    return os.environ.get(RESUME_IS_RESTART_ENV) == "1"


def restart_number() -> int:
    """0 on a run's first attempt, n on its n-th restart (``max_restarts``)."""
    return int(os.environ.get(RESTART_ENV, "0"))
