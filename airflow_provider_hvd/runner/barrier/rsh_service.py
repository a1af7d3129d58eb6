"""Each barrier task's rsh service (launcher="mpi"): starts orted on this host for mpirun, for holders of the secret.

OpenMPI reaches other hosts through its rsh agent (rsh_agent.py), which asks the
barrier task on that host to run the ``orted`` command instead of going through ssh.
Only peers that hold the run's secret get a command run (wire/channel.py); the command's
output and exit code go back to the agent, and when the agent (so mpirun) goes away,
everything the command started is killed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any

from airflow_provider_hvd.runner.common.processes import kill_group, kill_tree
from airflow_provider_hvd.runner.barrier.rank_environment import rank_base_env
from airflow_provider_hvd.runner.wire import channel as channel_mod
from airflow_provider_hvd.runner.wire.messages import Exec, Exit, Out, Stream
from airflow_provider_hvd.runner.wire.launch import LaunchEnv


# Where an Open MPI daemon keeps its session directory (default /tmp/ompi.<hostname>.<uid>/jf.<job family>).
# Open MPI expects one daemon per machine and job: each one, starting, wipes its job family's directory
# ("stale directories laying around") and then builds its own tree there. Two barrier tasks on one machine
# (two Spark workers with their own addresses) are two hosts to mpirun, with one hostname and one /tmp:
# mpirun and the orted share that directory, and an orted dies in orte_session_dir when it vanishes
# under it. Each orted gets a folder of its own, removed after it; mpirun keeps the default (it would
# hand its own value to every orted).
OWN_SESSION_DIR = "OMPI_MCA_orte_tmpdir_base"


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
        request = channel.recv_message()
        if not isinstance(request, Exec):
            return
        # orted's session directory in a folder of its own, removed once it ended (OWN_SESSION_DIR).
        session_dir = tempfile.mkdtemp(prefix="hvd-orted-")
        proc = subprocess.Popen(["/bin/sh", "-c", request.command], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env={**rank_base_env(), **this_hosts_rank_env(), OWN_SESSION_DIR: session_dir})
        with self._lock:
            self._procs.add(proc)

        def pump(stream, name: Stream) -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                try:
                    channel.send_message(Out(stream=name, data=chunk.decode("utf-8", "replace")))
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
        shutil.rmtree(session_dir, ignore_errors=True)
        with self._lock:
            self._procs.discard(proc)
        try:
            channel.send_message(Exit(code=code))
        except OSError:
            pass

    def close(self) -> None:
        self._server.close()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            kill_tree(proc)
