"""Signed envelopes for what crosses process boundaries as a pickle.

A rank executes the pickle it is sent, and the driver unpickles rank 0's result,
so both are wrapped in an envelope that is checked *before* anything is
unpickled: magic, format version, kind (call or result), the Python that made it,
a fingerprint of the signing key, the body length and an HMAC-SHA256 over all of
it. Each refusal says which check failed (truncated, tampered, another key,
incompatible version), since each has a different fix.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import os
import secrets
import struct
import sys
import sysconfig
import types
from typing import Any, Callable

import cloudpickle

from airflow_provider_hvd.runner.errors import PayloadError, SerializationError

MAGIC = b"HVDRUN"
FORMAT_VERSION = 1
KIND_CALL = 1
KIND_RESULT = 2
# Rank 0's value as JSON (the Spark application's result file when the value is JSON): read
# without unpickling anything.
KIND_JSON_RESULT = 3
_KIND_NAMES = {KIND_CALL: "payload", KIND_RESULT: "result", KIND_JSON_RESULT: "JSON result"}
# magic, format version, kind, python major, python minor, key fingerprint, body length
_HEADER = struct.Struct(">6sBBBB8sQ")
_MAC_SIZE = 32
SECRET_SIZE = 32
# What ``peek`` needs of an envelope.
HEADER_SIZE = _HEADER.size


def new_secret() -> bytes:
    """A fresh per-run key: signs the payload and the result and authenticates every connection."""
    return secrets.token_bytes(SECRET_SIZE)


def key_fingerprint(key: bytes) -> bytes:
    """Names a key without revealing it, so 'signed with another key' can be told from 'tampered'."""
    return hashlib.sha256(b"airflow-provider-hvd key id\0" + key).digest()[:8]


def seal(body: bytes, key: bytes, kind: int) -> bytes:
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, kind, sys.version_info[0], sys.version_info[1],
                          key_fingerprint(key), len(body))
    mac = hmac.new(key, header, hashlib.sha256)
    mac.update(body)  # no header + body copy: bodies run to gigabytes
    return b"".join((header, mac.digest(), body))


def kind_name(kind: int) -> str:
    return _KIND_NAMES.get(kind, f"kind {kind}")


def peek(header: bytes, key: bytes) -> int:
    """The kind of the envelope that starts with ``header`` (its first HEADER_SIZE bytes), once
    its magic, format and key id check out: for deciding how to read a large file before reading it.
    Its signature is checked by ``open_sealed``, when the whole is read."""
    what = "file"
    if len(header) < _HEADER.size:
        raise PayloadError(f"the {what} is not a HorovodRunner envelope ({len(header)} bytes, shorter than "
                           "its header). Was the wrong file passed, or was it cut off?")
    magic, version, kind, _, _, fingerprint, _ = _HEADER.unpack_from(header)
    if magic != MAGIC:
        raise PayloadError(f"the {what} is not a HorovodRunner envelope (bad magic). Was the wrong file passed?")
    if version != FORMAT_VERSION:
        raise PayloadError(f"the {what} has envelope format {version}, this airflow-provider-hvd reads "
                           f"format {FORMAT_VERSION}: it comes from an incompatible version.")
    if not hmac.compare_digest(fingerprint, key_fingerprint(key)):
        raise PayloadError(f"the {_KIND_NAMES.get(kind, what)} was signed with another key (key id "
                           f"{fingerprint.hex()}, expected {key_fingerprint(key).hex()}). It comes from another "
                           "run or another deployment; refusing to read it.")
    return kind


def open_sealed(blob: bytes | bytearray | memoryview, key: bytes, kind: int) -> memoryview:
    """Return the body of an envelope after every check passes; raise PayloadError naming the failed one.

    The body is a view into ``blob``, not a copy (pickle.loads takes it as it is):
    a payload of a gigabyte should not cost two."""
    what = _KIND_NAMES[kind]
    blob = memoryview(blob)
    if len(blob) < _HEADER.size + _MAC_SIZE:
        if bytes(blob[: len(MAGIC)]) == MAGIC[: len(blob)]:
            raise PayloadError(f"the {what} is truncated: {len(blob)} bytes, shorter than its header. "
                               "It was cut off in transfer or storage; write it again.")
        raise PayloadError(f"the {what} is not a HorovodRunner envelope (no header). Was the wrong file passed?")
    magic, version, got_kind, py_major, py_minor, fingerprint, length = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise PayloadError(f"the {what} is not a HorovodRunner envelope (bad magic). Was the wrong file passed?")
    if version != FORMAT_VERSION:
        raise PayloadError(f"the {what} has envelope format {version}, this airflow-provider-hvd reads "
                           f"format {FORMAT_VERSION}: it comes from an incompatible version. Install the same "
                           "airflow-provider-hvd version on the driver and every worker.")
    if got_kind != kind:
        raise PayloadError(f"expected a {what} but got a {_KIND_NAMES.get(got_kind, f'kind {got_kind}')} envelope")
    start = _HEADER.size + _MAC_SIZE
    if len(blob) - start < length:
        raise PayloadError(f"the {what} is truncated: {len(blob) - start} of {length} body bytes. "
                           "It was cut off in transfer or storage; write it again.")
    if len(blob) - start > length:
        raise PayloadError(f"the {what} has {len(blob) - start - length} bytes after its body: it was altered.")
    if not hmac.compare_digest(fingerprint, key_fingerprint(key)):
        raise PayloadError(f"the {what} was signed with another key (key id {fingerprint.hex()}, expected "
                           f"{key_fingerprint(key).hex()}). It comes from another run or another deployment; "
                           "refusing to unpickle it.")
    mac = hmac.new(key, blob[: _HEADER.size], hashlib.sha256)
    mac.update(blob[start:])
    if not hmac.compare_digest(mac.digest(), bytes(blob[_HEADER.size:start])):
        raise PayloadError(f"the {what}'s signature does not match: it was tampered with or corrupted. "
                           "Refusing to unpickle it.")
    if (py_major, py_minor) != sys.version_info[:2]:
        raise PayloadError(f"the {what} was pickled by Python {py_major}.{py_minor}, this process runs "
                           f"Python {sys.version_info[0]}.{sys.version_info[1]}: pickles of functions do not "
                           "cross Python versions. Use the same Python on the driver and every worker.")
    return blob[start:]


def _is_user_module(module: types.ModuleType) -> bool:
    """A module of the user's own (a DAG file, a helper beside it, a script's sibling), which the
    ranks' interpreters cannot import by name; installed packages and the stdlib can be."""
    if module.__name__ == "__main__":
        return False  # cloudpickle already pickles __main__ by value
    file = getattr(module, "__file__", None)
    if not file:
        return False
    file = os.path.realpath(file)
    if "site-packages" in file or "dist-packages" in file:
        return False
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    return not file.startswith(stdlib + os.sep)


