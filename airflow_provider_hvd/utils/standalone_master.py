"""A standalone Spark master's REST server: a cluster-mode driver's state, and its kill.

The Spark provider builds the endpoint (``http://<master host>:<rest-port>``, 6066 by default) and
runs /usr/bin/curl against it; the hook (sync) and the trigger (async, through a thread) call these.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

# Driver states after which nothing more happens; NOT_FOUND: the master does not know the id.
DRIVER_ENDED = frozenset({"FINISHED", "FAILED", "KILLED", "ERROR", "NOT_FOUND"})
# Following a driver: looks come every QUICK_POLL_S for the first QUICK_POLL_FOR_S seconds, then every
# poll_interval. A short run's end is then seen within a quarter second rather than a second, and a
# run of hours costs the master one request per poll_interval.
QUICK_POLL_S = 0.25
QUICK_POLL_FOR_S = 30.0


def poll_delay(following_for: float, poll_interval: float) -> float:
    """Seconds until the next look at a driver followed for ``following_for`` seconds."""
    return min(poll_interval, QUICK_POLL_S) if following_for < QUICK_POLL_FOR_S else poll_interval


def request(rest_endpoint: str, method: str, path: str) -> dict[str, Any]:
    """One REST call; an HTTP error's JSON body is the answer too (the master says why there)."""
    req = urllib.request.Request(f"{rest_endpoint}/v1/submissions/{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read() or b"{}")


def driver_state(rest_endpoint: str, driver_id: str) -> str:
    """SUBMITTED, RUNNING, FINISHED, FAILED, KILLED, ERROR, RELAUNCHING, UNKNOWN, or NOT_FOUND."""
    status = request(rest_endpoint, "GET", f"status/{driver_id}")
    if not status.get("success", False) or "driverState" not in status:
        return "NOT_FOUND"
    return str(status["driverState"])


def kill_driver(rest_endpoint: str, driver_id: str) -> str:
    """Ask the master to kill the driver; its answer, in words."""
    return str(request(rest_endpoint, "POST", f"kill/{driver_id}").get("message", "no message"))
