"""Reading mpirun's output: per-rank lines out of ``--tag-output``, and which rank ended the job, how."""

from __future__ import annotations

import json
import re
import signal
from typing import Any

from airflow_provider_hvd.runner.wire.messages import DAEMON_DIED_MARKER, Op, Stream

_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
_SIGNALED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_EXITED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)", re.S)
# Signals that mean a process crashed, as opposed to being stopped (TERM, INT) or killed (KILL:
# our own stop, a lost executor, the OOM killer), which have messages of their own.
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP"})
_DAEMON_DIED = re.compile(re.escape(DAEMON_DIED_MARKER) + r"(\{.*?\})\s*$", re.M)


class TaggedLines:
    """Splits mpirun's ``--tag-output`` back into whole lines per rank.

    mpirun tags each chunk it reads from a rank, not each line: a rank's line can
    arrive as ``[1,0]<stdout>:first half`` directly followed, on the same output
    line, by ``[1,1]<stdout>:another rank's line`` and later ``[1,0]<stdout>:second half``.
    A tagged segment followed by another tag on the same line is such a partial
    chunk; it is kept until the same rank's stream ends a line.
    """

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}

    def feed(self, line: str) -> list[tuple[int | None, str, str]]:
        """One line of mpirun's output -> ``(rank, stream, text)`` per whole line; rank None for mpirun's own."""
        ended = line.endswith("\n")
        line = line.rstrip("\n")
        tags = list(_TAG.finditer(line))
        out: list[tuple[int | None, str, str]] = []
        if not tags or tags[0].start() > 0:
            out.append((None, Stream.MPIRUN, line[: tags[0].start()] if tags else line))
        for i, tag in enumerate(tags):
            key = (int(tag.group(1)), tag.group(2))
            text = line[tag.end(): tags[i + 1].start() if i + 1 < len(tags) else len(line)]
            if i + 1 < len(tags) or not ended:
                self._partial[key] = self._partial.get(key, "") + text
            else:
                out.append((key[0], key[1], self._partial.pop(key, "") + text))
        return out


def failure_report(returncode: int, mpirun_lines: list[str], rank_tails: dict[int, list[str]],
                   mpirun_host: str = "?") -> dict[str, Any]:
    """The EXITED report for a failed mpirun: the rank mpirun names as the one that ended the job
    (killed by a signal, or exited non-zero), with its last lines and mpirun's; rank 0 otherwise.
    When an Open MPI process itself died of a signal (an orted, as the rsh agent reports it, or
    mpirun), ``daemon`` says which, on which host: that is Open MPI crashing, not the ranks."""
    text = "\n".join(mpirun_lines)
    report: dict[str, Any] = {"op": Op.EXITED, "rank": 0, "returncode": returncode}
    died = _DAEMON_DIED.search(text)
    if died:
        try:
            report["daemon"] = {"process": "orted", **json.loads(died.group(1))}
        except ValueError:
            pass
    elif returncode < 0 and signal.Signals(-returncode).name in CRASH_SIGNALS:
        report["daemon"] = {"process": "mpirun", "host": mpirun_host,
                            "signal": signal.Signals(-returncode).name, "code": returncode}
    signaled = _SIGNALED.search(text)
    exited = _EXITED.search(text)
    if signaled:
        report.update(rank=int(signaled.group(1)), host=signaled.group(2),
                      returncode=-int(signaled.group(3)), signal=signal.Signals(int(signaled.group(3))).name)
    elif exited:
        report.update(rank=int(exited.group(1)), returncode=int(exited.group(2)))
    # Open MPI's own account of a crash (the daemon's backtrace, its help text) runs longer.
    keep = 40 if "daemon" in report else 10
    report["tail"] = list(rank_tails.get(report["rank"], [])) + [f"<mpirun> {line}" for line in mpirun_lines[-keep:]
                                                                 if not line.startswith(DAEMON_DIED_MARKER)]
    return report
