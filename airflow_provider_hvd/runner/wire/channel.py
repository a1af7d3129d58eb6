"""Authenticated, encrypted, framed TCP between the driver and the processes of a run.

Every connection starts with a handshake on the run's secret (32 random bytes that
only the driver and the processes it started hold): the server sends a nonce, the
client answers with its own nonce and HMAC-SHA256(secret, both nonces). A peer
without the secret is refused and logged before it can send a single message, so
nobody else on the network can fetch the payload, inject a log line or fake a result.

Both sides then derive this connection's keys from the secret and both nonces
(HKDF-SHA256), one per direction, and every frame travels sealed with AES-256-GCM
(the ``cryptography`` package, i.e. OpenSSL), its nonce a per-direction counter: what
crosses the network (the payload, which may capture credentials, the result, logs)
is unreadable, and a frame altered, dropped, replayed or reordered fails the
connection. The server's first reply is sealed too, so the client knows it reached a
holder of the secret (mutual authentication). This is TLS with a pre-shared key in
effect: Python's ``ssl`` has no PSK before 3.13, and certificates would only have
to be pinned through that same secret.

A frame is a sealed 9-byte header (one type byte, ``J`` for a JSON message, ``B``
for raw bytes, and an 8-byte length) followed by the body sealed in chunks of at
most 4 MiB, so a gigabyte-sized payload is never held twice. Sends are serialised
by a lock so that several threads of a process can share one channel.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import struct
import threading
from typing import Any, Callable

from airflow_provider_hvd.runner.wire.messages import Message, parse
from airflow_provider_hvd.runner.wire.sealing import CHUNK, NONCE_SIZE, TAG, Sealer, answer, session_keys
from airflow_provider_hvd.runner.wire.hellos import Hello
from airflow_provider_hvd.runner.wire.keepalive import CLIENT_KEEPALIVE, SERVER_KEEPALIVE, tune

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">cQ")
AUTH_TIMEOUT_S = 10.0
class ChannelClosed(ConnectionError):
    """The peer closed the connection."""


class AuthenticationError(ConnectionError):
    """The peer does not hold the run's secret."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly n bytes, into one buffer that is returned as it is."""
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
    """One authenticated, encrypted connection. ``send_*`` are thread-safe; one thread should ``recv``."""

    def __init__(self, sock: socket.socket, peer: str, send_key: bytes, recv_key: bytes):
        self.sock = sock
        self.peer = peer
        self._send_lock = threading.Lock()
        self._sealer = Sealer(send_key)
        self._opener = Sealer(recv_key)
        self.ended_by: BaseException | None = None  # set by read_until when the channel failed

    def send_json(self, message: dict[str, Any]) -> None:
        self._send(b"J", json.dumps(message).encode())

    def send_message(self, message: Message, data: bytes | None = None) -> None:
        """A declared message, and the bytes frame that follows the ops that carry one."""
        if data is None:
            self.send_json(message.to_wire())
        else:
            self.send_json_with_bytes(message.to_wire(), data)

    def recv_message(self) -> Message:
        """The next message, parsed into its declared type (a ValueError for an op nobody declared)."""
        return parse(self.recv_json())

    def send_bytes(self, data: bytes) -> None:
        self._send(b"B", data)

    def send_json_with_bytes(self, message: dict[str, Any], data: bytes) -> None:
        """A message and its blob, with no other sender's frame in between."""
        with self._send_lock:
            self._send_locked(b"J", json.dumps(message).encode())
            self._send_locked(b"B", data)

    def _send(self, kind: bytes, body: bytes) -> None:
        with self._send_lock:
            self._send_locked(kind, body)

    def _send_locked(self, kind: bytes, body: bytes) -> None:
        header = self._sealer.seal(_FRAME.pack(kind, len(body)))
        if len(body) <= CHUNK:
            self.sock.sendall(header + self._sealer.seal(body))
            return
        self.sock.sendall(header)
        view = memoryview(body)
        for start in range(0, len(body), CHUNK):
            self.sock.sendall(self._sealer.seal(view[start:start + CHUNK]))

    def recv(self) -> tuple[str, Any]:
        """Return ('json', dict) or ('bytes', bytearray); raise ChannelClosed at the end."""
        header = self._opener.open(_recv_exact(self.sock, _FRAME.size + TAG))
        kind, length = _FRAME.unpack(header)
        if kind not in (b"J", b"B"):
            raise ConnectionError(f"bad frame type {kind!r} from {self.peer}")
        if length <= CHUNK:
            body = bytearray(self._opener.open(_recv_exact(self.sock, length + TAG)))
        else:
            body = bytearray(length)
            for start in range(0, length, CHUNK):
                n = min(CHUNK, length - start)
                body[start:start + n] = self._opener.open(_recv_exact(self.sock, n + TAG))
        if kind == b"J":
            return "json", json.loads(body)
        return "bytes", body

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
        says stop, or is gone" in every process. ``ended_by``: why it ended, when it did."""
        try:
            while True:
                kind, message = self.recv()
                if op is not None and kind == "json" and message.get("op") == op:
                    return True
        except Exception as exc:  # closed, reset, timed out or garbage: the peer is gone either way
            self.ended_by = exc
            return False

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect(address: tuple[str, int], secret: bytes, hello: Hello | dict[str, Any],
            timeout: float = 30.0) -> Channel:
    """Connect, prove we hold ``secret``, send ``hello``; return the channel (blocking mode)
    once the server's sealed reply proved it holds the secret too."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        tune(sock, CLIENT_KEEPALIVE)
        server_nonce = bytes(_recv_exact(sock, NONCE_SIZE))
        client_nonce = os.urandom(NONCE_SIZE)
        sock.sendall(client_nonce + answer(secret, server_nonce, client_nonce))
        to_server, to_client = session_keys(secret, server_nonce, client_nonce)
        channel = Channel(sock, f"{address[0]}:{address[1]}", send_key=to_server, recv_key=to_client)
        channel.send_json(hello.to_wire() if isinstance(hello, Hello) else hello)
        try:
            reply = channel.recv_json()
        except ChannelClosed:
            raise
        except ConnectionError as exc:
            raise AuthenticationError(f"the server at {address[0]}:{address[1]} does not hold the run's secret: "
                                      f"{exc}") from None
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
            tune(sock, SERVER_KEEPALIVE)
            server_nonce = os.urandom(NONCE_SIZE)
            sock.sendall(server_nonce)
            reply = _recv_exact(sock, NONCE_SIZE + 32)
            client_nonce, said = bytes(reply[:NONCE_SIZE]), bytes(reply[NONCE_SIZE:])
            if not hmac.compare_digest(said, answer(self._secret, server_nonce, client_nonce)):
                self.refused += 1
                log.warning("%s: refused a connection from %s: it does not hold this run's secret",
                            self._name, peer)
                sock.close()
                return
            to_server, to_client = session_keys(self._secret, server_nonce, client_nonce)
            channel = Channel(sock, peer, send_key=to_client, recv_key=to_server)
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
