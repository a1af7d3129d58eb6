"""The first frame of every connection: who the peer is (its ``Role``), and what it says of itself."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_provider_hvd.runner.wire.messages import Role
from airflow_provider_hvd.runner.wire.records import TaskInfo, as_type, from_fields

_BY_ROLE: dict[Role, type[Hello]] = {}


@dataclass(frozen=True)
class Hello:
    role: ClassVar[Role]

    def __init_subclass__(cls, role: Role | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if role is not None:
            cls.role = role
            _BY_ROLE[role] = cls

    def to_wire(self) -> dict[str, Any]:
        return {"role": self.role, **dataclasses.asdict(self)}


def parse_hello(data: dict[str, Any]) -> Hello:
    role = Role(data.get("role"))
    try:
        return from_fields(_BY_ROLE[role], data)
    except TypeError as exc:
        raise ValueError(f"a {role} hello without its fields: {exc}") from None


@dataclass(frozen=True)
class TaskHello(Hello, role=Role.TASK):
    partition: int
    info: TaskInfo

    def __post_init__(self) -> None:
        object.__setattr__(self, "info", as_type(TaskInfo, self.info))


@dataclass(frozen=True)
class KvHello(Hello, role=Role.KV):
    rank: int = -1


@dataclass(frozen=True)
class LauncherHello(Hello, role=Role.LAUNCHER):
    rank: int
    host: str = "?"
    pid: int | None = None
    ranks: list[int] | None = None  # mpirun's launcher speaks for every rank ...
    hosts: list[str] | None = None  # ... on every host
    hostname: str | None = None


@dataclass(frozen=True)
class RankHello(Hello, role=Role.RANK):
    rank: int
    host: str | None = None
    pid: int | None = None


@dataclass(frozen=True)
class RshAgentHello(Hello, role=Role.RSH_AGENT):
    pass
