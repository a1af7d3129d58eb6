"""Faults injected for real on local[2]: killed ranks, hung ranks, a killed driver, a crash during a
checkpoint, and load. Each records its outcome for docs/reliability.md (``make faults``)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import rank_functions as rf
from conftest import assert_no_run_processes, python_in_venv, rank_processes, run_processes
from waiting import wait_for

from airflow_provider_hvd import HorovodRunner, latest_checkpoint, load_checkpoint
from airflow_provider_hvd.runner.errors import RankFailedError, StallError

LAUNCHERS = pytest.mark.parametrize("launcher", ["gloo", "mpi"])
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.faults


def quiet(*_):
    pass


def pid_of(marker_dir, rank, timeout=120.0) -> int:
    return int(_marker(marker_dir, rank, timeout)[0])


def host_of(marker_dir, rank, timeout=120.0) -> str:
    return _marker(marker_dir, rank, timeout)[1]


def _marker(marker_dir, rank, timeout) -> list[str]:
    """What rank_functions.train_until_killed wrote: pid, then host (its executor's address)."""
    path = os.path.join(marker_dir, f"rank-{rank}.pid")
    wait_for(f"rank {rank} to reach training (its marker {path})", lambda: os.path.exists(path), timeout,
             interval=0.05)
    return (open(path).read().splitlines() + [""])[:2]


def in_background(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as exc:  # surfaced by the test through the list
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return errors


def first_line(exc) -> str:
    return str(exc).splitlines()[0]


@LAUNCHERS
def test_rank_killed_mid_training_fails_fast_and_clean(spark_local2, launcher, tmp_path, no_leftovers, fault):
    record = fault(f"a rank SIGKILLed mid-training ({launcher}, barrier stage on local[2])",
                   "run() fails within 3 s naming the rank, its host, the signal and its last lines; "
                   "no process of the run survives; the Spark job ends; the next run() succeeds")

    def kill_rank_1():
        pid = pid_of(tmp_path, 1)
        time.sleep(0.3)
        record.start()
        os.kill(pid, signal.SIGKILL)

    killer_errors = in_background(kill_rank_1)
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=2, launcher=launcher, log_sink=quiet).run(rf.train_until_killed, marker_dir=str(tmp_path))
    seconds = record.failed_after()
    err = info.value
    assert not killer_errors
    assert err.rank == 1 and err.host and f"rank 1 (host {err.host}" in str(err)
    assert "signal SIGKILL" in str(err)
    assert any("rank 1 step" in line for line in err.tail), err.tail
    assert seconds < 3, f"took {seconds:.2f} s to fail"
    sc = spark_local2.sparkContext
    wait_for("the failed run's Spark job to end", lambda: not sc.statusTracker().getActiveJobsIds(), 10,
             interval=0.05, seen=sc.statusTracker().getActiveJobsIds)
    assert_no_run_processes()
    assert HorovodRunner(np=2, launcher=launcher, log_sink=quiet).run(rf.chatty) == 0
    last_step = [line for line in err.tail if "rank 1 step" in line][-1]
    record.observe(f"{first_line(err)}; its last line: {last_step}; next run() returned 0")


@LAUNCHERS
def test_hung_rank_is_named_within_stall_timeout(spark_local2, launcher, no_leftovers, fault):
    record = fault(f"a rank hangs while the others wait in an allreduce ({launcher}, barrier, stall_timeout=3)",
                   "StallError naming the hung rank within stall_timeout plus a few seconds; nothing left running")
    runner = HorovodRunner(np=2, launcher=launcher, stall_timeout=3, log_sink=quiet)
    t0 = time.monotonic()
    with pytest.raises(StallError) as info:
        runner.run(rf.stall_on_rank, stalled_rank=1)
    seconds = time.monotonic() - t0
    assert info.value.stalled_ranks == [1] and info.value.waiting_ranks == [0]
    assert "rank 1 (host" in str(info.value) and "stall_timeout=3s" in str(info.value)
    assert seconds < 3 + 15, f"took {seconds:.1f} s"  # start-up, the 3 s, one poll, the grace for peers
    record.observe(first_line(info.value)[:220], seconds)


def test_rank_that_never_returns_is_named_at_the_run_timeout(no_leftovers, fault):
    record = fault("a rank never returns while the others did (local np=-2, timeout=8)",
                   "StallError at the run's timeout naming the rank that had not returned")
    t0 = time.monotonic()
    with pytest.raises(StallError) as info:
        HorovodRunner(np=-2, timeout=8, log_sink=quiet).run(rf.never_returns_on_rank, stuck_rank=1)
    seconds = time.monotonic() - t0
    assert info.value.stalled_ranks == [1] and "rank(s) [0] had" in str(info.value)
    assert 8 <= seconds < 12
    record.observe(first_line(info.value), seconds)


DRIVER_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import conftest, rank_functions as rf
from airflow_provider_hvd import HorovodRunner
spark = conftest.new_session("local[2]", "hvd-driver-killed")
HorovodRunner(np=2, launcher={launcher!r}).run(rf.train_until_killed, marker_dir={marker!r})
"""


@LAUNCHERS
def test_driver_killed_every_rank_and_executor_process_exits(launcher, tmp_path, no_leftovers, fault):
    record = fault(f"the driver process SIGKILLed mid-training ({launcher}, local[2] in a separate driver)",
                   "every rank, orted/mpirun, Spark JVM and Python worker of that driver exits by itself")
    script = DRIVER_SCRIPT.format(tests=TESTS_DIR, launcher=launcher, marker=str(tmp_path))
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid_of(tmp_path, 0), pid_of(tmp_path, 1)
        tree = psutil.Process(driver.pid).children(recursive=True)
        ranks = run_processes()
        assert len(rank_processes()) == 2
        record.start()
        driver.kill()
        driver.wait()
        left = lambda: [p for p in tree + ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # noqa: E731
        wait_for("every process of the killed driver to end", lambda: not left(), 30, interval=0.2,
                 seen=lambda: [(p.pid, p.name()) for p in left()])
        seconds = record.failed_after()
        record.observe(f"{len(tree)} processes of the driver (JVM, Python workers, ranks"
                       f"{', mpirun' if launcher == 'mpi' else ''}) all gone", seconds)
    finally:
        if driver.poll() is None:
            driver.kill()


def test_crash_while_rank0_writes_a_checkpoint_keeps_the_previous_one(spark_local2, tmp_path, no_leftovers,
                                                                      fault):
    record = fault("a rank SIGKILLed while rank 0 writes a 1 GiB checkpoint (gloo, barrier)",
                   "the previous checkpoint stays intact and loadable; latest_checkpoint never returns a "
                   "partial file")
    ckpt_dir, marker = tmp_path / "ckpt", tmp_path / "markers"
    marker.mkdir()

    def kill_rank_1_mid_write():
        pid = pid_of(marker, 1)
        wait_for("rank 0 to start writing checkpoint 2 (a .tmp- file in the checkpoint folder)",
                 lambda: ckpt_dir.exists() and any(p.name.startswith(".tmp-") for p in ckpt_dir.iterdir()),
                 120, interval=0.005)
        record.start()
        os.kill(pid, signal.SIGKILL)

    killer_errors = in_background(kill_rank_1_mid_write)
    with pytest.raises(RankFailedError):
        HorovodRunner(np=2, launcher="gloo", log_sink=quiet).run(
            rf.checkpoint_then_big_checkpoint, directory=str(ckpt_dir), marker_dir=str(marker), megabytes=1024)
    record.failed_after()
    assert not killer_errors
    latest = latest_checkpoint(str(ckpt_dir))
    state = load_checkpoint(latest)
    partial = [p for p in ckpt_dir.iterdir() if p.name.startswith(".tmp-")]
    if latest.endswith("ckpt-0000000001.pt"):
        assert state["step"] == 1 and state["w"].tolist() == [1.0] * 4
        outcome = (f"the kill landed mid-write: {len(partial)} partial temporary file(s) "
                   f"({sum(p.stat().st_size for p in partial) >> 20} MiB) ignored, checkpoint 1 loads")
    else:  # the write won the race: checkpoint 2 is whole
        assert state["step"] == 2 and state["w"].numel() == 1024 << 18
        outcome = "checkpoint 2 was complete before the run stopped; it loads whole"
    record.observe(outcome + f"; latest_checkpoint -> {os.path.basename(latest)}")


LOAD_SCRIPT = """
import json, os, sys, threading, time
sys.path.insert(0, {tests!r})
import psutil, conftest, rank_functions as rf
from airflow_provider_hvd import HorovodRunner
spark = conftest.new_session("local[6]", "hvd-load")
me = psutil.Process()

def snapshot():
    time.sleep(1.0)  # let reaped threads and sockets settle
    return {{"threads": me.num_threads(), "fds": me.num_fds(),
             "listening": len([c for c in me.net_connections("tcp") if c.status == psutil.CONN_LISTEN]),
             "children": len(me.children(recursive=True)),
             "run_processes": len(conftest.run_processes())}}

run = lambda: HorovodRunner(np=2, launcher="gloo", log_sink=lambda *a: None).run(rf.chatty)

def concurrently(n):
    results, errors = [], []
    def one():
        try:
            results.append(run())
        except Exception as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=one) for _ in range(n)]
    [t.start() for t in threads]; [t.join() for t in threads]
    return results, errors

