"""What the operator reads back from a try's storage: rank 0's result, and the checkpoint to resume from."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk import ObjectStoragePath

from airflow_provider_hvd.placements.try_files import TryFiles, plain_url
from airflow_provider_hvd.runner import results
from airflow_provider_hvd.runner.checkpoint import checkpoint_step, latest_checkpoint
from airflow_provider_hvd.runner.common.storage import fs_and_path
from airflow_provider_hvd.runner.errors import PayloadError
from airflow_provider_hvd.runner.wire import payload
from airflow_provider_hvd.version_compat import AirflowException

log = logging.getLogger(__name__)

NO_KEY_WARNING = ("The horovod connection has no signing key, so the result was signed with a key made for this run "
                  "alone: nothing can verify it after this task. Set one (the connection's password: python -c "
                  "'import secrets; print(secrets.token_hex(32))') to read non-JSON results downstream.")


@contextmanager
def runner_message_first(files: TryFiles) -> Iterator[None]:
    """A failed application fails the task with the runner's own message, when it left one, rather than
    spark-submit's exit code or the driver's state."""
    try:
        yield
    except AirflowException as exc:
        raise AirflowException(files.failure_message() or str(exc)) from exc


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} B"


def _filesystem(path: ObjectStoragePath) -> tuple[Any, str]:
    """The filesystem to read ``path`` with: Airflow's when the path names a connection, else the one
    fsspec keeps for the URL, which wrote the payload (ObjectStoragePath's open/stat would connect a
    second client). Cached listings go: the file may have appeared since one was made."""
    # Older Task SDKs (1.0) keep the connection id in storage_options only.
    conn_id = getattr(path, "conn_id", None) or path.storage_options.get("conn_id")
    fs, location = (path.fs, path.path) if conn_id else fs_and_path(plain_url(path))
    fs.invalidate_cache(location)
    return fs, location


def read_result(result_path: ObjectStoragePath, key: bytes, *, unpickle: bool, key_outlives_run: bool) -> Any:
    """Rank 0's value when it came back as JSON; else its URI, left unread unless ``unpickle``."""
    fs, path = _filesystem(result_path)
    try:
        with fs.open(path, "rb") as f:
            header = f.read(payload.HEADER_SIZE)
        kind = results.result_kind(header, key)
        if kind == payload.KIND_RESULT and not unpickle:
            log.info("Rank 0's result is not JSON (a %s pickle): left at %s. Read it downstream with "
                     "airflow_provider_hvd.hooks.horovod.load_result(<this task's return value>)",
                     _size(fs.size(path)), result_path)
            if not key_outlives_run:
                log.warning("%s", NO_KEY_WARNING)
            return str(result_path)
        value = results.open_result(fs.cat_file(path), key)
    except FileNotFoundError:
        raise AirflowException(f"the Spark application ended without writing rank 0's result to "
                               f"{result_path}") from None
    except PayloadError as exc:
        raise AirflowException(f"refused rank 0's result at {result_path}: {exc}") from exc
    shown = repr(value)
    log.info("Rank 0 returned %s", shown if len(shown) <= 300 else shown[:300] + " ...")
    return value


def resume_checkpoint(wanted: bool | str, files: TryFiles, checkpoint_path: str | None) -> str | None:
    """The checkpoint ``resume_from_checkpoint`` names: ``True``, the newest of this task's earlier
    tries (else under ``checkpoint_path``); a folder, the newest there; a checkpoint, itself."""
    if not wanted:
        return None
    if wanted is True or str(wanted).lower() == "true":
        for earlier in files.earlier():
            found = latest_checkpoint(plain_url(earlier.checkpoints))
            if found:
                return found
        if checkpoint_path:
            return latest_checkpoint(plain_url(ObjectStoragePath(checkpoint_path)))
        log.info("No checkpoint from an earlier try: training starts fresh")
        return None
    location = plain_url(ObjectStoragePath(str(wanted)))
    try:
        checkpoint_step(location)
        return location
    except ValueError:
        found = latest_checkpoint(location)
        if not found:
            log.info("No checkpoint under %s yet: training starts fresh", location)
        return found
