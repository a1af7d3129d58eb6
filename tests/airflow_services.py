"""Airflow 3 as deployed, for tests: api-server, scheduler (LocalExecutor), dag-processor and
triggerer, each a process of its own, on the metadata database the environment names.

Every port is a free one on 127.0.0.1 (the api-server and both log servers: Airflow's defaults,
8080/8793/8794, may be taken), so nothing listens beyond loopback. ``stop`` ends each service's
whole process group (SIGTERM, then SIGKILL after a grace period: the triggerer alone takes about
ten seconds) and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import LOCAL_SPARK_CONNECTION

AIRFLOW = str(Path(sys.executable).parent / "airflow")
SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env(home: Path, dags_folder: Path, **extra: str) -> dict[str, str]:
    """The environment of every Airflow process of one deployment (services and CLI alike)."""
    api_port = free_port()
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           # The simple auth manager with every user an admin: tokens from /auth/token, no password.
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
           "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(api_port),
           "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
           "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
           "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
           "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
           "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK_CONNECTION,
           "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
           **extra}
    return env


def cli(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"airflow {' '.join(args)}: {(done.stdout + done.stderr)[-3000:]}"
    return done.stdout


class RestClient:
    """Airflow's public REST API (``/api/v2``) at ``base``, as a user's client calls it: with
    ``login`` (user, password), the token a user gets by logging in (POST /auth/token); without, the
    simple auth manager's every-user-an-admin token (GET /auth/token, these tests' own services)."""

    def __init__(self, base: str, login: tuple[str, str] | None = None):
        self.base = base
        self.login = login
        self._token: str | None = None

    def token(self) -> str:
        if self.login is None:
            request = urllib.request.Request(f"{self.base}/auth/token")
        else:
            user, password = self.login
            request = urllib.request.Request(f"{self.base}/auth/token", method="POST",
                                             data=json.dumps({"username": user, "password": password}).encode(),
                                             headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.load(r)["access_token"]

    def failure_context(self) -> str:
        return ""

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        """One call of Airflow's public REST API (``/api/v2``), as a user's client makes it."""
        if self._token is None:
            self._token = self.token()
        request = urllib.request.Request(f"{self.base}/api/v2{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self._token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:2000]!r}") from None

    def wait_for_runs(self, dag_id: str, count: int, timeout: float, states=("success", "failed")) -> list[dict]:
        """The DAG's runs once ``count`` of them are in one of ``states`` (oldest first)."""
        deadline = time.monotonic() + timeout
        runs: list[dict] = []
        while time.monotonic() < deadline:
            runs = self.api("GET", f"/dags/{dag_id}/dagRuns?order_by=run_after")["dag_runs"]
            if len([r for r in runs if r["state"] in states]) >= count:
                return runs
            time.sleep(2)
        raise AssertionError(f"{dag_id}: {count} run(s) not {'/'.join(states)} within {timeout} s: "
                             f"{[(r['dag_run_id'], r['state']) for r in runs]}\n"
                             f"{self.failure_context()}")



class AirflowServices(RestClient):
    def __init__(self, env: dict[str, str], logs: Path):
        super().__init__(env["AIRFLOW__API__BASE_URL"])
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "AirflowServices":
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            for name in SERVICES:
                self.start(name)
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, name: str) -> None:
        """Start one service (again, after ``kill``: its log goes on in the same file)."""
        with open(self.logs / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen([AIRFLOW, name], env=self.env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str) -> None:
        """SIGKILL to the service's whole process group, as a host that dies or an OOM kill would do it."""
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def failure_context(self) -> str:
        return f"scheduler: {self.log('scheduler')[-3000:]}"

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_healthy(self, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        health: dict = {}
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"airflow {name} exited ({proc.returncode}): {self.log(name)[-3000:]}"
            try:
                with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=5) as r:
                    health = json.load(r)
                if all(health.get(part, {}).get("status") == "healthy"
                       for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")):
                    return health
            except (OSError, ValueError):
                pass
            time.sleep(1)
        raise AssertionError(f"Airflow's services not healthy within {timeout} s: {health}")

    def stop(self, grace: float = 30) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # what is left of its group: LocalExecutor's workers, the log servers, ...
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
