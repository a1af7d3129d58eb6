"""Authenticated, framed TCP between the driver and the processes of a run.

Every connection starts with a challenge: the server sends a random nonce, the
client answers with HMAC-SHA256(run secret, nonce). A peer without the run's
secret is refused and logged before it can send a single message, so nobody
else on the network can fetch the payload, inject a log line or fake a result.

After that, both sides exchange frames: one type byte (``J`` for a JSON message,
``B`` for raw bytes), an 8-byte length, the body. Sends are serialised by a lock
so that several threads of a process can share one channel.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">cQ")
_NONCE_SIZE = 32
_AUTH_CONTEXT = b"airflow-provider-hvd channel v1\0"
AUTH_TIMEOUT_S = 10.0


class ChannelClosed(ConnectionError):
    """The peer closed the connection."""


class AuthenticationError(ConnectionError):
    """The peer does not hold the run's secret."""


def _answer(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, _AUTH_CONTEXT + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly n bytes, into one buffer that is returned as it is (a copy would double a
    gigabyte-sized payload or result)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if k == 0:
            raise ChannelClosed("connection closed by peer")
        got += k
    return buf


class Channel:
    """One authenticated connection. ``send_*`` are thread-safe; one thread should ``recv``."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock = sock
        self.peer = peer
        self._send_lock = threading.Lock()

    def send_json(self, message: dict[str, Any]) -> None:
        self._send(b"J", json.dumps(message).encode())

    def send_bytes(self, data: bytes) -> None:
        self._send(b"B", data)

    def send_json_with_bytes(self, message: dict[str, Any], data: bytes) -> None:
        """A message and its blob, with no other sender's frame in between."""
        body = json.dumps(message).encode()
        with self._send_lock:
            self.sock.sendall(_FRAME.pack(b"J", len(body)) + body)
            self.sock.sendall(_FRAME.pack(b"B", len(data)))
            self.sock.sendall(data)

    def _send(self, kind: bytes, body: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(_FRAME.pack(kind, len(body)) + body if len(body) < (1 << 16)
                              else _FRAME.pack(kind, len(body)))
            if len(body) >= (1 << 16):
                self.sock.sendall(body)

    def recv(self) -> tuple[str, Any]:
        """Return ('json', dict) or ('bytes', bytes); raise ChannelClosed at the end."""
        kind, length = _FRAME.unpack(_recv_exact(self.sock, _FRAME.size))
        body = _recv_exact(self.sock, length)
        if kind == b"J":
            return "json", json.loads(body)
        if kind == b"B":
            return "bytes", body
        raise ConnectionError(f"bad frame type {kind!r} from {self.peer}")

    def recv_json(self) -> dict[str, Any]:
        kind, value = self.recv()
        if kind != "json":
            raise ConnectionError(f"expected a message from {self.peer}, got {kind}")
        return value

    def recv_bytes(self) -> bytearray:
        kind, value = self.recv()
        if kind != "bytes":
            raise ConnectionError(f"expected bytes from {self.peer}, got {kind}: {value!r:.200}")
        return value

    def read_until(self, op: str | None = None) -> bool:
        """Read and drop frames until a message with ``op`` arrives (True) or the channel ends
        (False); with ``op=None``, until it ends. The one loop behind "wait until the driver
        says stop, or is gone" in every process."""
        try:
            while True:
                kind, message = self.recv()
                if op is not None and kind == "json" and message.get("op") == op:
                    return True
        except Exception:  # closed, reset, or garbage: the peer is gone either way
            return False

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect(address: tuple[str, int], secret: bytes, hello: dict[str, Any],
            timeout: float = 30.0) -> Channel:
    """Connect, prove we hold ``secret``, send ``hello``; return the channel (blocking mode)."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = _recv_exact(sock, _NONCE_SIZE)
        sock.sendall(_answer(secret, nonce))
        channel = Channel(sock, f"{address[0]}:{address[1]}")
        channel.send_json(hello)
        reply = channel.recv_json()
        if not reply.get("ok"):
            raise AuthenticationError(f"driver at {address[0]}:{address[1]} refused us: {reply.get('error')}")
        sock.settimeout(None)
        return channel
    except (ChannelClosed, ConnectionResetError, BrokenPipeError) as exc:
        sock.close()
        raise AuthenticationError(f"driver at {address[0]}:{address[1]} closed the connection during "
                                  "authentication: the run's secret did not match") from exc
    except BaseException:
        sock.close()
        raise


class ChannelServer:
    """Accepts authenticated channels and hands each, with its hello, to ``handler`` in its own thread."""

    def __init__(self, secret: bytes, handler: Callable[[Channel, dict[str, Any]], None],
                 host: str = "0.0.0.0", name: str = "hvd-driver-service"):
        self._secret = secret
        self._handler = handler
        self._name = name
        self._sock = socket.create_server((host, 0), backlog=128)
        self.port: int = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._channels: set[Channel] = set()
        self._lock = threading.Lock()
        self.refused = 0
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, addr = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock, addr), name=f"{self._name}-conn",
                             daemon=True).start()

    def _serve(self, sock: socket.socket, addr: tuple) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        try:
            sock.settimeout(AUTH_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.urandom(_NONCE_SIZE)
            sock.sendall(nonce)
            answer = _recv_exact(sock, 32)
            if not hmac.compare_digest(answer, _answer(self._secret, nonce)):
                self.refused += 1
                log.warning("%s: refused a connection from %s: it does not hold this run's secret",
                            self._name, peer)
                sock.close()
                return
            channel = Channel(sock, peer)
            hello = channel.recv_json()
            sock.settimeout(None)
            channel.send_json({"ok": True})
        except (OSError, ValueError) as exc:
            log.warning("%s: dropped a connection from %s during authentication: %s", self._name, peer, exc)
            sock.close()
            return
        with self._lock:
            if self._closed.is_set():
                channel.close()
                return
            self._channels.add(channel)
        try:
            self._handler(channel, hello)
        finally:
            with self._lock:
                self._channels.discard(channel)
            channel.close()

    def close(self) -> None:
        """Stop accepting and close every open channel: peers see end-of-stream at once."""
        self._closed.set()
        try:
            # shutdown() wakes the thread blocked in accept(); close() alone does not on Linux.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            channels = list(self._channels)
        for channel in channels:
            channel.close()
