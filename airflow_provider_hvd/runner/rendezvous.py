"""Gloo's rendezvous: horovod's own HTTP key-value server, one per run, on the driver."""

from __future__ import annotations

import threading

from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

# socketserver checks for shutdown() every poll interval; horovod's RendezvousServer
# keeps the default 0.5 s, which every run paid at its end.
_POLL_S = 0.05


class Rendezvous:
    def __init__(self) -> None:
        # Port 0: the kernel picks a free port (horovod probes random ones).
        self._httpd = RendezvousHTTPServer(("", 0), RendezvousHandler, 0)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": _POLL_S},
                                        name="hvd-rendezvous", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()  # shutdown() alone leaves the listening socket open
        self._thread.join(5)
