"""Which launcher a run uses: mpi when OpenMPI and an MPI-enabled horovod are here, else gloo."""

from __future__ import annotations

import importlib.util
import logging
import mmap
import os
import shutil
from functools import lru_cache

from airflow_provider_hvd.runner.defaults import LAUNCHERS

log = logging.getLogger("airflow_provider_hvd.runner")


@lru_cache(maxsize=1)
def mpi_available() -> tuple[bool, str]:
    """(usable, why not): OpenMPI's mpirun on PATH and a horovod built with MPI.

    Reads the horovod extension's dynamic-library names instead of importing it
    (horovod's own mpi_built() imports torch in a subprocess: seconds per call)."""
    if not shutil.which("mpirun"):
        return False, "mpirun is not on PATH (install OpenMPI: apt-get install openmpi-bin libopenmpi-dev)"
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False, "horovod is not installed"
    torch_dir = os.path.join(list(spec.submodule_search_locations)[0], "torch")
    libs = [f for f in os.listdir(torch_dir) if f.startswith("mpi_lib") and f.endswith(".so")] \
        if os.path.isdir(torch_dir) else []
    for lib in libs:
        with open(os.path.join(torch_dir, lib), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m.find(b"libmpi.so") >= 0:
                return True, ""
    return False, "horovod was built without MPI (HOROVOD_WITH_MPI=1; rerun scripts/setup.sh)"


def resolve_launcher(launcher: str) -> str:
    """``"gloo"`` or ``"mpi"`` for a launcher option; ``"auto"`` is resolved here and logged."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher={launcher!r} is not known: use one of {', '.join(LAUNCHERS)}")
    if launcher == "gloo":
        return "gloo"
    usable, why_not = mpi_available()
    if launcher == "mpi" and not usable:
        raise ValueError(f"launcher='mpi' is not available: {why_not}. Use launcher='gloo'.")
    chosen = "mpi" if usable else "gloo"
    if launcher == "auto":
        log.info("HorovodRunner: launcher auto -> %s%s", chosen, f" ({why_not})" if why_not else "")
    return chosen
