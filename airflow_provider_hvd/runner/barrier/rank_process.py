"""Start one rank as a fresh Python process, stream its output, report how it ended.

Used by both launches: the driver runs one per rank in local mode, and each
barrier task runs one for its rank. The launcher holds its own channel to the
driver: it forwards the rank's stdout/stderr line by line (``driver_log_verbosity="all"``; progress
bars redrawn with ``\r`` as their latest state once a second, output_lines.py),
keeps the last lines for error messages, and reports the exit code or signal.
When the driver closes that channel (the run ended or failed), the launcher kills
the rank's whole process group, so no rank outlives its run. It also serves the
rank's gloo rendezvous on loopback and forwards it to the driver (rendezvous_proxy.py).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from airflow_provider_hvd.runner.common.processes import kill_group
from airflow_provider_hvd.runner.barrier.driver_link import DriverLink
from airflow_provider_hvd.runner.barrier.output_lines import LineAssembler, pump
from airflow_provider_hvd.runner.barrier.rendezvous_proxy import RendezvousProxy
from airflow_provider_hvd.runner.wire.messages import Exited, Log, Stream
from airflow_provider_hvd.runner.wire.hellos import LauncherHello
from airflow_provider_hvd.runner.wire.launch import RANK_MAIN_MODULE

TAIL_LINES = 30


class RankProcess:
    def __init__(self, *, rank: int, host: str, env: dict[str, str], driver: tuple[str, int],
                 secret: bytes, forward_output: bool, timeline_interval: float | None = None):
        self.rank = rank
        self.host = host
        # Horovod's timeline is recorded by rank 0 only, into a file of our own that we
        # ship to the driver; a HOROVOD_TIMELINE inherited from the driver must not
        # make every rank of a host write one file.
        self._env = {k: v for k, v in env.items() if k != "HOROVOD_TIMELINE"}
        if timeline_interval is not None and rank != 0:
            # Every rank must have the timeline enabled (the coordinator exchanges timeline
            # state with them, and ranks that disagree deadlock); only rank 0 writes a file.
            self._env["HOROVOD_TIMELINE"] = "DYNAMIC"
        self._timeline_interval = timeline_interval if rank == 0 else None
        self._timeline_dir: str | None = None
        self._driver = driver
        self._secret = secret
        self._forward = forward_output
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._stopped_by_driver = threading.Event()
        self.proc: subprocess.Popen | None = None
        self._link: DriverLink | None = None
        self._rendezvous: RendezvousProxy | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Connect to the driver, then spawn the rank. Call from a thread that outlives the rank
        (the rank dies with the thread that started it, through PR_SET_PDEATHSIG)."""
        self._link = DriverLink(self._driver, self._secret, LauncherHello(rank=self.rank, host=self.host,
                                                                   hostname=socket.gethostname(), pid=os.getpid()))
        self._rendezvous = RendezvousProxy(self._driver, self._secret, self.rank)
        self._env.update(self._rendezvous.env())
        if self._timeline_interval:
            self._timeline_dir = tempfile.mkdtemp(prefix="hvd-timeline-")
            self._env["HOROVOD_TIMELINE"] = os.path.join(self._timeline_dir, "timeline.json")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", RANK_MAIN_MODULE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self._env, start_new_session=True)
        boot = {"driver": list(self._driver), "secret": self._secret.hex(), "rank": self.rank,
                "host": self.host, "parent_pid": os.getpid()}
        self.proc.stdin.write((json.dumps(boot) + "\n").encode())
        self.proc.stdin.close()
        for stream, name in ((self.proc.stdout, Stream.STDOUT), (self.proc.stderr, Stream.STDERR)):
            t = threading.Thread(target=self._pump, args=(stream, name), daemon=True,
                                 name=f"hvd-rank{self.rank}-{name}")
            t.start()
            self._threads.append(t)
        self._link.on_stop(self.stop_by_driver)
        if self._timeline_dir:
            self._link.ship_timeline(self._env["HOROVOD_TIMELINE"], self._timeline_interval)

    def _pump(self, stream, name: Stream) -> None:
        def show(line: str) -> None:
            self.tail.append(f"<{name}> {line}")
            if self._forward:
                self._link.send(Log(line=line, stream=name))

        lines = LineAssembler(show)
        pump(stream, lines.feed, lambda: (lines,))

    def stop_by_driver(self) -> None:
        """The driver said stop, or is gone: end the rank (it reports this, not a failure of its own)."""
        if self.proc.poll() is None:
            self._stopped_by_driver.set()
            self.kill()

    def kill(self) -> None:
        """SIGKILL the rank and everything it started (its own process group)."""
        if self.proc is not None:
            kill_group(self.proc)

    def wait(self) -> int:
        """Wait for the rank, report its end to the driver, return its exit code (negative: signal)."""
        rc = self.proc.wait()
        self.kill()  # reap anything the rank left in its process group (DataLoader workers, ...)
        self._rendezvous.close()
        for t in self._threads:
            t.join(5)
        report = Exited(returncode=rc, host=self.host, pid=self.proc.pid, tail=list(self.tail),
                        stopped_by_driver=self._stopped_by_driver.is_set(),
                        signal=signal.Signals(-rc).name if rc < 0 else None)
        # Delivered after a failure too: the timeline often shows why a rank stalled.
        self._link.finish([report])
        if self._timeline_dir:
            shutil.rmtree(self._timeline_dir, ignore_errors=True)
        return rc
