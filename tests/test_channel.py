"""Every connection to the driver service must prove it holds the run's secret."""

import os
import socket
import time

import pytest

from airflow_provider_hvd.runner.wire import channel, payload
from airflow_provider_hvd.runner.driver.service import DriverService


@pytest.mark.faults
def test_wrong_secret_is_refused_and_cannot_fetch_the_payload(fault):
    record = fault("port: driver service (payload, logs, results, roster, rendezvous); a client with a wrong "
                   "secret, and a raw client injecting a log line",
                   "both refused and logged; no payload, no log line, no event")
    secret = payload.new_secret()
    lines = []
    service = DriverService(secret, b"the payload", lambda r, s, l: lines.append(l), host="127.0.0.1")
    try:
        with pytest.raises(channel.AuthenticationError):
            channel.connect(("127.0.0.1", service.port), payload.new_secret(), {"role": "rank", "rank": 0})
        # A raw client that skips the handshake and tries to inject a log line.
        with socket.create_connection(("127.0.0.1", service.port)) as s:
            s.recv(32)
            s.sendall(b"J" + (20).to_bytes(8, "big") + b'{"op": "log"}' + b"x" * 100)
            time.sleep(0.3)
        assert service.refused_connections == 2
        assert service.events.empty() and lines == []

        good = channel.connect(("127.0.0.1", service.port), secret, {"role": "rank", "rank": 0})
        good.send_json({"op": "get_payload"})
        assert good.recv_bytes() == b"the payload"
        good.send_json({"op": "log", "stream": "log", "line": "hello"})
        good.send_json({"op": "bye"})
        good.close()
        time.sleep(0.3)
        assert lines == ["hello"]
        record.observe(f"{service.refused_connections} refused, 0 events, 0 log lines; the run's own client served")
    finally:
        service.close()


@pytest.mark.faults
def test_rsh_service_runs_commands_only_for_holders_of_the_secret(tmp_path, fault):
    record = fault("port: mpi rsh service (starts orted on a host); a client with a wrong secret asks to run a "
                   "command", "refused before any command runs")
    from airflow_provider_hvd.runner.barrier.rsh_service import RshService

    secret = payload.new_secret()
    service = RshService(secret)
    marker = tmp_path / "ran"
    try:
        with pytest.raises(channel.AuthenticationError):
            intruder = channel.connect(("127.0.0.1", service.port), payload.new_secret(), {"role": "rsh-agent"})
            intruder.send_json({"op": "exec", "command": f"touch {marker}"})
        time.sleep(0.3)
        assert not marker.exists()

        agent = channel.connect(("127.0.0.1", service.port), secret, {"role": "rsh-agent"})
        agent.send_json({"op": "exec", "command": f"echo hello; touch {marker}; exit 3"})
        messages = []
        while not messages or messages[-1]["op"] != "exit":
            messages.append(agent.recv_json())
        agent.close()
        assert marker.exists()
        assert "hello" in "".join(m.get("data", "") for m in messages)
        assert messages[-1] == {"op": "exit", "code": 3}
        record.observe("wrong secret: AuthenticationError, command not run; the run's agent: command ran, exit 3")
    finally:
        service.close()


def test_rendezvous_store_is_reached_only_through_an_authenticated_proxy(caplog):
    """Gloo's rendezvous values live in the driver service; a rank's loopback proxy forwards to it."""
    import http.client

    from airflow_provider_hvd.runner.barrier.rendezvous_proxy import RendezvousProxy

    secret = payload.new_secret()
    service = DriverService(secret, b"", lambda *a: None, host="127.0.0.1")
    try:
        with pytest.raises(channel.AuthenticationError):
            RendezvousProxy(("127.0.0.1", service.port), payload.new_secret(), rank=0)
        proxy = RendezvousProxy(("127.0.0.1", service.port), secret, rank=0)
        host, port = proxy.address
        assert host == "127.0.0.1"
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.request("PUT", "/global/rank_0", body=b"10.0.0.1:4000")
        assert conn.getresponse().status == 200
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.request("GET", "/global/rank_0")
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"10.0.0.1:4000")
        assert service.rendezvous.get("global", "rank_0") == b"10.0.0.1:4000"
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.request("GET", "/global/rank_1")
        assert conn.getresponse().status == 404
        proxy.close()
    finally:
        service.close()


