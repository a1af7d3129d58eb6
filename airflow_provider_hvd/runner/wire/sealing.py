"""The channel's cryptography: the handshake's answer, each connection's keys, and AES-256-GCM in
one direction with a counter nonce (wire/channel.py says how a connection uses them)."""

from __future__ import annotations

import hashlib
import hmac

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

NONCE_SIZE = 32
TAG = 16  # AES-GCM's authentication tag
CHUNK = 4 << 20  # plaintext bytes per sealed chunk
_AUTH_CONTEXT = b"airflow-provider-hvd channel v2\0"


def answer(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, _AUTH_CONTEXT + server_nonce + client_nonce, hashlib.sha256).digest()


def session_keys(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> tuple[bytes, bytes]:
    """(client -> server key, server -> client key) for one connection."""
    keys = HKDF(algorithm=hashes.SHA256(), length=64, salt=server_nonce + client_nonce,
                info=_AUTH_CONTEXT + b"session keys").derive(secret)
    return keys[:32], keys[32:]


class Sealer:
    """AES-256-GCM in one direction of one connection: the nonce is a counter, never reused."""

    def __init__(self, key: bytes):
        self._aead = AESGCM(key)
        self._counter = 0

    def _nonce(self) -> bytes:
        nonce = self._counter.to_bytes(12, "big")
        self._counter += 1
        return nonce

    def seal(self, data: bytes | memoryview) -> bytes:
        return self._aead.encrypt(self._nonce(), data, None)

    def open(self, sealed: bytes | bytearray) -> bytes:
        try:
            return self._aead.decrypt(self._nonce(), sealed, None)
        except InvalidTag:
            raise ConnectionError("a frame failed its integrity check (altered, replayed or out of order)") from None
