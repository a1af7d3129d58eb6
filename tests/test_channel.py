"""Every connection to the driver service must prove it holds the run's secret."""

import socket
import time

import pytest

from airflow_provider_hvd.runner import channel, payload
from airflow_provider_hvd.runner.driver_service import DriverService


def test_wrong_secret_is_refused_and_cannot_fetch_the_payload():
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
    finally:
        service.close()


def test_rsh_service_runs_commands_only_for_holders_of_the_secret(tmp_path):
    from airflow_provider_hvd.runner.mpi_launch import RshService

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
    finally:
        service.close()
