"""Tie a process's life to its parent's: every process a run starts must end with the run."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1

# Resolved once, here, in the parent: die_with_parent also runs as a subprocess preexec_fn,
# in a child forked from a process with many threads, where loading a library (dlopen's
# lock) or importing a module (the import locks) can deadlock on a lock another thread
# held at fork time. So the child only makes the call.
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) dies.
    Linux only; returns False where it is not available."""
    return _prctl is not None and _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
