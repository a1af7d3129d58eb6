"""Rank assignment, host by host, and the HOROVOD_* environment of each rank.

Ranks are numbered host by host (all of the first host's tasks, then the next
host's), as ``horovodrun`` does, so that ``local_rank``/``local_size`` count the
ranks sharing a host and ``cross_rank``/``cross_size`` count the hosts that have
a rank with the same ``local_rank``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str


def assign_slots(task_hosts: list[str]) -> list[Slot]:
    """``task_hosts[i]`` is the host of task i; return the Slot of each task, in task order."""
    hosts: list[str] = []
    tasks_of: dict[str, list[int]] = {}
    for task, host in enumerate(task_hosts):
        if host not in tasks_of:
            hosts.append(host)
            tasks_of[host] = []
        tasks_of[host].append(task)
    size = len(task_hosts)
    slots: list[Slot | None] = [None] * size
    rank = 0
    for host in hosts:
        local_size = len(tasks_of[host])
        for local_rank, task in enumerate(tasks_of[host]):
            peers = [h for h in hosts if len(tasks_of[h]) > local_rank]
            slots[task] = Slot(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                               cross_rank=peers.index(host), cross_size=len(peers), hostname=host)
            rank += 1
    return slots  # type: ignore[return-value]


def gloo_env(slot: Slot, *, iface: str) -> dict[str, str]:
    """What a gloo rank needs, but the rendezvous address (its launcher's proxy, see
    rendezvous.py). HOROVOD_CONTROLLER=gloo is explicit: on an MPI-enabled build, gloo
    ranks without it each come up alone with size 1."""
    return {
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "NCCL_SOCKET_IFNAME": iface,
    }
