"""A Spark driver that runs on a standalone master's worker, seen from Airflow.

Its state and its kill go through the master's REST server (the endpoint the Spark provider builds:
``http://<master host>:<rest-port>``, 6066 by default); its output comes through storage, where the
driver ships it (runner/driver/log_shipper.py, format in runner/wire/driver_log.py). ``look`` is one
glance at both: the follow core that the operator's loop (``follow``) and the trigger share.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_provider_hvd.runner.common.storage import fs_and_path
from airflow_provider_hvd.runner.wire.driver_log import Heartbeat, chunk_url, heartbeat_url
from airflow_provider_hvd.version_compat import BaseHook

log = logging.getLogger(__name__)

# Driver states after which nothing more happens; NOT_FOUND: the master does not know the id.
DRIVER_ENDED = frozenset({"FINISHED", "FAILED", "KILLED", "ERROR", "NOT_FOUND"})
# Quick looks at first, so a short run's end is seen within a quarter second; then one request per
# poll_interval for a run of hours.
QUICK_POLL_S = 0.25
QUICK_POLL_FOR_S = 30.0


def poll_delay(following_for: float, poll_interval: float) -> float:
    """Seconds until the next look at a driver followed for ``following_for`` seconds."""
    return min(poll_interval, QUICK_POLL_S) if following_for < QUICK_POLL_FOR_S else poll_interval


class MasterRest:
    """A standalone master's REST server."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def request(self, method: str, path: str) -> dict[str, Any]:
        """One call; an HTTP error's JSON body is the answer too (the master says why there)."""
        req = urllib.request.Request(f"{self.endpoint}/v1/submissions/{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read() or b"{}")

    def driver_state(self, driver_id: str) -> str:
        """SUBMITTED, RUNNING, FINISHED, FAILED, KILLED, ERROR, RELAUNCHING, UNKNOWN, or NOT_FOUND."""
        status = self.request("GET", f"status/{driver_id}")
        if not status.get("success", False) or "driverState" not in status:
            return "NOT_FOUND"
        return str(status["driverState"])

    def kill_driver(self, driver_id: str) -> str:
        """Ask the master to kill the driver; its answer, in words."""
        return str(self.request("POST", f"kill/{driver_id}").get("message", "no message"))

    def check(self) -> None:
        """A ValueError saying what to change when the REST server does not answer: without it a
        cluster-mode driver could be started but neither followed nor killed."""
        try:
            self.driver_state("hvd-probe")  # any answer will do
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"the Spark master's REST server at {self.endpoint} does not answer ({exc}). Deploy mode "
                f"'cluster' on a standalone master follows and kills the driver through it: start the master with "
                f"spark.master.rest.enabled=true (SPARK_MASTER_OPTS=-Dspark.master.rest.enabled=true), and set the "
                f"Spark connection's rest-port extra if it is not 6066; or use deploy_mode 'client'.") from None


