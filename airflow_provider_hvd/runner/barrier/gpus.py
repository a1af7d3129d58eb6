"""GPU pinning: one rank, one GPU.

Barrier mode: Spark assigns GPUs to tasks (``spark.task.resource.gpu.amount``);
each rank sees exactly its task's addresses through CUDA_VISIBLE_DEVICES, so its
GPU is device 0 of what it sees (``hvd.local_rank() % torch.cuda.device_count()``
in training code covers both this and an unpinned rank).
Local mode: ranks are pinned round-robin by local rank over the driver's GPUs.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def task_gpu_addresses(ctx) -> list[str] | None:
    """The GPU addresses Spark assigned to this barrier task, or None when it assigns none."""
    resource = ctx.resources().get("gpu")
    if resource is None:
        return None
    return list(resource.addresses)


def driver_gpus() -> list[str]:
    """GPUs the driver may use: its CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


def local_rank_gpu(gpus: list[str], local_rank: int) -> str:
    return gpus[local_rank % len(gpus)]
