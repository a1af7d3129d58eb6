"""Gloo's rendezvous store, on the driver: horovod's key-value semantics behind the run's channel.

Horovod's gloo ranks find each other through an HTTP key-value store, and its C++ client
sends no credential. So the store lives here, inside the driver service, reached only over
the run's authenticated channel: each gloo rank talks HTTP to a loopback proxy that its
launcher runs (barrier/rendezvous_proxy.py), which forwards every request here.
"""

from __future__ import annotations

import threading

from airflow_provider_hvd.runner.wire import channel as channel_mod
from airflow_provider_hvd.runner.wire.messages import Bye, KvDelete, KvGet, KvPut, KvStatus


class KeyValueStore:
    """Horovod's rendezvous semantics (horovod.runner.http.http_server.RendezvousHandler, ad-hoc scopes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes: dict[str, dict[str, bytes]] = {}

    def get(self, scope: str, key: str) -> bytes | None:
        with self._lock:
            return self._scopes.get(scope, {}).get(key)

    def put(self, scope: str, key: str, value: bytes) -> None:
        with self._lock:
            self._scopes.setdefault(scope, {})[key] = bytes(value)

    def delete(self, scope: str, key: str) -> None:
        with self._lock:
            values = self._scopes.get(scope)
            if values is not None:
                values.pop(key, None)
                if not values:
                    del self._scopes[scope]

    def serve(self, channel: channel_mod.Channel) -> None:
        """Answer one proxy's requests until it leaves (runs in the driver service's connection thread)."""
        while True:
            request = channel.recv_message()
            if isinstance(request, KvGet):
                value = self.get(request.scope, request.key)
                if value is None:
                    channel.send_json(KvStatus(404).to_wire())
                else:
                    channel.send_json_with_bytes(KvStatus(200).to_wire(), value)
            elif isinstance(request, KvPut):
                self.put(request.scope, request.key, channel.recv_bytes())
                channel.send_json(KvStatus(200).to_wire())
            elif isinstance(request, KvDelete):
                self.delete(request.scope, request.key)
                channel.send_json(KvStatus(200).to_wire())
            elif isinstance(request, Bye):
                return
            else:
                channel.send_json(KvStatus(400).to_wire())
