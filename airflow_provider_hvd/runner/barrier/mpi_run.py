"""launcher="mpi": mpirun for every rank, started from the barrier task that holds rank 0, no ssh.

As in Databricks' HorovodRunner, the task holding rank 0 starts ``mpirun`` for all
ranks. OpenMPI reaches other hosts through its rsh agent (``plm_rsh_agent``), which
here is rsh_agent.py: it asks the *barrier task on that host* to run the ``orted``
command (rsh_service.py), so nothing but a holder of the run's secret can start a
process there. mpirun's ``--tag-output`` lines are split back into per-rank lines
(mpi_output.py); its exit is reported per rank to the driver like the gloo launcher's.
In local mode (np < 0) the driver runs one MpiRun itself, for host ``localhost``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from airflow_provider_hvd.runner.common.lifetime import die_with_parent
from airflow_provider_hvd.runner.common.processes import kill_group, process_line, stop_tree
from airflow_provider_hvd.runner.barrier.driver_link import DriverLink
from airflow_provider_hvd.runner.barrier.mpi_output import TaggedOutput, failure_report
from airflow_provider_hvd.runner.barrier.output_lines import LineAssembler, pump
from airflow_provider_hvd.runner.barrier.rsh_service import OWN_SESSION_DIR, this_hosts_rank_env
from airflow_provider_hvd.runner.wire.messages import Diagnostic, Exited, Log, Stream
from airflow_provider_hvd.runner.wire.hellos import LauncherHello
from airflow_provider_hvd.runner.wire.launch import LaunchEnv, RANK_MAIN_MODULE, RSH_AGENT_MODULE

# mpirun's application: a rank under its own host's Python, in its own executor's directory.
_RANK_COMMAND = ('cd "$%s" || exit 70; exec "$%s" -u -m %s --mpi'
                 % (LaunchEnv.RANK_CWD, LaunchEnv.RANK_PYTHON, RANK_MAIN_MODULE))
# When a start hangs, MpiRun sends a snapshot of its processes this many seconds in.
_START_SNAPSHOTS_S = (2, 10, 30, 60, 100, 150, 220)


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


class MpiRun:
    """mpirun for all ranks, reported to the driver as one launcher holding every rank.

    Everything is decided in ``__init__`` (the command, its environment, the rsh agent
    script); ``start`` connects to the driver and starts mpirun, ``wait`` reports its end."""

    def __init__(self, *, hosts: list[tuple[str, int]], rsh: dict[str, tuple[str, int]], iface: str,
                 env: dict[str, str], rank_env: dict[str, str], driver: tuple[str, int], secret: bytes,
                 forward_output: bool, timeline_interval: float | None, extra_args: list[str]):
        self.np = sum(n for _, n in hosts)
        self._hosts = hosts
        self._driver = driver
        self._secret = secret
        self._forward = forward_output
        self._timeline_interval = timeline_interval
        self.tails: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=30))
        self.mpirun_tail: collections.deque[str] = collections.deque(maxlen=60)
        self.proc: subprocess.Popen | None = None
        self._link: DriverLink | None = None
        self._threads: list[threading.Thread] = []
        self._workdir = tempfile.mkdtemp(prefix="hvd-mpi-")
        self._timeline_file = os.path.join(self._workdir, "timeline.json") if timeline_interval else None
        rank_env = {**rank_env, LaunchEnv.DRIVER: f"{driver[0]}:{driver[1]}", LaunchEnv.SECRET: secret.hex(),
                    "PYTHONUNBUFFERED": "1"}
        if self._timeline_file:
            # Every rank needs it (see rank_process.py); only rank 0, on this host, writes the file.
            rank_env["HOROVOD_TIMELINE"] = self._timeline_file
        self.command = self._mpirun_command(rank_env, iface, list(extra_args))
        self.launch_env = {**{k: v for k, v in env.items() if k != "HOROVOD_TIMELINE"}, **rank_env,
                           **this_hosts_rank_env(), LaunchEnv.RSH_SECRET: secret.hex(),
                           LaunchEnv.RSH_MAP: json.dumps({h: list(a) for h, a in rsh.items()})}
        # mpirun hands its own session directory setting to every orted on its command line: left to its
        # default, so that each orted takes the one of its own (rsh_service.OWN_SESSION_DIR).
        self.launch_env.pop(OWN_SESSION_DIR, None)

    def _rsh_agent(self) -> str:
        """What Open MPI runs to start orted on a host: our rsh agent. Every orted looks it up again on its
        own host (plm rsh's component query finds the agent's first word there, or the daemon dies with
        "FORCE-TERMINATE AT Not found"), so it must name something every host has: this Python, at the
        same path on every Spark host (spark.pyspark.python), with the agent's module. Never a script
        in this host's /tmp, which another host's /tmp does not have (found on hosts with their own disks:
        tests/test_production_shape.py)."""
        if " " not in sys.executable:
            return f"{sys.executable} -m {RSH_AGENT_MODULE}"
        # Open MPI splits the agent on spaces: a Python whose path has one goes through a script,
        # which then must exist on every host at the same path (a shared /tmp).
        agent = os.path.join(self._workdir, "rsh-agent")
        with open(agent, "w") as f:
            f.write(f"#!/bin/sh\nexec '{sys.executable}' -m {RSH_AGENT_MODULE} \"$@\"\n")
        os.chmod(agent, 0o700)
        return agent

    def _mpirun_command(self, rank_env: dict[str, str], iface: str, extra_args: list[str]) -> list[str]:
        cmd = ["mpirun"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["--tag-output", "-np", str(self.np), "-H", ",".join(f"{h}:{n}" for h, n in self._hosts),
                "--bind-to", "none", "--map-by", "slot", "--oversubscribe",
                "-mca", "plm_rsh_agent", self._rsh_agent(), "-mca", "plm_rsh_no_tree_spawn", "1",
                # orted stays attached to the barrier task that started it: a daemonizing orted can
                # vanish before calling back, and mpirun then waits forever; attached, its end is
                # seen and reported by the rsh agent.
                "-mca", "orte_leave_session_attached", "1",
                # No topology in shared memory: Open MPI 4.1's rtc/hwloc writes it into the session
                # directory's hwloc.sm, and daemons that share a /tmp write the same file at once
                # (SIGSEGV in hwloc_shmem_topology_write); ranks read the topology themselves.
                "-mca", "rtc_hwloc_vmhole", "none",
                "-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface]
        for name in sorted(rank_env):
            cmd += ["-x", str(name)]
        return cmd + [*extra_args, "/bin/sh", "-c", _RANK_COMMAND]

    def start(self) -> None:
        self._link = DriverLink(self._driver, self._secret,
                                LauncherHello(rank=0, ranks=list(range(self.np)), host=self._hosts[0][0],
                                              hostname=socket.gethostname(), pid=os.getpid(),
                                              hosts=[h for h, n in self._hosts for _ in range(n)]))
        # mpirun ends its job on SIGTERM; it gets one when this launcher's thread dies (a killed
        # Spark task or driver), so its ranks never outlive the run.
        cmd, preexec = _with_parent_death_signal(self.command)
        self.proc = subprocess.Popen(cmd, env=self.launch_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, preexec_fn=preexec)
        for stream, name in ((self.proc.stdout, Stream.STDOUT), (self.proc.stderr, Stream.STDERR)):
            t = threading.Thread(target=self._pump, args=(stream, name), daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._snapshot_while_running, name="hvd-mpirun-snapshots", daemon=True).start()
        self._link.on_stop(self.stop)
        if self._timeline_file:
            self._link.ship_timeline(self._timeline_file, self._timeline_interval)

    def stop(self) -> None:
        """End mpirun's job (SIGTERM, then SIGKILL for whatever is left of its tree)."""
        if self.proc is not None:
            stop_tree(self.proc)

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
            line = f"after {at} s mpirun's processes here: " + "; ".join(process_line(p) for p in tree)
            self._link.send(Diagnostic(line=line[:1500]))

    def _pump(self, stream, name: Stream) -> None:
        tagged = TaggedOutput()
        assemblers: dict[tuple[int, str] | None, LineAssembler] = {}

        def show(key: tuple[int, str] | None, text: str) -> None:
            if key is None:  # mpirun's own words (errors, help texts): always shown
                self.mpirun_tail.append(text)
                self._link.send(Log(line=text, stream=Stream.MPIRUN, rank=0))
                return
            rank, source = key
            self.tails[rank].append(f"<{source}> {text}")
            if self._forward:
                self._link.send(Log(line=text, stream=source, rank=rank))

        def feed(text: str, final: bool = False) -> None:
            for key, piece in tagged.feed(text, final=final):
                if key not in assemblers:
                    assemblers[key] = LineAssembler(lambda line, key=key: show(key, line))
                assemblers[key].feed(piece)

        pump(stream, feed, assemblers.values, end=lambda: feed("", final=True))

    def wait(self) -> int:
        rc = self.proc.wait()
        kill_group(self.proc)
        for t in self._threads:
            t.join(5)
        if rc == 0:
            reports = [Exited(rank=rank, returncode=0) for rank in range(self.np)]
        else:
            reports = [failure_report(rc, list(self.mpirun_tail), self.tails, mpirun_host=self._hosts[0][0])]
        self._link.finish(reports)
        shutil.rmtree(self._workdir, ignore_errors=True)
        return rc
