"""Ending the processes a run started, whole trees of them, and describing them when they hang.

Ranks, mpirun and orted run in process groups of their own (``start_new_session``), and
their children (DataLoader workers, ranks under orted) may sit in other groups still, so
stopping one means its group *and* the descendants found before the kill.
"""

from __future__ import annotations

import os
import signal
import subprocess


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (it leads one: started with ``start_new_session``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid: int) -> list:
    """Every live descendant of ``pid`` (psutil processes), found before anything is killed."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_all(procs: list) -> None:
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s group and every descendant, wherever its group."""
    found = descendants(proc.pid)
    kill_group(proc)
    kill_all(found)


def stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the group first, so the leader (mpirun) ends its job its own way; after ``grace``
    seconds SIGKILL whatever is left of the tree. A child that has not yet run a line of ours
    (a rank stuck importing) does not know to die with its parent, hence the tree."""
    found = descendants(proc.pid)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    kill_group(proc)
    kill_all(found + descendants(proc.pid))


def process_line(proc) -> str:
    """One process for a diagnostic line: name, pid, state, the kernel wait channel, command."""
    import psutil

    try:
        with open(f"/proc/{proc.pid}/wchan") as f:
            wchan = f.read().strip() or "-"
    except OSError:
        wchan = "?"
    try:
        cmd = " ".join(proc.cmdline())[:90]
        return f"{proc.name()}[{proc.pid}] {proc.status()} wchan={wchan}: {cmd}"
    except psutil.Error:
        return f"[{proc.pid}] gone"