@pytest.mark.faults
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user (uid 65534)")
def test_rendezvous_proxy_refuses_another_users_process(caplog, fault):
    record = fault("port: gloo rendezvous proxy (127.0.0.1, one per rank); another user's process PUTs a fake "
                   "rank address", "refused and logged; the value never reaches the driver's store")
    import subprocess
    import sys

    from airflow_provider_hvd.runner.barrier.rendezvous_proxy import RendezvousProxy

    secret = payload.new_secret()
    service = DriverService(secret, b"", lambda *a: None, host="127.0.0.1")
    proxy = RendezvousProxy(("127.0.0.1", service.port), secret, rank=0)
    try:
        intruder = ("import encodings.idna, http.client, os; os.setgid(65534); os.setuid(65534)\n"
                    "c = http.client.HTTPConnection(%r, %d, timeout=5)\n"
                    "try:\n    c.request('PUT', '/global/rank_0', body=b'6.6.6.6:1'); print(c.getresponse().status)\n"
                    "except (ConnectionError, http.client.HTTPException) as e:\n    print('refused', type(e).__name__)\n"
                    % proxy.address)
        with caplog.at_level("WARNING"):
            out = subprocess.run([sys.executable, "-c", intruder], capture_output=True, text=True, timeout=30)
        assert out.stdout.startswith("refused"), out
        assert proxy.refused == 1
        assert service.rendezvous.get("global", "rank_0") is None
        assert "refused a connection" in caplog.text and "uid 65534" in caplog.text
        record.observe("connection dropped before the request was read; warning logged; store unchanged")
    finally:
        proxy.close()
        service.close()


class RecordingRelay:
    """A TCP relay between a client and the driver service that keeps every byte it forwards (what
    anyone on the network sees) and can flip one bit of the server's traffic after ``tamper_after`` bytes."""

    def __init__(self, target: tuple[str, int], tamper_after: int | None = None):
        import threading

        self.target = target
        self.tamper_after = tamper_after
        self.seen = bytearray()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        client, _ = self._listener.accept()
        server = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        forwarded = 0
        try:
            while data := src.recv(1 << 16):
                data = bytearray(data)
                if from_server and self.tamper_after is not None and forwarded <= self.tamper_after < \
                        forwarded + len(data):
                    data[self.tamper_after - forwarded] ^= 0x01
                forwarded += len(data)
                self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def test_the_payload_logs_and_results_cross_the_network_encrypted():
    """What a rank fetches and sends is unreadable on the wire, and still arrives whole."""
    secret = payload.new_secret()
    marker = b"AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    big = marker + os.urandom(6 << 20) + marker  # more than one sealed chunk
    lines = []
    service = DriverService(secret, big, lambda r, s, line: lines.append(line), host="127.0.0.1")
    relay = RecordingRelay(("127.0.0.1", service.port))
    try:
        rank = channel.connect(("127.0.0.1", relay.port), secret, {"role": "rank", "rank": 0})
        rank.send_json({"op": "get_payload"})
        assert rank.recv_bytes() == big
        rank.send_json({"op": "log", "stream": "log", "line": "loss 0.1234 token=" + marker.decode()})
        rank.send_json({"op": "bye"})
        rank.close()
        deadline = time.monotonic() + 5
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lines == ["loss 0.1234 token=" + marker.decode()]
        assert len(relay.seen) > len(big)  # everything went through the relay...
        assert marker not in relay.seen and b"loss 0.1234" not in relay.seen  # ...and none of it readable
        assert b"get_payload" not in relay.seen and b'"role"' not in relay.seen
    finally:
        relay.close()
        service.close()


def test_a_frame_altered_on_the_wire_ends_the_connection_instead_of_being_believed():
    secret = payload.new_secret()
    service = DriverService(secret, b"the real payload " * 1000, lambda *a: None, host="127.0.0.1")
    # The server's first 32 bytes are its nonce, then its sealed "ok"; flip a bit in the payload frame after it.
    relay = RecordingRelay(("127.0.0.1", service.port), tamper_after=32 + 25 + 20 + 25 + 100)
    try:
        rank = channel.connect(("127.0.0.1", relay.port), secret, {"role": "rank", "rank": 0})
        rank.send_json({"op": "get_payload"})
        with pytest.raises(ConnectionError, match="failed its integrity check"):
            rank.recv_bytes()
        rank.close()
    finally:
        relay.close()
        service.close()


def test_a_server_without_the_secret_is_found_out_by_the_client():
    """Mutual: a listener that plays the driver without the run's secret gets no hello it can read,
    and the client refuses its answer."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def impostor():
        conn, _ = listener.accept()
        conn.sendall(os.urandom(32))  # a nonce, as the driver would
        conn.settimeout(2)
        while len(received) <= 64:  # the client's nonce and answer, then its hello
            received.extend(conn.recv(4096))
        conn.sendall(os.urandom(9 + 16) + os.urandom(20 + 16))  # a "reply" it cannot seal
        time.sleep(0.5)
        conn.close()

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    try:
        with pytest.raises(channel.AuthenticationError, match="does not hold the run's secret"):
            channel.connect(("127.0.0.1", listener.getsockname()[1]), payload.new_secret(),
                            {"role": "rank", "rank": 0, "host": "worker-7"})
        thread.join(5)
        assert b"worker-7" not in received and len(received) > 64  # the hello came, sealed
    finally:
        listener.close()
