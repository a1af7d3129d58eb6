"""The Spark driver's output as it is shipped to storage: numbered chunks and a heartbeat.

The writer is runner/driver/log_shipper.py (the driver, where no one reads its stdout); the reader
is the Airflow side's hooks/standalone_driver.py. Both agree on these names only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

HEARTBEAT_NAME = "heartbeat.json"


def chunk_url(log_dir: str, seq: int) -> str:
    return f"{log_dir.rstrip('/')}/{seq:08d}.log"


def heartbeat_url(log_dir: str) -> str:
    return f"{log_dir.rstrip('/')}/{HEARTBEAT_NAME}"


@dataclass(frozen=True)
class Heartbeat:
    """The driver's last word: when (epoch seconds), how many chunks it has written, and, once its
    application has ended (result or error in storage, output all shipped), its exit code."""

    time: float
    chunks: int
    exit_code: int | None = None

    def to_json(self) -> bytes:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Heartbeat:
        """Raises ValueError for anything that is not a heartbeat."""
        try:
            fields = json.loads(data)
            return cls(time=float(fields["time"]), chunks=int(fields["chunks"]),
                       exit_code=None if fields.get("exit_code") is None else int(fields["exit_code"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a heartbeat: {exc}") from None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0
