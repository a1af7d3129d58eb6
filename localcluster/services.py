"""What runs on each host, started the way its compose service starts it (docker/compose.yaml).

    postgres        PostgreSQL from Debian's package: Airflow's metadata database
    s3              moto's standalone S3 server (an emulator: no real S3 server installs here)
    spark-master    Spark's Master, REST submission server on (6066), UI 8080
    spark-worker-N  Spark's Worker, 1 core as in compose (one rank per host); its work directory on its own disk
    airflow         `airflow db migrate`, then api-server, scheduler (LocalExecutor), dag-processor
                    and triggerer, each a process; dags/ and localcluster/user_dags/ as two DAG bundles

Every service is a process of its own on its host (``nsenter`` into the host's holder), logging
to ``<state>/hosts/<host>/logs/<service>.log``; ``cluster.json`` says what runs where.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

from localcluster import namespaces
from localcluster.hosts import (
    AIRFLOW_API_PORT,
    BY_NAME,
    HOST_DIR,
    POSTGRES_PORT,
    S3_PORT,
    SPARK_MASTER_PORT,
    SPARK_REST_PORT,
    SPARK_UI_PORT,
    SPARK_WORKERS,
)

REPO = namespaces.REPO
VENV_BIN = Path(sys.executable).parent
BUCKET = "hvd-artifacts"
SPARK_HOME = Path(pyspark.__file__).parent
USER_DAGS = REPO / "localcluster" / "user_dags"
ADMIN_USER = "admin"
PASSWORDS_FILE = "simple_auth_manager_passwords.json"


def base_env() -> dict[str, str]:
    """What every host's processes start with: an image's environment, not this shell's."""
    env = {"PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": HOST_DIR, "LANG": "C.UTF-8", "SPARK_HOME": str(SPARK_HOME),
           "PYSPARK_PYTHON": sys.executable,
           # A Python process that `down` has to kill gets SIGABRT first and writes its threads'
           # stacks to its log (namespaces.destroy): the evidence of what a hung shutdown waited on.
           "PYTHONFAULTHANDLER": "1"}
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


def storage_env(secret: dict) -> dict[str, str]:
    """s3fs's settings (the Spark driver and the ranks read these), as compose's x-storage-env."""
    return {"AWS_ACCESS_KEY_ID": "hvd", "AWS_SECRET_ACCESS_KEY": secret["s3_secret"],
            "AWS_ENDPOINT_URL": f"http://s3:{S3_PORT}", "AWS_DEFAULT_REGION": "us-east-1"}


