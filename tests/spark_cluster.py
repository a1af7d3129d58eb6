"""A real Spark standalone cluster on loopback, started from pyspark's own bin/spark-class.

Workers bind to distinct loopback addresses (127.0.0.2, 127.0.0.3, ...) so that
their executors really are different hosts to Spark and to Horovod.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyspark


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Spark process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"Spark process did not open {host}:{port} in {timeout}s:\n{log.read_text()[-3000:]}")


class StandaloneCluster:
    def __init__(self, workdir: Path, worker_hosts=("127.0.0.2", "127.0.0.3"), cores_per_worker=1,
                 memory="1g", rest: bool = False):
        """``rest``: the master's REST submission server on (``rest_port``), which cluster deploy mode
        follows and kills drivers through."""
        self.workdir = workdir
        self.rest_port = free_port() if rest else None
        self.worker_hosts = worker_hosts
        self.cores = cores_per_worker
        self.memory = memory
        self.procs: list[subprocess.Popen] = []
        self.spark_home = Path(pyspark.__file__).parent
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"

    def connection(self, **extra) -> dict:
        """The Spark connection (AIRFLOW_CONN_* JSON) for this master."""
        if self.rest_port:
            extra.setdefault("rest-port", str(self.rest_port))
        return {"conn_type": "spark", "host": self.url, "extra": extra}

    def _start(self, name: str, *args: str, host: str = "127.0.0.1",
               env: dict | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.workdir / f"{name}.log"
        # Executors inherit their worker's environment: SPARK_LOCAL_* make them bind to
        # and advertise the worker's own address.
        env = {**os.environ, "SPARK_HOME": str(self.spark_home), "SPARK_LOG_DIR": str(self.workdir),
               "SPARK_LOCAL_IP": host, "SPARK_LOCAL_HOSTNAME": host, **(env or {})}
        proc = subprocess.Popen([str(self.spark_home / "bin" / "spark-class"), *args], env=env,
                                stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def start(self) -> "StandaloneCluster":
        master, log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--webui-port", str(free_port()),
                                  env={"SPARK_MASTER_OPTS": f"-Dspark.master.rest.enabled=true "
                                                            f"-Dspark.master.rest.port={self.rest_port}"}
                                  if self.rest_port else None)
        _wait_port("127.0.0.1", self.port, 60, master, log)
        if self.rest_port:
            _wait_port("127.0.0.1", self.rest_port, 60, master, log)
        for i, host in enumerate(self.worker_hosts):
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", host,
                        "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
                        "--work-dir", str(self.workdir / f"work{i}"), host=host)
        return self

    def stop(self) -> None:
        # Executors are children of the workers, in their process groups.
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
