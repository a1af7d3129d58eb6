"""launcher="mpi": mpirun started from the barrier stage, with no ssh between hosts.

As in Databricks' HorovodRunner, the task holding rank 0 starts ``mpirun`` for all
ranks. OpenMPI reaches other hosts through its rsh agent (``plm_rsh_agent``), which
here is ``mpi_rsh``: it asks the *barrier task on that host* to run the ``orted``
command. Each barrier task serves those requests on an ``RshService`` port,
authenticated with the run's secret (channel.py), so nothing else can start a
process there. mpirun's ``--tag-output`` lines are split back into per-rank lines;
its exit is reported per rank to the driver like the gloo launcher's.
"""

from __future__ import annotations

import collections
import json
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache
from typing import Any

from airflow_provider_hvd.runner import channel as channel_mod
from airflow_provider_hvd.runner.driver_link import DriverLink
from airflow_provider_hvd.runner.lifetime import die_with_parent

RSH_MAP_ENV = "HVD_RSH_MAP"
RSH_SECRET_ENV = "HVD_RSH_SECRET"
DRIVER_ENV = "HVD_DRIVER_ADDR"
SECRET_ENV = "HVD_RUN_SECRET"
GPUS_BY_RANK_ENV = "HVD_GPUS_BY_RANK"
# Each host's Python and working directory, set by that host's barrier task (RshService for
# orted, MpiRun for mpirun's own host): the executors' environments need not be at the same
# path on every host (spark.archives unpacks one per executor).
RANK_PYTHON_ENV = "HVD_RANK_PYTHON"
RANK_CWD_ENV = "HVD_RANK_CWD"
# mpirun's application: a rank under its own host's Python, in its own executor's directory.
_RANK_COMMAND = ('cd "$%s" || exit 70; exec "$%s" -u -m airflow_provider_hvd.runner.rank_main --mpi'
                 % (RANK_CWD_ENV, RANK_PYTHON_ENV))


def this_hosts_rank_env() -> dict[str, str]:
    return {RANK_PYTHON_ENV: sys.executable, RANK_CWD_ENV: os.getcwd()}
_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
_SIGNALED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_EXITED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)", re.S)


class TaggedLines:
    """Splits mpirun's ``--tag-output`` back into whole lines per rank.

    mpirun tags each chunk it reads from a rank, not each line: a rank's line can
    arrive as ``[1,0]<stdout>:first half`` directly followed, on the same output
    line, by ``[1,1]<stdout>:another rank's line`` and later ``[1,0]<stdout>:second half``.
    A tagged segment followed by another tag on the same line is such a partial
    chunk; it is kept until the same rank's stream ends a line.
    """

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}

    def feed(self, line: str) -> list[tuple[int | None, str, str]]:
        """One line of mpirun's output -> ``(rank, stream, text)`` per whole line; rank None for mpirun's own."""
        ended = line.endswith("\n")
        line = line.rstrip("\n")
        tags = list(_TAG.finditer(line))
        out: list[tuple[int | None, str, str]] = []
        if not tags or tags[0].start() > 0:
            out.append((None, "mpirun", line[: tags[0].start()] if tags else line))
        for i, tag in enumerate(tags):
            key = (int(tag.group(1)), tag.group(2))
            text = line[tag.end(): tags[i + 1].start() if i + 1 < len(tags) else len(line)]
            if i + 1 < len(tags) or not ended:
                self._partial[key] = self._partial.get(key, "") + text
            else:
                out.append((key[0], key[1], self._partial.pop(key, "") + text))
        return out


@lru_cache(maxsize=1)
def mpi_available() -> tuple[bool, str]:
    """(usable, why not): OpenMPI's mpirun on PATH and a horovod built with MPI.

    Reads the horovod extension's dynamic-library names instead of importing it
    (horovod's own mpi_built() imports torch in a subprocess: seconds per call)."""
    if not shutil.which("mpirun"):
        return False, "mpirun is not on PATH (install OpenMPI: apt-get install openmpi-bin libopenmpi-dev)"
    import importlib.util

    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False, "horovod is not installed"
    torch_dir = os.path.join(list(spec.submodule_search_locations)[0], "torch")
    libs = [f for f in os.listdir(torch_dir) if f.startswith("mpi_lib") and f.endswith(".so")] \
        if os.path.isdir(torch_dir) else []
    for lib in libs:
        with open(os.path.join(torch_dir, lib), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m.find(b"libmpi.so") >= 0:
                return True, ""
    return False, "horovod was built without MPI (HOROVOD_WITH_MPI=1; rerun scripts/setup.sh)"


class RshService:
    """Runs the commands mpirun's rsh agent sends to this host (orted), for holders of the secret."""

    def __init__(self, secret: bytes):
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._server = channel_mod.ChannelServer(secret, self._handle, name="hvd-rsh-service")
        self.port = self._server.port

    def _handle(self, channel: channel_mod.Channel, hello: dict[str, Any]) -> None:
        request = channel.recv_json()
        if request.get("op") != "exec":
            return
        proc = subprocess.Popen(["/bin/sh", "-c", request["command"]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env={**os.environ, **this_hosts_rank_env()})
        with self._lock:
            self._procs.add(proc)

        def pump(stream, name):
            for chunk in iter(lambda: stream.read1(65536), b""):
                try:
                    channel.send_json({"op": "out", "stream": name, "data": chunk.decode("utf-8", "replace")})
                except OSError:
                    break

        pumps = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True)]
        for t in pumps:
            t.start()

        def agent_gone():  # the agent (and so mpirun) went away: stop what it started
            try:
                while True:
                    channel.recv()
            except Exception:
                pass
            descendants = _descendants(proc.pid)
            _killpg(proc)
            _kill_all(descendants)

        threading.Thread(target=agent_gone, daemon=True).start()
        code = proc.wait()
        for t in pumps:
            t.join(5)
        _killpg(proc)
        with self._lock:
            self._procs.discard(proc)
        try:
            channel.send_json({"op": "exit", "code": code})
        except OSError:
            pass

    def close(self) -> None:
        self._server.close()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            descendants = _descendants(proc.pid)
            _killpg(proc)
            _kill_all(descendants)


