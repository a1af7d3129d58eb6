"""A TCP forwarder from this machine's loopback into one host's namespace: how a browser (or
Airflow's REST client) on this machine reaches the Airflow api-server, as compose's published
port does. Nothing else crosses: the hosts have no route to this machine.

    python -m localcluster.forward <listen port> <netns path> <host> <port>

It binds 127.0.0.1:<listen port> first, in the machine's namespace, then joins the host's network
namespace (setns), where every socket it opens from then on lives; the listening one stays where
it was made.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def _join(netns_path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns_path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns_path}")
    finally:
        os.close(fd)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select():
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        pass
    finally:
        a.close()
        b.close()


def main(listen_port: int, netns_path: str, host: str, port: int) -> None:
    server = socket.create_server(("127.0.0.1", listen_port))
    _join(netns_path)  # the process's threads made from here on open sockets in the host's network
    print(f"forwarding 127.0.0.1:{listen_port} -> {host}:{port}", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((host, port), timeout=10)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]))
