"""`make cluster` / `make cluster-down`: the production shape on this machine (localcluster/).

    python -m localcluster up [--api-port 8080]   start every host and service; print how to reach them
    python -m localcluster down                   stop everything: no process, namespace, mount or port left
    python -m localcluster exec HOST CMD...       run a command on one host, in its services' environment
                                                  (as `docker compose exec`)
    python -m localcluster login                  print the Airflow UI's user and password
    python -m localcluster restart HOST SERVICE [--crash]
                                                  stop one service (SIGTERM; --crash: SIGKILL) and start it
                                                  again (as `docker compose restart`), e.g. airflow triggerer
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from localcluster import namespaces
from localcluster.services import Cluster
from localcluster.hosts import HOSTS

STATE = Path(os.environ.get("HVD_CLUSTER_STATE", namespaces.REPO / ".cluster"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up")
    up.add_argument("--api-port", type=int, default=int(os.environ.get("HVD_CLUSTER_API_PORT", "8080")))
    sub.add_parser("down")
    sub.add_parser("login")
    run = sub.add_parser("exec")
    run.add_argument("host", choices=[h.name for h in HOSTS])
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    restart = sub.add_parser("restart")
    restart.add_argument("host", choices=[h.name for h in HOSTS])
    restart.add_argument("service")
    restart.add_argument("--crash", action="store_true", help="SIGKILL instead of SIGTERM")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("namespaces, bridges and mounts need root: run it as root (sudo make cluster)")
    cluster = Cluster(STATE)
    if args.command == "up":
        cluster.up(args.api_port)
        print(f"cluster up; state and logs in {STATE}/hosts/<host>/logs")
        for host in HOSTS:
            print(f"  {host.name:15} {host.address:11} plays {host.plays}")
        print(f"Airflow UI and REST API: http://127.0.0.1:{args.api_port} (forwarded into host airflow); "
              f"user {cluster.login()[0]}, password: python -m localcluster login")
        print("The DAGs appear there once the dag-processor has parsed them (under a minute).")
        return 0
    if args.command == "down":
        killed = cluster.down()
        for line in killed:
            # destroy()'s lines name a process; aborted_stacks()' say what it was doing.
            print(line if line.startswith("stacks written") else f"had to SIGKILL {line}")
        print("cluster down: no process, namespace or mount left")
        return 0
    if not cluster.info:
        parser.error("no cluster is up: make cluster")
    if args.command == "login":
        user, password = cluster.login()
        print(f"user: {user}\npassword: {password}")
        return 0
    if args.command == "restart":
        try:
            pid = cluster.restart(args.host, args.service, crash=args.crash)
        except KeyError as exc:
            parser.error(str(exc.args[0]))
        print(f"{args.service} on {args.host} restarted (pid {pid})")
        return 0
    os.chdir("/")
    os.execvpe("nsenter", [*namespaces.enter(cluster.info["holders"][args.host]), *args.cmd],
               cluster.host_env(args.host))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