# Warm-up, sequential and concurrent: Spark's Python worker pool and the JVM's thread
# pools grow to their working size here, and are not ours to count as a leak.
run(); concurrently(3)
before = snapshot()
t0 = time.monotonic()
sequential = [run() for _ in range(20)]
t_seq = time.monotonic() - t0
t0 = time.monotonic()
results, errors = concurrently(3)
t_conc = time.monotonic() - t0
after = snapshot()
print("LOAD " + json.dumps({{"sequential": sequential, "concurrent": results, "errors": errors,
                            "before": before, "after": after, "t_seq": t_seq, "t_conc": t_conc}}))
spark.stop()
"""


def test_twenty_runs_back_to_back_and_three_at_once_leak_nothing(no_leftovers, fault):
    record = fault("20 run() calls back to back, then 3 concurrent, in one SparkSession (gloo, local[6])",
                   "all succeed; threads, file descriptors, listening ports and child processes of the driver "
                   "are the same after as before")
    out = python_in_venv("-c", LOAD_SCRIPT.format(tests=TESTS_DIR), timeout=600)
    assert "LOAD " in out.stdout, out.stderr[-3000:]
    load = json.loads(out.stdout.split("LOAD ", 1)[1].splitlines()[0])
    assert load["errors"] == []
    assert load["sequential"] == [0] * 20 and load["concurrent"] == [0] * 3
    before, after = load["before"], load["after"]
    assert after["run_processes"] == 0
    assert after["listening"] == before["listening"], (before, after)
    assert after["fds"] <= before["fds"] + 2, (before, after)  # not 20 of anything
    assert after["threads"] <= before["threads"] + 2, (before, after)
    assert after["children"] <= before["children"], (before, after)
    record.observe(f"23 of 23 succeeded (20 in {load['t_seq']:.0f} s, 3 concurrent in {load['t_conc']:.0f} s); "
                   + ", ".join(f"{k} {before[k]}->{after[k]}" for k in before))


def test_run_after_a_failure_does_not_inherit_its_state(spark_local2, no_leftovers):
    """A failed run must not poison the session: the roster, ports and job group are per run."""
    with pytest.raises(RankFailedError):
        HorovodRunner(np=2, log_sink=quiet).run(rf.fail_on_rank, bad_rank=0)
    assert HorovodRunner(np=2, log_sink=quiet).run(rf.allreduce_info)["rank0"]["sum"] == 3.0



class _Tripwire:
    """Unpickling this creates a file: proof of whether a pickle was executed."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _corrupt(kind, blob, key):
    from airflow_provider_hvd.runner.wire import payload

    blob = bytearray(blob)
    if kind == "truncated":
        return bytes(blob[:-100])
    if kind == "tampered":
        blob[-1] ^= 1
        return bytes(blob)
    if kind == "another key":
        return payload.seal(bytes(blob[payload._HEADER.size + 32:]), payload.new_secret(), payload.KIND_CALL)
    if kind == "incompatible version":
        blob[6] = payload.FORMAT_VERSION + 1
        return bytes(blob)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, says", [("truncated", "is truncated"), ("tampered", "tampered with"),
                                        ("another key", "signed with another key"),
                                        ("incompatible version", "incompatible version")])