class Cluster:
    def __init__(self, state: Path):
        self.state = state
        self.info_path = state / "cluster.json"
        self.info: dict = json.loads(self.info_path.read_text()) if self.info_path.exists() else {}

    # ---- processes on hosts ----

    def log_path(self, host: str, service: str) -> Path:
        return self.state / "hosts" / host / "logs" / f"{service}.log"

    def start(self, host: str, service: str, command: list[str], env: dict[str, str]) -> int:
        """``command`` as a long-lived service of ``host``; its output in the host's log folder."""
        log = self.log_path(host, service)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen([*namespaces.enter(self.info["holders"][host]), *command], env=env, cwd="/",
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.info.setdefault("services", {})[f"{host}/{service}"] = proc.pid
        self.info.setdefault("launch", {})[f"{host}/{service}"] = {"command": command, "env": env}
        self.save()
        return proc.pid

    def restart(self, host: str, service: str, crash: bool = False, timeout: float = 30) -> int:
        """Stop ``service`` on ``host`` and start it again as it was started (`docker compose restart`)."""
        self.stop(host, service, crash, timeout)
        launch = self.info["launch"][f"{host}/{service}"]
        return self.start(host, service, launch["command"], launch["env"])

    def stop(self, host: str, service: str, crash: bool = False, timeout: float = 30) -> None:
        """SIGTERM to the service's process group (``crash``: SIGKILL, as a machine or OOM kill would);
        returns once no process of it is left."""
        key = f"{host}/{service}"
        if key not in self.info.get("launch", {}):
            raise KeyError(f"no service {service!r} on {host!r}: {sorted(self.info.get('launch', {}))}")
        group = self.info["services"][key]
        try:
            # A crash takes every process of the service at once; a stop, like `docker compose stop`,
            # signals the main process, which ends its own children (see namespaces.destroy).
            if crash:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            if time.monotonic() > deadline:
                os.killpg(group, signal.SIGKILL)
            time.sleep(0.2)

    def run(self, host: str, command: list[str], env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = True) -> subprocess.CompletedProcess:
        """A one-off command on ``host`` (what `docker compose exec` does)."""
        # From /: every host's user may enter it (PostgreSQL's tools run as postgres).
        done = subprocess.run([*namespaces.enter(self.info["holders"][host]), *command], env=env or base_env(),
                              cwd="/", capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"on {host}: {' '.join(command)}: {(done.stdout + done.stderr)[-3000:]}")
        return done

    def login(self) -> tuple[str, str]:
        """The user and password that log in to this cluster's Airflow UI and REST API."""
        return ADMIN_USER, self.info["secret"]["airflow_admin"]

    def save(self) -> None:
        self.info_path.write_text(json.dumps(self.info, indent=1))

    def wait_port(self, host: str, port: int, service: str, timeout: float = 120) -> None:
        """Until ``host:port`` accepts a connection, checked from that host's own network."""
        probe = f"import socket; socket.create_connection(('{BY_NAME[host].address}', {port}), timeout=2).close()"
        deadline = time.monotonic() + timeout
        while self.run(host, [sys.executable, "-c", probe], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{service} on {host} did not listen on {port} within {timeout:.0f} s: "
                                   f"{self.log_path(host, service).read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)

    # ---- the services ----

    def up(self, api_port: int) -> None:
        if self.info_path.exists():
            raise SystemExit(f"a cluster is already up (its state: {self.state}): make cluster-down first")
        self.state.mkdir(parents=True, exist_ok=True)
        # The last cluster's disks and logs, kept by `down` for reading: a new cluster starts empty.
        shutil.rmtree(self.state / "hosts", ignore_errors=True)
        secret = {"postgres": secrets.token_hex(16), "s3_secret": secrets.token_hex(16),
                  "jwt": secrets.token_hex(32), "signing_key": secrets.token_hex(32),
                  "airflow_admin": secrets.token_urlsafe(12)}
        self.info = {"secret": secret, "api_port": api_port}
        self.info["holders"] = namespaces.create(self.state)
        self.save()
        try:
            self._postgres(secret)
            self._s3(secret)
            self._spark()
            self._airflow(secret)
            self._forward(api_port)
        except BaseException:
            self.down()
            raise

    def _postgres(self, secret: dict) -> None:
        bindir = os.path.dirname(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                                        key=lambda p: int(p.split("/")[4]))[-1])
        data = self.state / "hosts" / "postgres" / "pgdata"
        data.mkdir()
        account = pwd.getpwnam("postgres")
        os.chown(data, account.pw_uid, account.pw_gid)
        as_postgres = ["runuser", "-u", "postgres", "--"]
        pgdata = f"{HOST_DIR}/pgdata"
        self.run("postgres", [*as_postgres, f"{bindir}/initdb", "-D", pgdata, "-U", "postgres", "-E", "UTF8",
                              "--auth-local=trust", "--auth-host=scram-sha-256", "--no-instructions"])
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host airflow airflow 10.77.0.10/32 scram-sha-256\n")  # the Airflow host alone
        self.start("postgres", "postgres", [*as_postgres, f"{bindir}/postgres", "-D", pgdata,
                                            "-c", f"listen_addresses={BY_NAME['postgres'].address}",
                                            "-p", str(POSTGRES_PORT), "-k", "/tmp", "-c", "max_connections=200"],
                   base_env())
        self.wait_port("postgres", POSTGRES_PORT, "postgres")
        psql = [*as_postgres, f"{bindir}/psql", "-h", "/tmp", "-p", str(POSTGRES_PORT), "-U", "postgres", "-c"]
        self.run("postgres", [*psql, f"CREATE ROLE airflow LOGIN PASSWORD '{secret['postgres']}'"])
        self.run("postgres", [*psql, "CREATE DATABASE airflow OWNER airflow"])

    def _s3(self, secret: dict) -> None:
        self.start("s3", "moto", [sys.executable, "-m", "moto.server", "-H", BY_NAME["s3"].address,
                                  "-p", str(S3_PORT)], base_env())
        self.wait_port("s3", S3_PORT, "moto")
        make_bucket = f"import s3fs; s3fs.S3FileSystem().mkdir('{BUCKET}')"
        self.run("airflow", [sys.executable, "-c", make_bucket], env={**base_env(), **storage_env(secret)})

    def _spark(self) -> None:
        opts = (f"-Dspark.master.rest.enabled=true -Dspark.master.rest.port={SPARK_REST_PORT}")
        self.start("spark-master", "master",
                   [str(SPARK_HOME / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
                    "--host", "spark-master", "--port", str(SPARK_MASTER_PORT), "--webui-port", str(SPARK_UI_PORT)],
                   {**base_env(), "SPARK_MASTER_OPTS": opts, "SPARK_LOG_DIR": f"{HOST_DIR}/logs"})
        self.wait_port("spark-master", SPARK_MASTER_PORT, "master")
        for worker in SPARK_WORKERS:
            self.start(worker.name, "worker",
                       [str(SPARK_HOME / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                        f"spark://spark-master:{SPARK_MASTER_PORT}", "--cores", "1", "--memory", "3g",
                        "--work-dir", f"{HOST_DIR}/work", "--webui-port", "8081"],
                       {**base_env(), **storage_env(self.info["secret"]), "SPARK_LOG_DIR": f"{HOST_DIR}/logs"})
        self.wait_workers(len(SPARK_WORKERS))

    def wait_workers(self, count: int, timeout: float = 120) -> None:
        probe = (f"import json, urllib.request; print(sum(w['state'] == 'ALIVE' for w in json.load(urllib.request."
                 f"urlopen('http://spark-master:{SPARK_UI_PORT}/json/', timeout=5))['workers']))")
        deadline = time.monotonic() + timeout
        while True:
            done = self.run("spark-master", [sys.executable, "-c", probe], check=False)
            if done.returncode == 0 and int(done.stdout.strip() or 0) >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} Spark workers not registered within {timeout:.0f} s: {done.stdout}")
            time.sleep(1)

    def airflow_env(self) -> dict[str, str]:
        secret = self.info["secret"]
        bundles = [{"name": name, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(path), "refresh_interval": 5}}
                   for name, path in (("dags-folder", REPO / "dags"), ("user-dags", USER_DAGS))]
        return {
            **base_env(), **storage_env(secret),
            "AIRFLOW_HOME": f"{HOST_DIR}/airflow",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
                f"postgresql+psycopg2://airflow:{secret['postgres']}@postgres:{POSTGRES_PORT}/airflow",
            "AIRFLOW__API__HOST": "0.0.0.0", "AIRFLOW__API__PORT": str(AIRFLOW_API_PORT),
            "AIRFLOW__API__BASE_URL": f"http://airflow:{AIRFLOW_API_PORT}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://airflow:{AIRFLOW_API_PORT}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": secret["jwt"],
            # One named admin who logs in with a password (`python -m localcluster login` says it), not
            # Airflow's every-visitor-is-admin development default: the UI and API run DAGs, that is code.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": f"{HOST_DIR}/airflow/{PASSWORDS_FILE}",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",  # as compose sets it
            # The connections, as a deployment sets them (compose: the same AIRFLOW_CONN_* variables).
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "spark://spark-master",
                                                      "port": SPARK_MASTER_PORT,
                                                      "extra": {"deploy-mode": "client",
                                                                "rest-port": str(SPARK_REST_PORT)}}),
            "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod", "password": secret["signing_key"],
                                                        "extra": {"storage_path": f"s3://{BUCKET}/runs"}}),
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "login": "hvd",
                                                    "password": secret["s3_secret"],
                                                    "extra": {"endpoint_url": f"http://s3:{S3_PORT}",
                                                              "region_name": "us-east-1"}}),
            "HVD_EXAMPLE_STORAGE": f"s3://{BUCKET}/examples",
        }

    def host_env(self, host: str) -> dict[str, str]:
        """The environment a command run on ``host`` gets (`localcluster exec`): its services'."""
        if host == "airflow":
            return self.airflow_env()
        return {**base_env(), **storage_env(self.info["secret"])}

    def _airflow(self, secret: dict) -> None:
        env = self.airflow_env()
        # The simple auth manager reads its users' passwords from this file; written here, before any
        # service starts, it holds the cluster's own password instead of one Airflow would print to its log.
        home = self.state / "hosts" / "airflow" / "airflow"
        home.mkdir(parents=True, exist_ok=True)
        passwords = home / PASSWORDS_FILE
        passwords.touch(mode=0o600)
        passwords.write_text(json.dumps({ADMIN_USER: secret["airflow_admin"]}))
        self.run("airflow", ["airflow", "db", "migrate"], env=env)
        for service in ("api-server", "scheduler", "dag-processor", "triggerer"):
            self.start("airflow", service, ["airflow", service], env)
        self.wait_port("airflow", AIRFLOW_API_PORT, "api-server", timeout=180)

    def _forward(self, api_port: int) -> None:
        host = BY_NAME["airflow"]
        log = self.state / "forward.log"
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "localcluster.forward", str(api_port),
                                     f"/run/netns/{host.netns}", host.address, str(AIRFLOW_API_PORT)],
                                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while "forwarding" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the forwarder to Airflow's api-server did not start: {log.read_text()}")
            time.sleep(0.1)
        self.info["forwarder"] = proc.pid
        self.save()

    def down(self, grace: float = 20.0) -> list[str]:
        """Every process ended, every namespace removed (the forwarder joined Airflow's: it goes too).
        Returns what had to be killed after ``grace`` seconds, then the stacks those processes wrote."""
        killed = namespaces.destroy(grace)
        self.info_path.unlink(missing_ok=True)
        return killed + (self.aborted_stacks() if killed else [])

    def aborted_stacks(self, most: int = 80) -> list[str]:
        """The thread stacks that Python processes killed by `down` wrote to their service logs
        (namespaces.destroy aborts them with faulthandler on), each dump under its log's path."""
        found = []
        for log in sorted((self.state / "hosts").glob("*/logs/*.log")):
            # A dump is a run of thread stacks (each opening with "Thread 0x..." or, for the thread
            # the signal interrupted, "Current thread 0x..."), found by those lines and not by the
            # "Fatal Python error: Aborted" header, which a dump need not have whole (namespaces.py
            # aborts one process at a time so that dumps sharing a log do not interleave, but a
            # process that outlives its turn still writes when it gets to it).
            dumps: list[list[str]] = []
            inside = has_current = False  # in a dump; that dump has its current thread already
            for line in log.read_text(errors="replace").splitlines():
                opens = THREAD_STACK.match(line)
                current = bool(opens) and opens.group(1) == "Current thread"
                if opens and (not inside or (current and has_current)):
                    dumps.append([])
                    inside, has_current = True, current
                elif opens:
                    has_current = has_current or current
                elif inside and not (line.startswith("  File ") or not line.strip()):
                    inside = False
                if inside and len(dumps[-1]) < most:
                    dumps[-1].append(line)
            found += [f"stacks written on SIGABRT, {log}:\n" + "\n".join(dump).rstrip() for dump in dumps]
        return found


# The first line of each thread's stack in a faulthandler dump.
THREAD_STACK = re.compile(r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
