"""Rank-0-only, atomic checkpoints on a local path or any fsspec URL.

Horovod's rule: every rank holds the same weights, so only rank 0 writes. A
checkpoint is written under a temporary name and then renamed to
``ckpt-<step>.pt``, so a reader (a resuming run, a sensor) never sees a
half-written file: a crash mid-write leaves only a ``.tmp-*`` file that
``latest_checkpoint`` ignores. Loading uses ``torch.load(weights_only=True)``,
which refuses arbitrary pickled code.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

from airflow_provider_hvd.runner.common.storage import atomic_write, fs_and_path
from airflow_provider_hvd.runner.rank.context import current_rank

_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:010d}.pt"


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
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return atomic_write(f"{str(directory).rstrip('/')}/{checkpoint_name(step)}", buffer.getvalue())


def latest_checkpoint(directory: str) -> str | None:
    """URL of the newest complete checkpoint under ``directory``, or None when there is none."""
    fs, base = fs_and_path(directory)
    if not fs.exists(base):
        return None
    steps = []
    for path in fs.ls(base, detail=False):
        match = _NAME.match(path.rstrip("/").rsplit("/", 1)[-1])
        if match:
            steps.append((int(match.group(1)), path))
    if not steps:
        return None
    return fs.unstrip_protocol(max(steps)[1])


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
    with fs.open(path, "rb") as f:
        data = f.read()
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)


# Set by HorovodRunnerOperator for every rank (see operators/horovod_runner.py).
CHECKPOINT_DIR_ENV = "HVD_CHECKPOINT_DIR"
RESUME_FROM_ENV = "HVD_RESUME_FROM"


def checkpoint_dir() -> str:
    """Where this run should write its checkpoints (HorovodRunnerOperator sets it per try)."""
    value = os.environ.get(CHECKPOINT_DIR_ENV)
    if not value:
        raise RuntimeError(f"{CHECKPOINT_DIR_ENV} is not set: checkpoint_dir() works inside a run started by "
                           "HorovodRunnerOperator; elsewhere pass a directory to save_checkpoint yourself.")
    return value


def resume_checkpoint() -> str | None:
    """The checkpoint to resume from (``resume_from_checkpoint`` of the operator), or None."""
    return os.environ.get(RESUME_FROM_ENV) or None
