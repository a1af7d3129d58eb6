"""What encrypting the runner's channels costs (runner/wire/channel.py), measured in the same run as
the end-to-end rows it is compared with.

The baseline is the same bytes over a plain TCP connection on loopback (what the channel sent
before it sealed its frames: a header and the body, sendall / recv_into), so the difference is the
sealing alone: HKDF and the handshake's extra nonce per connection, AES-256-GCM per frame.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from measure import stats

from airflow_provider_hvd.runner.wire.channel import _recv_exact  # the channel's own reader, for both sides

GIB = 1 << 30


def _plain_pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, server


def plain_transfer(blob: bytes) -> float:
    client, server = _plain_pair()
    try:
        def send():
            client.sendall(b"B" + len(blob).to_bytes(8, "big"))
            client.sendall(blob)

        t0 = time.perf_counter()
        sender = threading.Thread(target=send)
        sender.start()
        length = int.from_bytes(_recv_exact(server, 9)[1:], "big")
        _recv_exact(server, length)
        sender.join()
        return time.perf_counter() - t0
    finally:
        client.close()
        server.close()


def sealed_transfer(blob: bytes) -> float:
    from airflow_provider_hvd.runner.wire import channel

    secret = os.urandom(32)
    done = threading.Event()

    def handler(ch, hello):
        ch.recv_bytes()
        done.set()

    server = channel.ChannelServer(secret, handler, host="127.0.0.1", name="bench")
    try:
        client = channel.connect(("127.0.0.1", server.port), secret, {"role": "bench"})
        t0 = time.perf_counter()
        client.send_bytes(blob)
        done.wait()
        elapsed = time.perf_counter() - t0
        client.close()
        return elapsed
    finally:
        server.close()


def plain_handshake() -> float:
    """A connection, a 32-byte nonce and a 32-byte answer, a hello and its reply: the old protocol's steps."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        def serve():
            conn, _ = listener.accept()
            conn.sendall(os.urandom(32))
            _recv_exact(conn, 32 + 40)
            conn.sendall(b"x" * 20)
            conn.close()

        thread = threading.Thread(target=serve)
        thread.start()
        t0 = time.perf_counter()
        client = socket.create_connection(listener.getsockname())
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _recv_exact(client, 32)
        client.sendall(os.urandom(32))
        client.sendall(b"h" * 40)
        _recv_exact(client, 20)
        elapsed = time.perf_counter() - t0
        client.close()
        thread.join()
        return elapsed
    finally:
        listener.close()


def sealed_handshake(server, secret) -> float:
    from airflow_provider_hvd.runner.wire import channel

    t0 = time.perf_counter()
    client = channel.connect(("127.0.0.1", server.port), secret, {"role": "bench"})
    elapsed = time.perf_counter() - t0
    client.close()
    return elapsed


def encryption_cost(reps: int) -> dict:
    from airflow_provider_hvd.runner.wire import channel

    blob = os.urandom(GIB)
    transfer = {"plain": [], "sealed": []}
    for _ in range(reps):  # interleaved
        transfer["plain"].append(plain_transfer(blob))
        transfer["sealed"].append(sealed_transfer(blob))
    del blob
    secret = os.urandom(32)
    server = channel.ChannelServer(secret, lambda ch, hello: ch.read_until(), host="127.0.0.1", name="bench")
    handshake = {"plain": [], "sealed": []}
    try:
        for _ in range(max(50, reps * 10)):
            handshake["plain"].append(plain_handshake())
            handshake["sealed"].append(sealed_handshake(server, secret))
    finally:
        server.close()
    return {"transfer_1gib": {k: stats(v) for k, v in transfer.items()},
            "handshake": {k: stats(v) for k, v in handshake.items()}}


# Connections the driver service accepts in one np=2 gloo run: per rank its task (roster), its
# launcher, the rank itself and its rendezvous proxy.
CONNECTIONS_PER_GLOO_RUN_NP2 = 8
# A 1 GiB payload crosses the network once per rank.
PAYLOAD_TRANSFERS_NP2 = 2


def report_lines(cost: dict | None, launch_s: float | None, payload_1gib_s: float | None) -> list[str]:
    if not cost:
        return ["## What encrypting the runner's channels costs", "",
                "Not measured in this run (`bench/run.py --only encryption`).", ""]
    t, h = cost["transfer_1gib"], cost["handshake"]
    per_gib = t["sealed"]["median"] - t["plain"]["median"]
    per_conn = h["sealed"]["median"] - h["plain"]["median"]
    lines = [
        "## What encrypting the runner's channels costs",
        "",
        "Every frame on the runner's ports is sealed with AES-256-GCM under per-connection keys "
        "(docs/architecture.md). Against the same bytes over a plain loopback TCP connection, "
        "measured in this run:",
        "",
        "| | plain median | sealed median (min-max) | added |",
        "| --- | --- | --- | --- |",
        f"| 1 GiB, one transfer | {t['plain']['median']:.2f} s | {t['sealed']['median']:.2f} s "
        f"({t['sealed']['min']:.2f}-{t['sealed']['max']:.2f}) | {per_gib:+.2f} s |",
        f"| a connection: handshake, hello, reply | {h['plain']['median'] * 1e3:.2f} ms | "
        f"{h['sealed']['median'] * 1e3:.2f} ms ({h['sealed']['min'] * 1e3:.2f}-{h['sealed']['max'] * 1e3:.2f}) "
        f"| {per_conn * 1e3:+.2f} ms |",
        "",
    ]
    if launch_s:
        share = CONNECTIONS_PER_GLOO_RUN_NP2 * per_conn / launch_s
        lines.append(f"On the launch of a trivial 2-rank gloo run ({launch_s:.2f} s above, "
                     f"{CONNECTIONS_PER_GLOO_RUN_NP2} connections): {share:.2%} of it.")
    if payload_1gib_s:
        share = PAYLOAD_TRANSFERS_NP2 * per_gib / payload_1gib_s
        lines.append(f"On a 2-rank run whose function captures 1 GiB ({payload_1gib_s:.2f} s above; the "
                     f"payload crosses twice, once per rank): {share:.1%} of it. The goal was under 10% for both.")
    lines.append("")
    return lines
