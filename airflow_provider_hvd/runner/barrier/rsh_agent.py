"""mpirun's rsh agent: ``rsh_agent HOST COMMAND...`` runs COMMAND on HOST through that host's barrier task.

OpenMPI calls it instead of ssh to start ``orted`` on another host. The host's
RshService (rsh_service.py) address and the run's secret come from mpirun's environment
(HVD_RSH_MAP, HVD_RSH_SECRET), set by mpi_run.MpiRun. A process of its own, started by mpirun
on the barrier task's host.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    from airflow_provider_hvd.runner.barrier.mpi_output import CRASH_SIGNALS
    from airflow_provider_hvd.runner.wire import channel as channel_mod
    from airflow_provider_hvd.runner.wire.messages import Exec, Exit, Out, Stream
    from airflow_provider_hvd.runner.wire.hellos import RshAgentHello
    from airflow_provider_hvd.runner.wire.launch import DAEMON_DIED_MARKER, LaunchEnv, marker_line
    from airflow_provider_hvd.runner.wire.messages import DaemonDeath

    args = [a for a in argv]
    while args and args[0].startswith("-"):  # ssh-style options OpenMPI may add
        args.pop(0)
    if len(args) < 2:
        print(f"rsh_agent: usage: rsh_agent HOST COMMAND..., got {argv}", file=sys.stderr)
        return 255
    host, command = args[0], " ".join(args[1:])
    services = json.loads(os.environ.get(LaunchEnv.RSH_MAP, "{}"))
    if host not in services:
        print(f"rsh_agent: no barrier task serves host {host!r} (known: {sorted(services)})", file=sys.stderr)
        return 255
    address = (services[host][0], int(services[host][1]))
    channel = channel_mod.connect(address, bytes.fromhex(os.environ[LaunchEnv.RSH_SECRET]), RshAgentHello())
    channel.send_message(Exec(command=command))
    while True:
        try:
            message = channel.recv_message()
        except channel_mod.ChannelClosed:
            print(f"rsh_agent: the barrier task on {host} went away", file=sys.stderr)
            return 255
        if isinstance(message, Out):
            stream = sys.stdout if message.stream == Stream.STDOUT else sys.stderr
            stream.write(message.data)
            stream.flush()
        elif isinstance(message, Exit):
            code = int(message.code)
            died_of = _signal_of(code)
            if died_of in CRASH_SIGNALS:  # say it in a line mpirun passes on and the launcher recognises
                print(marker_line(DAEMON_DIED_MARKER, DaemonDeath(host=host, signal=died_of, code=code)),
                      file=sys.stderr, flush=True)
            return code


def _signal_of(code: int) -> str | None:
    """The signal's name when ``code`` says the command died of one: negative from the service's
    wait(), or 128 + n from the shell that ran orted (``/bin/sh -c``)."""
    import signal

    number = -code if code < 0 else code - 128 if 128 < code < 128 + 65 else None
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
