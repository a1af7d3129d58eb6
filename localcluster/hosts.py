"""The hosts of the production shape on one machine, and what each plays of docker/compose.yaml.

Every host is a Linux network namespace of its own (``hvd-<name>``) with an address on the data
network, a private bridge that lives in a namespace of its own (``hvd-switch``), so the machine's
own namespace has no interface on it, no route to it, and no host has a route out of it. Each host
also has its own mount namespace: a private ``/tmp`` and a private ``/var/lib/hvd-host`` (its work
directory, logs, data), and ``/etc/hosts`` naming every host, as Docker's DNS does in compose. The
Spark hosts also have a management interface, ``eth0``, on a network no other host reaches (as on
GPU nodes, where the first interface is often not the one the nodes talk over).
"""

from __future__ import annotations

from dataclasses import dataclass

DATA_NET = "10.77.0"     # /24, the network every host talks over (eth1)
MGMT_NET = "10.88.0"     # /24, each Spark host's own dead-end management link (eth0)
DATA_IFACE = "eth1"
MGMT_IFACE = "eth0"
SWITCH_NS = "hvd-switch"
BRIDGE = "br-data"
HOST_DIR = "/var/lib/hvd-host"   # each host's private work directory (a bind mount of its own folder)

SPARK_MASTER_PORT = 7077
SPARK_REST_PORT = 6066
SPARK_UI_PORT = 8080
S3_PORT = 9000
POSTGRES_PORT = 5432
AIRFLOW_API_PORT = 8080


@dataclass(frozen=True)
class Host:
    name: str          # its hostname, resolvable on every host
    octet: int         # its address: DATA_NET.<octet> (and MGMT_NET.<octet> with a management link)
    plays: str         # the compose service(s) it stands for
    management: bool = False

    @property
    def netns(self) -> str:
        return f"hvd-{self.name}"

    @property
    def address(self) -> str:
        return f"{DATA_NET}.{self.octet}"

    @property
    def management_address(self) -> str | None:
        return f"{MGMT_NET}.{self.octet}" if self.management else None


HOSTS = (
    Host("postgres", 11, "postgres"),
    Host("s3", 12, "minio (here moto's S3 server, an emulator)"),
    Host("spark-master", 2, "spark-master", management=True),
    Host("spark-worker-1", 3, "spark-worker-1", management=True),
    Host("spark-worker-2", 4, "spark-worker-2", management=True),
    Host("airflow", 10, "airflow-apiserver, airflow-scheduler, airflow-dag-processor, airflow-triggerer, "
                        "airflow-init"),
)
BY_NAME = {h.name: h for h in HOSTS}
SPARK_WORKERS = tuple(h for h in HOSTS if h.name.startswith("spark-worker"))


def etc_hosts() -> str:
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"{h.address} {h.name}" for h in HOSTS]
    return "\n".join(lines) + "\n"
