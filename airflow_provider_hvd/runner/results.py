"""Rank 0's value as a file in storage: written by the Spark application, read by whoever holds the key.

A value that is JSON (and at most ``JSON_RESULT_MAX_BYTES`` as JSON) is sealed as JSON, so the
operator can hand it to XCom without unpickling anything. Anything else (a model's state dict,
a numpy array) is sealed as a pickle and stays where it is: the operator returns its URL, and a
downstream task calls ``read_result`` (or the Airflow layer's ``load_result``) with a key that
outlives the run, the ``horovod`` connection's. No Airflow import.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_hvd.runner.common.storage import fs_and_path
from airflow_provider_hvd.runner.errors import PayloadError
from airflow_provider_hvd.runner.wire import payload

# Larger JSON goes the pickle's way (a URL in XCom): XCom rows live in Airflow's database.
JSON_RESULT_MAX_BYTES = 1 << 20


def seal_result(value: Any, key: bytes) -> bytes:
    """The result file's bytes: JSON when the value is JSON and small, else a pickle."""
    try:
        text = json.dumps(value).encode()
    except (TypeError, ValueError):
        text = None
    if text is not None and len(text) <= JSON_RESULT_MAX_BYTES:
        return payload.seal(text, key, payload.KIND_JSON_RESULT)
    return payload.seal(payload.dumps_result(value), key, payload.KIND_RESULT)


def result_kind(header: bytes, key: bytes) -> int:
    """``payload.KIND_JSON_RESULT`` or ``payload.KIND_RESULT``, from a result file's first
    ``payload.HEADER_SIZE`` bytes (its key id checked): how to read it, before reading what may be gigabytes."""
    kind = payload.peek(header, key)
    if kind not in (payload.KIND_JSON_RESULT, payload.KIND_RESULT):
        raise PayloadError(f"expected rank 0's result but got a {payload.kind_name(kind)} envelope")
    return kind


def open_result(sealed: bytes, key: bytes) -> Any:
    """Rank 0's value from a result file's bytes, after its signature is checked with ``key``."""
    if result_kind(sealed[: payload.HEADER_SIZE], key) == payload.KIND_JSON_RESULT:
        return json.loads(bytes(payload.open_sealed(sealed, key, payload.KIND_JSON_RESULT)))
    import cloudpickle

    return cloudpickle.loads(payload.open_sealed(sealed, key, payload.KIND_RESULT))


def read_result(url: str, key: bytes) -> Any:
    """Rank 0's value from its result file at ``url`` (any fsspec URL), verified with ``key``."""
    fs, path = fs_and_path(url)
    with fs.open(path, "rb") as f:
        return open_result(f.read(), key)