class DriverOutput:
    """Reads the chunks the driver shipped, in order, each once; lines come whole."""

    # Seconds between the tries of a last read that storage refused (the driver has ended: no later look).
    FINAL_READ_RETRIES = (1, 2, 4)

    def __init__(self, log_dir: str, next_seq: int = 0) -> None:
        self.log_dir = log_dir.rstrip("/")
        self.next_seq = next_seq
        self._partial = ""
        # The storage error that stopped the last read before the chunks it looked for (None: it read them all).
        self.read_error: OSError | None = None

    def read_new(self, final: bool = False, upto: int | None = None) -> list[str]:
        """The complete lines of every chunk written since the last call; ``final``: the last
        unterminated line too. ``upto``: the chunks known to exist (a heartbeat's count) are read, and
        no request is spent looking for another. A chunk storage fails to return (other than
        not-found) ends the read: ``read_error`` says why, and the next read starts at that chunk."""
        text = self._read_chunks(upto)
        joined = self._partial + "".join(text)
        lines = joined.split("\n")
        self._partial = lines.pop()
        if final and self._partial and self.read_error is None:
            lines.append(self._partial)
            self._partial = ""
        return lines

    def _read_chunks(self, upto: int | None) -> list[str]:
        fs, _ = fs_and_path(self.log_dir)
        text = []
        self.read_error = None
        while upto is None or self.next_seq < upto:
            _, path = fs_and_path(chunk_url(self.log_dir, self.next_seq))
            fs.invalidate_cache(path)  # a listing cached earlier must not hide a chunk written since
            try:
                with fs.open(path, "rb") as f:
                    text.append(f.read().decode("utf-8", "replace"))
            except FileNotFoundError:
                break
            except OSError as exc:  # storage failed for a moment: nothing read is lost, the rest comes next time
                self.read_error = exc
                log.warning("Could not read the driver's output chunk %s (will read it again): %s", path, exc)
                break
            self.next_seq += 1
        return text

    def read_last(self) -> list[str]:
        """The driver has ended: every line it left, trying again (FINAL_READ_RETRIES) where storage fails,
        since no later look will come. Lines storage never returned are reported in the log."""
        lines = self.read_new(final=True)
        for wait in self.FINAL_READ_RETRIES:
            if self.read_error is None:
                return lines
            time.sleep(wait)
            lines += self.read_new(final=True)
        if self.read_error is not None:
            log.error("The driver's output from chunk %d on under %s could not be read (%s): it is still there for "
                      "a person to read", self.next_seq, self.log_dir, self.read_error)
            if self._partial:
                lines.append(self._partial)
                self._partial = ""
        return lines

    def heartbeat(self) -> Heartbeat | None:
        """The driver's last heartbeat, or None before its first."""
        fs, path = fs_and_path(heartbeat_url(self.log_dir))
        fs.invalidate_cache(path)
        try:
            # One GET. A file object (fs.open) first looks the object up, then reads that version
            # only: S3 answers HTTP 412 when the driver rewrote the heartbeat in between.
            return Heartbeat.from_json(fs.cat_file(path))
        except (FileNotFoundError, ValueError):
            return None

    def look(self, ended: bool) -> tuple[list[str], bool]:
        """One look at a driver that the master reports ``ended`` (or not): its new lines, and whether
        its application has said it succeeded (its result is in storage and these lines are its last,
        though its JVM may still be exiting). Only success counts: a failed driver's end is the
        master's to report (one that Spark relaunches writes here again)."""
        try:
            beat = self.heartbeat()
        except OSError as exc:  # storage unreachable for a moment: no news this look, the next one asks again
            if not ended:
                log.warning("Could not read the driver's heartbeat under %s (will look again): %s", self.log_dir, exc)
                return [], False
            beat = None
        finished = beat is not None and beat.succeeded
        if ended or finished:
            return self.read_last(), finished
        return self.read_new(upto=beat.chunks if beat else 0), False


@dataclass(frozen=True)
class Look:
    """What one look at a followed driver saw."""

    state: str | None  # None: the master has not answered yet
    lines: list[str]
    ended: bool
    unreachable: OSError | ValueError | None = None  # why the master did not answer this time


class StandaloneDriverHook(BaseHook):
    """One driver, ``driver_id``, on the master whose REST server is ``rest_endpoint``; its output
    shipped to ``log_dir``, read from chunk ``next_seq`` on."""

    def __init__(self, rest_endpoint: str, driver_id: str, log_dir: str, next_seq: int = 0) -> None:
        super().__init__()
        self.master = MasterRest(rest_endpoint)
        self.driver_id = driver_id
        self.output = DriverOutput(log_dir, next_seq)
        self._state: str | None = None

    @property
    def next_seq(self) -> int:
        return self.output.next_seq

    def look(self) -> Look:
        """The master's state for the driver and its new output. The driver's own word that it
        succeeded ends it a poll or two before the master says so."""
        unreachable = None
        try:
            self._state = self.master.driver_state(self.driver_id)
        except (OSError, ValueError) as exc:
            unreachable = exc
        ended = self._state in DRIVER_ENDED
        lines, finished = self.output.look(ended)
        if finished and not ended:
            self._state, ended = "FINISHED", True
        return Look(self._state, lines, ended, unreachable)

    def follow(self, on_lines: Callable[[list[str]], None], poll_interval: float = 1.0,
               unreachable_limit: float = 120.0) -> str:
        """Look until the driver ends, handing its lines to ``on_lines``; its final state. The master
        unreachable for ``unreachable_limit`` seconds in a row is an error naming it."""
        started, unreachable_since, last = time.monotonic(), None, None
        while True:
            seen = self.look()
            if seen.unreachable is None:
                unreachable_since = None
            else:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > unreachable_limit:
                    raise OSError(f"the Spark master's REST server at {self.master.endpoint} has not answered for "
                                  f"{unreachable_limit:.0f} s ({seen.unreachable}); driver {self.driver_id} may "
                                  f"still be running: kill it there if it is") from None
            on_lines(seen.lines)
            if seen.state != last:
                self.log.info("Spark driver %s: %s", self.driver_id, seen.state)
                last = seen.state
            if seen.ended:
                return str(seen.state)
            time.sleep(poll_delay(time.monotonic() - started, poll_interval))

    def kill(self) -> None:
        try:
            answer = self.master.kill_driver(self.driver_id)
        except (OSError, ValueError) as exc:
            self.log.warning("Could not ask %s to kill driver %s: %s", self.master.endpoint, self.driver_id, exc)
            return
        self.log.info("Asked the Spark master to kill driver %s: %s", self.driver_id, answer)
