"""The signed envelope: nothing is unpickled unless magic, version, key and signature all check out."""

import struct
import sys
import threading

import pytest

from airflow_provider_hvd.runner.wire import payload
from airflow_provider_hvd.runner.errors import PayloadError, SerializationError


@pytest.fixture
def key():
    return payload.new_secret()


def test_round_trip(key):
    body = payload.dumps_call(lambda a, b=2: a + b, {"a": 40})
    fn, kwargs = __import__("cloudpickle").loads(payload.open_sealed(payload.seal(body, key, payload.KIND_CALL),
                                                                     key, payload.KIND_CALL))
    assert fn(**kwargs) == 42


def test_truncated_is_refused_with_byte_counts(key):
    blob = payload.seal(b"x" * 1000, key, payload.KIND_CALL)
    with pytest.raises(PayloadError, match=r"truncated: 500 of 1000 body bytes"):
        payload.open_sealed(blob[:-500], key, payload.KIND_CALL)
    with pytest.raises(PayloadError, match="truncated"):
        payload.open_sealed(blob[:10], key, payload.KIND_CALL)


def test_tampered_body_is_refused(key):
    blob = bytearray(payload.seal(b"hello world", key, payload.KIND_CALL))
    blob[-1] ^= 1
    with pytest.raises(PayloadError, match="tampered"):
        payload.open_sealed(bytes(blob), key, payload.KIND_CALL)


def test_other_key_is_named_as_such(key):
    blob = payload.seal(b"hello", payload.new_secret(), payload.KIND_CALL)
    with pytest.raises(PayloadError, match="signed with another key"):
        payload.open_sealed(blob, key, payload.KIND_CALL)


def test_incompatible_format_version(key):
    blob = bytearray(payload.seal(b"hello", key, payload.KIND_CALL))
    blob[6] = payload.FORMAT_VERSION + 1
    with pytest.raises(PayloadError, match="incompatible version"):
        payload.open_sealed(bytes(blob), key, payload.KIND_CALL)


def test_other_python_is_refused_even_when_correctly_signed(key):
    body = b"pickled elsewhere"
    header = struct.pack(">6sBBBB8sQ", payload.MAGIC, payload.FORMAT_VERSION, payload.KIND_CALL,
                         sys.version_info[0], sys.version_info[1] + 1, payload.key_fingerprint(key), len(body))
    import hashlib
    import hmac
    blob = header + hmac.new(key, header + body, hashlib.sha256).digest() + body
    with pytest.raises(PayloadError, match=r"pickled by Python 3\.\d+"):
        payload.open_sealed(blob, key, payload.KIND_CALL)


def test_result_is_not_accepted_as_payload(key):
    blob = payload.seal(b"x", key, payload.KIND_RESULT)
    with pytest.raises(PayloadError, match="expected a payload but got a result"):
        payload.open_sealed(blob, key, payload.KIND_CALL)


def test_not_an_envelope(key):
    with pytest.raises(PayloadError, match="not a HorovodRunner envelope"):
        payload.open_sealed(b"PK\x03\x04" + b"\0" * 100, key, payload.KIND_CALL)


def test_unpicklable_kwarg_and_captured_variable_are_named():
    lock = threading.Lock()
    with pytest.raises(SerializationError, match=r"keyword argument 'guard' \(_thread\.lock\)"):
        payload.dumps_call(lambda guard: None, {"guard": lock})

    def uses_lock():
        return lock.locked()

    with pytest.raises(SerializationError, match=r"variable 'lock' captured by uses_lock"):
        payload.dumps_call(uses_lock, {})
