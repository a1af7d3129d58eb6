"""mpirun's rsh agent: ``mpi_rsh HOST COMMAND...`` runs COMMAND on HOST through that host's barrier task.

OpenMPI calls it instead of ssh to start ``orted`` on another host. The host's
RshService address and the run's secret come from mpirun's environment
(HVD_RSH_MAP, HVD_RSH_SECRET), set by mpi_launch.MpiRun.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    from airflow_provider_hvd.runner import channel as channel_mod
    from airflow_provider_hvd.runner.mpi_launch import RSH_MAP_ENV, RSH_SECRET_ENV

    args = [a for a in argv]
    while args and args[0].startswith("-"):  # ssh-style options OpenMPI may add
        args.pop(0)
    if len(args) < 2:
        print(f"mpi_rsh: usage: mpi_rsh HOST COMMAND..., got {argv}", file=sys.stderr)
        return 255
    host, command = args[0], " ".join(args[1:])
    services = json.loads(os.environ.get(RSH_MAP_ENV, "{}"))
    if host not in services:
        print(f"mpi_rsh: no barrier task serves host {host!r} (known: {sorted(services)})", file=sys.stderr)
        return 255
    address = (services[host][0], int(services[host][1]))
    channel = channel_mod.connect(address, bytes.fromhex(os.environ[RSH_SECRET_ENV]), {"role": "rsh-agent"})
    channel.send_json({"op": "exec", "command": command})
    while True:
        try:
            message = channel.recv_json()
        except channel_mod.ChannelClosed:
            print(f"mpi_rsh: the barrier task on {host} went away", file=sys.stderr)
            return 255
        if message["op"] == "out":
            stream = sys.stdout if message["stream"] == "stdout" else sys.stderr
            stream.write(message["data"])
            stream.flush()
        elif message["op"] == "exit":
            return int(message["code"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
