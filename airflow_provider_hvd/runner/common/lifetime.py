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


def when_process_ends(pid: int, callback, poll_interval: float = 1.0) -> bool:
    """Call ``callback()`` from a daemon thread once process ``pid`` (not our parent: any process of
    this host) has ended; at once if it is gone already. A pidfd where the kernel has them (5.3+):
    woken by the exit itself, immune to the pid being reused; else a poll every ``poll_interval``.
    Returns False when ``pid`` is not a process it may watch (then nothing is called)."""
    import os
    import select
    import threading

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        threading.Thread(target=callback, name="hvd-owner-gone", daemon=True).start()
        return True
    except (AttributeError, OSError):
        fd = None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            threading.Thread(target=callback, name="hvd-owner-gone", daemon=True).start()
            return True
        except PermissionError:
            return False

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])
            os.close(fd)
        else:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                threading.Event().wait(poll_interval)
        callback()

    threading.Thread(target=wait, name="hvd-owner-watch", daemon=True).start()
    return True