def stop_mpirun(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM first, so mpirun ends its job its own way; then SIGKILL whatever is left of the
    tree. OpenMPI puts ranks in process groups of their own, and a rank that has not yet run
    a line of ours (stuck importing, say) does not know to die with its parent."""
    descendants = _descendants(proc.pid)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    _killpg(proc)
    _kill_all(descendants + _descendants(proc.pid))


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(procs: list) -> None:
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def _term_with_parent() -> None:
    # Runs in the forked child before exec: no import, no library loading here (lifetime.py).
    die_with_parent(signal.SIGTERM)


def _with_parent_death_signal(cmd: list[str]) -> tuple[list[str], Any]:
    """``(command, preexec_fn)`` that make mpirun get SIGTERM when this launcher's thread dies.

    util-linux's setpriv sets PR_SET_PDEATHSIG in the new process and execs mpirun, so Python
    forks without a preexec_fn: Python's documentation calls preexec_fn unsafe in a process
    with threads (a barrier task has several), since the child runs Python code between fork
    and exec. Only where setpriv is missing does the preexec_fn path remain."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--pdeathsig", "TERM", *cmd], None
    return cmd, _term_with_parent


_START_SNAPSHOTS_S = (2, 10, 30, 60, 100, 150, 220)


def _process_line(proc) -> str:
    """One process for a diagnostic line: name, pid, state, the kernel wait channel, command."""
    import psutil

    try:
        with open(f"/proc/{proc.pid}/wchan") as f:
            wchan = f.read().strip() or "-"
    except OSError:
        wchan = "?"
    try:
        cmd = " ".join(proc.cmdline())[:90]
        return f"{proc.name()}[{proc.pid}] {proc.status()} wchan={wchan}: {cmd}"
    except psutil.Error:
        return f"[{proc.pid}] gone"


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class MpiRun:
    """mpirun for all ranks, reported to the driver as one launcher holding every rank."""

    def __init__(self, *, hosts: list[tuple[str, int]], rsh: dict[str, tuple[str, int]], iface: str,
                 env: dict[str, str], rank_env: dict[str, str], driver: tuple[str, int], secret: bytes,
                 forward_output: bool, timeline_interval: float | None, extra_args: list[str]):
        self.np = sum(n for _, n in hosts)
        self._hosts = hosts
        self._rsh = rsh
        self._iface = iface
        self._env = {k: v for k, v in env.items() if k != "HOROVOD_TIMELINE"}
        self._rank_env = dict(rank_env)
        self._driver = driver
        self._secret = secret
        self._forward = forward_output
        self._timeline_interval = timeline_interval
        self._extra = list(extra_args)
        self.tails: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=30))
        self.mpirun_tail: collections.deque[str] = collections.deque(maxlen=60)
        self.proc: subprocess.Popen | None = None
        self._workdir = tempfile.mkdtemp(prefix="hvd-mpi-")
        self._threads: list[threading.Thread] = []

    def _command(self) -> list[str]:
        agent = os.path.join(self._workdir, "rsh-agent")
        with open(agent, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} -m airflow_provider_hvd.runner.mpi_rsh \"$@\"\n")
        os.chmod(agent, 0o700)
        rank_env = {**self._rank_env, DRIVER_ENV: f"{self._driver[0]}:{self._driver[1]}",
                    SECRET_ENV: self._secret.hex(), "PYTHONUNBUFFERED": "1"}
        if self._timeline_interval:
            # Every rank needs it (see rank_process.py); only rank 0, on this host, writes the file.
            rank_env["HOROVOD_TIMELINE"] = os.path.join(self._workdir, "timeline.json")
        cmd = ["mpirun"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["--tag-output", "-np", str(self.np), "-H", ",".join(f"{h}:{n}" for h, n in self._hosts),
                "--bind-to", "none", "--map-by", "slot", "--oversubscribe",
                "-mca", "plm_rsh_agent", agent, "-mca", "plm_rsh_no_tree_spawn", "1",
                # orted stays attached to the barrier task that started it instead of daemonizing:
                # a daemonizing orted vanished once in a while before calling back (CI, twice), and
                # mpirun then waits forever; attached, its end is seen and reported by the rsh agent.
                "-mca", "orte_leave_session_attached", "1",
                "-mca", "btl_tcp_if_include", self._iface, "-mca", "oob_tcp_if_include", self._iface]
        for name in sorted(rank_env):
            cmd += ["-x", name]
        cmd += [*self._extra, "/bin/sh", "-c", _RANK_COMMAND]
        self._launch_env = {**self._env, **rank_env, **this_hosts_rank_env(), RSH_SECRET_ENV: self._secret.hex(),
                            RSH_MAP_ENV: json.dumps({h: list(a) for h, a in self._rsh.items()})}
        return cmd

    def start(self) -> None:
        self._link = DriverLink(self._driver, self._secret,
                                {"role": "launcher", "rank": 0, "ranks": list(range(self.np)),
                                 "host": self._hosts[0][0], "pid": os.getpid(),
                                 "hosts": [h for h, n in self._hosts for _ in range(n)]})
        # mpirun ends its job on SIGTERM; it gets one when this launcher's thread dies (a killed
        # Spark task or driver), so its ranks never outlive the run.
        cmd, preexec = _with_parent_death_signal(self._command())
        self.proc = subprocess.Popen(cmd, env=self._launch_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, preexec_fn=preexec)
        for stream, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            t = threading.Thread(target=self._pump, args=(stream, name), daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._snapshot_while_running, name="hvd-mpirun-snapshots", daemon=True).start()
        self._link.on_stop(lambda: stop_mpirun(self.proc))
        if self._timeline_interval:
            self._link.ship_timeline(self._launch_env["HOROVOD_TIMELINE"], self._timeline_interval)

    def _snapshot_while_running(self) -> None:
        """For a start that never completes: the driver quotes these (not logged) in its
        StartTimeoutError, so a hung mpirun says which of its processes waits, and on what."""
        import psutil

        t0 = time.monotonic()
        for at in _START_SNAPSHOTS_S:
            try:
                self.proc.wait(max(0.0, t0 + at - time.monotonic()))
                return
            except subprocess.TimeoutExpired:
                pass
            try:
                tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            except psutil.Error:
                return
            # orted runs under the barrier tasks, not under mpirun: those on this host, with their ranks, count too.
            for daemon in psutil.process_iter(["name"]):
                if daemon.info.get("name") == "orted" and daemon not in tree:
                    try:
                        tree += [daemon, *daemon.children(recursive=True)]
                    except psutil.Error:
                        pass
            line = f"after {at} s mpirun's processes here: " + "; ".join(_process_line(p) for p in tree)
            self._link.send({"op": "diagnostic", "line": line[:1500]})

    def _pump(self, stream, name: str) -> None:
        lines = TaggedLines()
        for raw in iter(stream.readline, b""):
            for rank, source, text in lines.feed(raw.decode("utf-8", "replace")):
                if rank is None:  # mpirun's own words (errors, help texts): always shown
                    self.mpirun_tail.append(text)
                    self._link.send({"op": "log", "rank": 0, "stream": "mpirun", "line": text})
                    continue
                self.tails[rank].append(f"<{source}> {text}")
                if self._forward:
                    self._link.send({"op": "log", "rank": rank, "stream": source, "line": text})
        stream.close()

    def wait(self) -> int:
        rc = self.proc.wait()
        _killpg(self.proc)
        for t in self._threads:
            t.join(5)
        if rc == 0:
            reports = [{"op": "exited", "rank": rank, "returncode": 0} for rank in range(self.np)]
        else:
            reports = [self._failure_report(rc)]
        self._link.finish(reports)
        shutil.rmtree(self._workdir, ignore_errors=True)
        return rc

    def _failure_report(self, rc: int) -> dict[str, Any]:
        text = "\n".join(self.mpirun_tail)
        report: dict[str, Any] = {"op": "exited", "rank": 0, "returncode": rc}
        signaled = _SIGNALED.search(text)
        exited = _EXITED.search(text)
        if signaled:
            report.update(rank=int(signaled.group(1)), host=signaled.group(2),
                          returncode=-int(signaled.group(3)), signal=signal.Signals(int(signaled.group(3))).name)
        elif exited:
            report.update(rank=int(exited.group(1)), returncode=int(exited.group(2)))
        report["tail"] = list(self.tails.get(report["rank"], [])) + [f"<mpirun> {l}" for l in
                                                                     list(self.mpirun_tail)[-10:]]
        return report
