"""Each barrier task's rsh service (launcher="mpi"): starts orted on this host for mpirun, for holders of the secret.

OpenMPI reaches other hosts through its rsh agent (rsh_agent.py), which asks the
barrier task on that host to run the ``orted`` command instead of going through ssh.
Only peers that hold the run's secret get a command run (wire/channel.py); the command's
output and exit code go back to the agent, and when the agent (so mpirun) goes away,
everything the command started is killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

from airflow_provider_hvd.runner.common.processes import kill_group, kill_tree
from airflow_provider_hvd.runner.task.rank_environment import rank_base_env
from airflow_provider_hvd.runner.wire import channel as channel_mod
from airflow_provider_hvd.runner.wire.messages import LaunchEnv, Op, Stream


def this_hosts_rank_env() -> dict[str, str]:
    """The Python and working directory ranks on this host run under: this executor's own."""
    return {LaunchEnv.RANK_PYTHON: sys.executable, LaunchEnv.RANK_CWD: os.getcwd()}


class RshService:
    """Runs the commands mpirun's rsh agent sends to this host (orted), for holders of the secret."""

    def __init__(self, secret: bytes):
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._server = channel_mod.ChannelServer(secret, self._handle, name="hvd-rsh-service")
        self.port = self._server.port

    def _handle(self, channel: channel_mod.Channel, hello: dict[str, Any]) -> None:
        request = channel.recv_json()
        if request.get("op") != Op.EXEC:
            return
        proc = subprocess.Popen(["/bin/sh", "-c", request["command"]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env={**rank_base_env(), **this_hosts_rank_env()})
        with self._lock:
            self._procs.add(proc)

        def pump(stream, name: Stream) -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                try:
                    channel.send_json({"op": Op.OUT, "stream": name, "data": chunk.decode("utf-8", "replace")})
                except OSError:
                    break

        pumps = [threading.Thread(target=pump, args=(proc.stdout, Stream.STDOUT), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, Stream.STDERR), daemon=True)]
        for t in pumps:
            t.start()

        def agent_gone() -> None:  # the agent (and so mpirun) went away: stop what it started
            channel.read_until(None)
            kill_tree(proc)

        threading.Thread(target=agent_gone, daemon=True).start()
        code = proc.wait()
        for t in pumps:
            t.join(5)
        kill_group(proc)
        with self._lock:
            self._procs.discard(proc)
        try:
            channel.send_json({"op": Op.EXIT, "code": code})
        except OSError:
            pass

    def close(self) -> None:
        self._server.close()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            kill_tree(proc)
