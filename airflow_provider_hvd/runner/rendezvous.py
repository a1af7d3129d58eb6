"""Gloo's rendezvous: horovod's own HTTP key-value server, one per run, on the driver."""

from __future__ import annotations

from horovod.runner.http.http_server import RendezvousServer


class Rendezvous:
    def __init__(self) -> None:
        self._server = RendezvousServer(verbose=0)
        self.port: int = self._server.start()

    def stop(self) -> None:
        self._server.stop()
        self._server._httpd.server_close()  # shutdown() alone leaves the listening socket open
