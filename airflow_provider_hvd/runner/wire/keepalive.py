"""How a run's connections notice a peer whose host went silent: TCP keepalive on every channel."""

from __future__ import annotations

import errno
import socket

# A peer whose host vanishes (its network cut, the machine powered off) sends no FIN or RST:
# without keepalive, a side waiting to read would wait for ever. With it, an idle connection to a
# silent host fails with ETIMEDOUT about idle + interval * probes seconds after the host went
# quiet; a live peer's kernel answers the probes, however busy the process is. The server side
# (the driver, which names what failed) gives up first (~3 s against ~5 s): otherwise mpirun's
# account of the daemon it lost on that host could arrive first and read as an Open MPI crash.
CLIENT_KEEPALIVE = (2, 1, 3)  # idle s, interval s, probes
SERVER_KEEPALIVE = (1, 1, 2)


def tune(sock: socket.socket, keepalive: tuple[int, int, int]) -> None:
    idle, interval, probes = keepalive
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)


def is_unreachable(exc: BaseException) -> bool:
    """The connection failed because the peer's host stopped answering (keepalive or
    retransmissions timed out, no route), not because the peer closed or reset it."""
    return isinstance(exc, OSError) and exc.errno in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH)
