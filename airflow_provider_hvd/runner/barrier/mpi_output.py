"""Reading mpirun's output: each rank's text out of ``--tag-output``, and which rank ended the job, how."""

from __future__ import annotations

import dataclasses
import re
import signal

from airflow_provider_hvd.runner.wire.messages import DaemonDeath, Exited
from airflow_provider_hvd.runner.wire.launch import DAEMON_DIED_MARKER, find_marked

_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
# What a read can leave of a tag at the end of the data: "[", "[1,0", "[1,0]<std", ...
_TAG_START = re.compile(r"\[\d*(?:,\d*(?:\](?:<[a-z]*>?)?)?)?$")
_SIGNALED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_EXITED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)", re.S)
# Signals that mean a process crashed, as opposed to being stopped (TERM, INT) or killed (KILL:
# our own stop, a lost executor, the OOM killer), which have messages of their own.
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP"})
_DAEMONS_NOT_STARTED = "unable to reliably start one or more daemons"


class TaggedOutput:
    """Splits mpirun's ``--tag-output`` stream back into each rank's own text.

    mpirun tags each chunk it reads from a rank, not each line, and passes it on at once: a
    rank's line can arrive as ``[1,0]<stdout>:first half`` directly followed, on the same
    output line, by ``[1,1]<stdout>:another rank's line`` and later ``[1,0]<stdout>:second half``;
    a progress bar redrawn with ``\\r`` arrives as ``[1,0]<stderr>:\\r 40%|####`` chunks with no
    newline until it is done. After a newline mpirun tags again; untagged text is its own.
    ``feed`` takes whatever was read and returns ``(key, text)`` pieces, key ``(rank, stream)``
    or None for mpirun's own words; a tag cut by the read is kept until the rest arrives.
    """

    def __init__(self) -> None:
        self._key: tuple[int, str] | None = None
        self._held = ""

    def feed(self, data: str, final: bool = False) -> list[tuple[tuple[int, str] | None, str]]:
        data, self._held = self._held + data, ""
        out: list[tuple[tuple[int, str] | None, str]] = []
        while data:
            tag = _TAG.search(data)
            newline = data.find("\n")
            if tag is not None and tag.start() == 0:
                self._key = (int(tag.group(1)), tag.group(2))
                data = data[tag.end():]
            elif newline >= 0 and (tag is None or newline < tag.start()):
                out.append((self._key, data[: newline + 1]))
                self._key, data = None, data[newline + 1:]
            else:
                text = data[: tag.start()] if tag is not None else data
                cut = _TAG_START.search(text) if tag is None and not final else None
                if cut is not None:  # the start of a tag whose rest is still in the pipe
                    text, self._held = text[: cut.start()], text[cut.start():]
                if text:
                    out.append((self._key, text))
                data = data[len(text) + len(self._held):]
        return out


def failure_report(returncode: int, mpirun_lines: list[str], rank_tails: dict[int, list[str]],
                   mpirun_host: str = "?") -> Exited:
    """The EXITED report for a failed mpirun: the rank mpirun names as the one that ended the job
    (killed by a signal, or exited non-zero), with its last lines and mpirun's; rank 0 otherwise.
    When an Open MPI process itself died of a signal (an orted, as the rsh agent reports it, or
    mpirun), ``daemon`` says which, on which host: that is Open MPI crashing, not the ranks."""
    text = "\n".join(mpirun_lines)
    daemon = find_marked(DAEMON_DIED_MARKER, DaemonDeath, text)
    if daemon is None and returncode < 0 and signal.Signals(-returncode).name in CRASH_SIGNALS:
        daemon = DaemonDeath(process="mpirun", host=mpirun_host, signal=signal.Signals(-returncode).name,
                             code=returncode)
    report = Exited(rank=0, returncode=returncode, daemon=daemon)
    signaled = _SIGNALED.search(text)
    exited = _EXITED.search(text)
    if signaled:
        report = dataclasses.replace(report, rank=int(signaled.group(1)), host=signaled.group(2),
                                     returncode=-int(signaled.group(3)),
                                     signal=signal.Signals(int(signaled.group(3))).name)
    elif exited:
        report = dataclasses.replace(report, rank=int(exited.group(1)), returncode=int(exited.group(2)))
    # Open MPI's own account of a crash (the daemon's backtrace, its help text) runs longer, and so
    # does its account of daemons that never started: what the daemon or its launch said comes
    # before a 20-line help text.
    keep = 40 if daemon is not None or _DAEMONS_NOT_STARTED in text else 10
    tail = list(rank_tails.get(report.rank, [])) + [f"<mpirun> {line}" for line in mpirun_lines[-keep:]
                                                    if not line.startswith(DAEMON_DIED_MARKER)]
    return dataclasses.replace(report, tail=tail)
