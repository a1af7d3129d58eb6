"""A private PostgreSQL server from Debian's package, as Airflow's metadata database in tests.

``initdb`` into a fresh directory, listening on 127.0.0.1 at a free port only (and a socket in
that directory), run as the ``postgres`` user because PostgreSQL refuses to run as root.
Leaving the ``with`` block shuts it down (SIGINT: a fast shutdown) and removes the directory:
no process, no port, no file is left. scripts/setup.sh installs the package (``apt_test``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from airflow_services import free_port


def _bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: scripts/setup.sh installs Debian's postgresql package "
                           "(apt_test in pyproject.toml)")
    return os.path.dirname(found[-1])


class PostgresServer:
    def __init__(self, user: str = "postgres"):
        self.bindir = _bindir()
        self.user = user
        self.port = free_port()
        self.root = ""
        self._server: subprocess.Popen | None = None

    def _as_user(self, *args: str, timeout: float = 120) -> str:
        command = [os.path.join(self.bindir, args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {(done.stdout + done.stderr)[-2000:]}\n{self.log()[-2000:]}")
        return done.stdout

    def log(self) -> str:
        try:
            with open(os.path.join(self.root, "server.log")) as f:
                return f.read()
        except OSError:
            return ""

    @property
    def url(self) -> str:
        """What Airflow's ``sql_alchemy_conn`` takes."""
        return f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/airflow"

    def query(self, sql: str) -> str:
        return self._as_user("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", "-d", "airflow",
                             "-tAc", sql).strip()

    def __enter__(self) -> "PostgresServer":
        # Under /tmp itself: the postgres user cannot enter pytest's per-user temporary folders.
        self.root = tempfile.mkdtemp(prefix="hvd-postgres-")
        if os.geteuid() == 0:
            account = pwd.getpwnam(self.user)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        try:
            self._as_user("initdb", "-D", "data", "-U", "airflow", "--auth=trust", "-E", "UTF8", "--no-instructions")
            # The server runs as our child, not daemonised by pg_ctl: we stop it and reap it ourselves
            # (a daemon's parent here is an init that leaves it a zombie).
            command = [os.path.join(self.bindir, "postgres"), "-D", "data", "-c", "listen_addresses=127.0.0.1",
                       "-p", str(self.port), "-k", self.root, "-c", "fsync=off", "-c", "max_connections=200"]
            if os.geteuid() == 0:
                command = ["runuser", "-u", self.user, "--", *command]
            with open(os.path.join(self.root, "server.log"), "wb") as log:
                self._server = subprocess.Popen(command, cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            deadline = time.monotonic() + 60
            while subprocess.run([os.path.join(self.bindir, "pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                                  str(self.port)]).returncode != 0:
                if self._server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {self.log()[-3000:]}")
                time.sleep(0.2)
            self._as_user("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", "airflow")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._server is not None and self._server.poll() is None:
            os.killpg(self._server.pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
            try:
                self._server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self._server.pid, signal.SIGKILL)
                self._server.wait()
        shutil.rmtree(self.root, ignore_errors=True)
