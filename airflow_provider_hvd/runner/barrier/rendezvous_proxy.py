"""Gloo's rendezvous, authenticated: a loopback proxy beside each rank, the store on the driver.

Horovod's gloo ranks find each other through an HTTP key-value store (GET, PUT,
DELETE on ``/scope/key``), and its C++ client sends no credential. Served as
horovod serves it (an HTTP server on the driver, open to the network), anyone
who can reach the port could read the ranks' addresses or plant a fake one.

So the store lives inside the driver service (driver/kv_store.py), reached only
over the run's authenticated channel, and each gloo rank talks HTTP to a
``RendezvousProxy`` that its launcher runs on 127.0.0.1. The proxy forwards
requests over the launcher's own channel and refuses any TCP peer that is not
a process of the same user (the owner of the connecting socket, asked of the
kernel): same-user processes are already inside the trust boundary
(they could read the launcher's memory), other users and other hosts are not.
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import struct
import threading
from typing import Any

from airflow_provider_hvd.runner.wire import channel as channel_mod
from airflow_provider_hvd.runner.wire.messages import Bye, KV_REQUESTS, KvStatus, Op
from airflow_provider_hvd.runner.wire.hellos import KvHello

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def tcp_peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the socket at ``peer`` that is connected to ``local`` (IPv4 loopback); None
    when there is no such socket.

    Asked of the kernel for that one socket (netlink sock_diag, what ``ss`` uses). /proc/net/tcp,
    the fallback where netlink is unavailable, lists every TCP socket of the host, TIME_WAIT ones
    included, and each horovod rendezvous request is a new connection: its cost grows with every
    re-init.
    """
    try:
        return _uid_by_sock_diag(peer, local)
    except OSError:
        return _uid_by_proc_net_tcp(peer, local)


_NETLINK_SOCK_DIAG = 4        # linux/netlink.h
_SOCK_DIAG_BY_FAMILY = 20     # linux/sock_diag.h
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF       # INET_DIAG_NOCOOKIE: look the socket up by its addresses
_UID_OFFSET = 16 + 64         # nlmsghdr, then inet_diag_msg's family..retrans, sockid, expires, rqueue, wqueue


def _uid_by_sock_diag(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    # struct inet_diag_req_v2 asking for the one TCP socket whose own end is `peer`
    sockid = (struct.pack("!HH", peer[1], local[1]) + socket.inet_aton(peer[0]) + bytes(12)
              + socket.inet_aton(local[0]) + bytes(12) + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))
    request = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + sockid
    header = struct.pack("=LHHLL", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(header + request)
        reply = nl.recv(8192)
    if len(reply) < 18:
        raise OSError("sock_diag: short reply")
    if struct.unpack_from("=H", reply, 4)[0] == _NLMSG_ERROR:
        errno = -struct.unpack_from("=i", reply, 16)[0]
        if errno == 2:  # ENOENT: no such socket
            return None
        raise OSError(errno, "sock_diag refused the look-up")
    return struct.unpack_from("=I", reply, _UID_OFFSET)[0]


def _uid_by_proc_net_tcp(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    def hex_addr(addr: tuple[str, int]) -> str:
        packed = socket.inet_aton(addr[0])
        return f"{int.from_bytes(packed, 'little'):08X}:{addr[1]:04X}"

    want_local, want_remote = hex_addr(peer), hex_addr(local)
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1] == want_local and fields[2] == want_remote:
                    return int(fields[7])
    except OSError:
        return None
    return None


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, proxy: RendezvousProxy):
        self.proxy = proxy
        super().__init__((LOOPBACK, 0), _ProxyHandler)

    def verify_request(self, request, client_address) -> bool:
        uid = tcp_peer_uid(client_address, self.server_address)
        if uid == os.getuid():
            return True
        self.proxy.refused += 1
        log.warning("rendezvous proxy: refused a connection from %s:%s owned by uid %s (this run is uid %s)",
                    client_address[0], client_address[1], uid, os.getuid())
        return False


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: _ProxyServer

    def _scope_key(self) -> tuple[str, str] | None:
        parts = self.path.split("/")
        return (parts[1], parts[2]) if len(parts) == 3 else None

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _forward(self, op: str, body: bytes | None = None) -> None:
        scope_key = self._scope_key()
        if scope_key is None:
            self._reply(400)
            return
        try:
            status, value = self.server.proxy.request(op, *scope_key, body)
        except OSError:
            self._reply(503)  # the driver is gone: the run is over
            return
        self._reply(status, value or b"")

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._forward(Op.KV_GET)

    def do_PUT(self) -> None:  # noqa: N802
        self._forward(Op.KV_PUT, self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def do_DELETE(self) -> None:  # noqa: N802
        self._forward(Op.KV_DELETE)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per request would drown the rank's own output


class RendezvousProxy:
    """Loopback HTTP endpoint for one gloo rank; requests go to the driver's store over the run's channel."""

    def __init__(self, driver: tuple[str, int], secret: bytes, rank: int):
        self._channel = channel_mod.connect(driver, secret, KvHello(rank=rank))
        self._lock = threading.Lock()
        self.refused = 0
        self._server = _ProxyServer(self)
        self.address: tuple[str, int] = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"hvd-rendezvous-proxy-{rank}", daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address[0],
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.address[1])}

    def request(self, op: str, scope: str, key: str, body: bytes | None) -> tuple[int, bytes | None]:
        with self._lock:
            self._channel.send_message(KV_REQUESTS[Op(op)](scope=scope, key=key), body)
            reply = KvStatus.from_wire(self._channel.recv_json())
            value = self._channel.recv_bytes() if op == Op.KV_GET and reply.status == 200 else None
            return reply.status, value

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        with self._lock:
            try:
                self._channel.send_message(Bye())
            except OSError:
                pass
            self._channel.close()