def dumps_call(main: Callable[..., Any], kwargs: dict[str, Any]) -> bytes:
    """cloudpickle ``(main, kwargs)``; on failure, name the argument or captured variable at fault.

    The module that defines ``main`` is pickled by value when it is the user's own
    code rather than an installed package, so that ranks on other hosts (which
    have the same packages but not the user's files) can load it.
    """
    module = sys.modules.get(getattr(main, "__module__", None) or "")
    by_value = (module is not None and _is_user_module(module)
                and module.__name__ not in cloudpickle.list_registry_pickle_by_value())
    if by_value:
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:  # already registered, or not importable under its name
            by_value = False
    try:
        return cloudpickle.dumps((main, kwargs))
    except Exception as exc:  # cloudpickle raises TypeError, PicklingError, RuntimeError (SparkContext) ...
        culprits = _unpicklable_parts(main, kwargs)
        where = "; ".join(culprits) if culprits else f"{getattr(main, '__name__', main)!r} or its arguments"
        raise SerializationError(
            f"cannot serialise the training call: {where}. {type(exc).__name__}: {exc}. "
            "Everything main captures and every keyword argument is pickled and sent to the ranks: "
            "create locks, sockets, open files and SparkContext/SparkSession objects inside the function "
            "instead of capturing them.") from exc
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def dumps_result(value: Any) -> bytes:
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:
        raise SerializationError(
            f"rank 0's return value ({type(value).__name__}) cannot be pickled: {type(exc).__name__}: {exc}. "
            "Return plain data (numbers, dicts, numpy arrays, tensors) or save the object and return its path."
        ) from exc


def _unpicklable_parts(main: Callable[..., Any], kwargs: dict[str, Any]) -> list[str]:
    parts: list[str] = []
    for name, value in kwargs.items():
        if not _picklable(value):
            parts.append(f"keyword argument {name!r} ({type(value).__module__}.{type(value).__qualname__})")
    try:
        captured = inspect.getclosurevars(main)
        variables = {**captured.nonlocals, **captured.globals}
    except (TypeError, ValueError):
        variables = {}
    for name, value in variables.items():
        if inspect.ismodule(value):
            continue
        if not _picklable(value):
            parts.append(f"variable {name!r} captured by {getattr(main, '__name__', 'main')} "
                         f"({type(value).__module__}.{type(value).__qualname__})")
    return parts


def _picklable(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
        return True
    except Exception:
        return False
