"""`localcluster down` (make cluster-down): what it does with a process that will not stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from localcluster import namespaces
from localcluster.services import Cluster, base_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

# A service whose shutdown hangs: it ignores SIGTERM, and a thread of its own is where it waits.
STUCK = """
import signal, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def wait_for_a_peer_that_never_answers():
    time.sleep(600)
threading.Thread(target=wait_for_a_peer_that_never_answers).start()
print("ready", flush=True)
time.sleep(600)
"""


def run_in_a_namespace_then_down(tmp_path, script: str, log_name: str):
    """``script`` run in namespace hvd-probe, its output in a service log of host "airflow"; once it
    printed "ready", `down` (1 s of grace). The process, what `down` said, and the log's path."""
    assert not namespaces.namespaces(), f"a cluster is up ({namespaces.namespaces()}): make cluster-down first"
    log = tmp_path / "hosts" / "airflow" / "logs" / log_name
    log.parent.mkdir(parents=True)
    subprocess.run(["ip", "netns", "add", "hvd-probe"], check=True)
    try:
        with log.open("wb") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", "hvd-probe", sys.executable, "-c", script],
                                    env={**base_env(), "PATH": os.environ["PATH"]}, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + 30
        while "ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = Cluster(tmp_path).down(grace=1)
    finally:
        namespaces.destroy(grace=1)
    return proc, lines, log


def test_down_kills_a_process_that_ignores_sigterm_and_says_what_it_was_doing(tmp_path):
    """A hung shutdown is a defect to explain, so `down` must leave the evidence: the process it had
    to kill, named, and the stack of every thread of it (from its own log, where it wrote them)."""
    proc, lines, log = run_in_a_namespace_then_down(tmp_path, STUCK, "stuck.log")
    assert proc.wait(10) != 0
    killed = [line for line in lines if not line.startswith("stacks written")]
    assert len(killed) == 1 and killed[0].startswith("hvd-probe: ") and "SIG_IGN" in killed[0], lines
    stacks = [line for line in lines if line.startswith("stacks written")]
    assert len(stacks) == 1 and str(log) in stacks[0], lines
    assert "in wait_for_a_peer_that_never_answers" in stacks[0] and "Current thread" in stacks[0], stacks[0]
    assert not namespaces.namespaces() and not list(tmp_path.glob("core*"))


# A service and a worker it forked, both stuck, writing to one log (Airflow's scheduler and its
# LocalExecutor workers): aborted together, their dumps' headers come out interleaved.
STUCK_WITH_A_FORKED_WORKER = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def worker_waits_for_a_pill_that_never_comes():
    time.sleep(600)
def service_joins_its_worker():
    os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    worker_waits_for_a_pill_that_never_comes()
print("ready", flush=True)
service_joins_its_worker()
"""


def test_down_shows_the_stacks_of_every_process_it_killed_that_shared_a_log(tmp_path):
    proc, lines, log = run_in_a_namespace_then_down(tmp_path, STUCK_WITH_A_FORKED_WORKER, "scheduler.log")
    proc.wait(10)
    killed = [line for line in lines if not line.startswith("stacks written")]
    assert len(killed) == 2, lines
    stacks = "\n".join(line for line in lines if line.startswith("stacks written"))
    assert "in worker_waits_for_a_pill_that_never_comes" in stacks and "in service_joins_its_worker" in stacks, \
        log.read_text()
