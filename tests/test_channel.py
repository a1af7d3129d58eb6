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
    from airflow_provider_hvd.runner.task.rsh_service import RshService

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

    from airflow_provider_hvd.runner.task.rendezvous_proxy import RendezvousProxy

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

    from airflow_provider_hvd.runner.task.rendezvous_proxy import RendezvousProxy

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
