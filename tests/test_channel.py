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