def test_bad_payload_is_refused_by_a_real_rank_before_unpickling(kind, says, tmp_path, no_leftovers, fault):
    """A rank process, started as every launch starts it, fetches a damaged payload from the driver."""
    import cloudpickle

    from airflow_provider_hvd.runner.wire import payload
    from airflow_provider_hvd.runner.driver.service import DriverService
    from airflow_provider_hvd.runner.barrier.rank_process import RankProcess

    record = fault(f"payload {kind}, fetched by a real rank process",
                   "refused before unpickling (the tripwire pickle never runs), with a message naming the check")
    tripwire = tmp_path / "unpickled"
    key = payload.new_secret()
    sealed = payload.seal(cloudpickle.dumps((_Tripwire(str(tripwire)), {})), key, payload.KIND_CALL)
    service = DriverService(key, _corrupt(kind, sealed, key), quiet, host="127.0.0.1")
    try:
        rank = RankProcess(rank=0, host="localhost", env=dict(os.environ), driver=("127.0.0.1", service.port),
                           secret=key, forward_output=True)
        rank.start()
        assert rank.wait() == 1
        events = []
        while not service.events.empty():
            events.append(service.events.get())
        exc = next(e.data for e in events if e.kind == "exception")
    finally:
        service.close()
    assert exc.type == "PayloadError" and exc.while_loading and says in exc.message
    assert not tripwire.exists()
    record.observe(f"PayloadError: {exc.message}")
