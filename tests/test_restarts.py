"""max_restarts: the failures that restart the rank group (the table in driver/restart_policy.py),
resuming from the run's own newest checkpoint, and the error's history when restarts run out.

Real ranks on the driver (np < 0), gloo and mpi; the same on a standalone cluster with executors
killed is in test_runner_clusters.py.
"""

import json
import logging

import pytest
import rank_functions as rf

from airflow_provider_hvd import HorovodRunner, save_checkpoint
from airflow_provider_hvd.runner.driver.restart_policy import TABLE, restart_cause
from airflow_provider_hvd.runner.errors import (
    ClusterCapacityError,
    HorovodRunError,
    MpiDaemonCrashError,
    PayloadError,
    RankFailedError,
    SerializationError,
    SparkStageError,
    StallError,
    StartTimeoutError,
    WorkerEnvironmentError,
)


def quiet(*_):
    pass


def rank_error(kind, **kw):
    return RankFailedError("x", rank=1, host="10.0.0.2", kind=kind, **kw)


# One case per row of the table, in its order.
CASES = [
    (rank_error("lost"), True),
    (rank_error("unreachable"), False),
    (SparkStageError("x", executor_lost=True), True),
    (rank_error("signal", signal="SIGKILL"), True),
    (rank_error("peer_lost", exc_type="HorovodInternalError"), True),
    (MpiDaemonCrashError("x", process="orted", signal="SIGSEGV", rank=1, host="h", returncode=None, tail=[]), True),
    (rank_error("exception", exc_type="ValueError"), False),
    (rank_error("exit", returncode=3), False),
    (StallError("x", stalled_ranks=[1], waiting_ranks=[0]), False),
    (StartTimeoutError("x", missing_ranks=[1]), False),
    (WorkerEnvironmentError("x"), False),
    (ClusterCapacityError("x"), False),
    (PayloadError("x"), False),
    (HorovodRunError("x"), False),
]


def test_every_row_of_the_restart_table_is_a_case_here():
    assert len(CASES) == len(TABLE)
    assert [restarted for _, restarted in CASES] == [row[2] for row in TABLE]


@pytest.mark.parametrize("error, restarted", CASES, ids=[f"{type(e).__name__}-{getattr(e, 'kind', '')}"
                                                         for e, _ in CASES])
def test_restart_table_case_by_case(error, restarted):
    cause = restart_cause(error)
    assert (cause is not None) == restarted, cause
    if restarted and isinstance(error, RankFailedError):
        assert "rank 1 on 10.0.0.2" in cause or error.kind == "daemon"


def test_other_failures_are_not_restarted():
    assert restart_cause(SparkStageError("x", executor_lost=False)) is None
    assert restart_cause(SerializationError("x")) is None
    assert restart_cause(ValueError("x")) is None


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_a_killed_rank_restarts_from_the_runs_newest_checkpoint(launcher, tmp_path, caplog, no_leftovers):
    caplog.set_level(logging.INFO, logger="airflow_provider_hvd.runner")
    checkpoints = tmp_path / "checkpoints"
    timeline = tmp_path / "timeline" / "timeline.json"
    out = HorovodRunner(np=-2, launcher=launcher, max_restarts=2, checkpoint_dir=str(checkpoints),
                        timeline=str(timeline), timeline_live_bytes=0, log_sink=quiet).run(
        rf.steps_with_restarts, steps=8, partial_write=True)
    # Rank 1 died after checkpoint 4 on the first attempt; the second resumed there, from this run's own.
    assert out == {"attempt": 1, "resumed_from": f"file://{checkpoints}/ckpt-0000000004.pt",
                   "resume_is_restart": True, "started_at": 4, "steps": 8}
    text = caplog.text
    assert "attempt 1 of 3 failed: killed by SIGKILL (rank 1" in text, text
    assert "restart 1 resumes from file://" in text and "(written by this run)" in text
    # The torn temporary file the killed attempt left is gone; every checkpoint is whole.
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"ckpt-{s:010d}.pt" for s in range(1, 9)]
    # Both attempts' timelines are complete traces: the failed one beside the run's.
    for name in ("timeline.attempt-1.json", "timeline.json"):
        events = json.loads((timeline.parent / name).read_text())
        assert any(e.get("name") == "grad" or "grad" in json.dumps(e.get("args", {})) for e in events), name
    assert sorted(p.name for p in timeline.parent.iterdir()) == ["timeline.attempt-1.json", "timeline.json"]


def test_a_restart_before_the_run_wrote_a_checkpoint_resumes_where_the_run_started(tmp_path, no_leftovers):
    checkpoints = tmp_path / "shared"
    earlier = save_checkpoint({"step": 3}, str(checkpoints), step=3)  # an earlier run's
    out = HorovodRunner(np=-2, launcher="gloo", max_restarts=1, checkpoint_dir=str(checkpoints),
                        env={"HVD_RESUME_FROM": earlier}, log_sink=quiet).run(
        rf.steps_with_restarts, steps=6, kill_at=0)
    assert out == {"attempt": 1, "resumed_from": earlier, "resume_is_restart": False, "started_at": 3, "steps": 6}


@pytest.mark.parametrize("how, kind", [("raise", "exception"), ("exit", "exit")])
def test_a_failure_of_the_code_itself_is_not_restarted(how, kind, tmp_path, no_leftovers):
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2, launcher="gloo", max_restarts=3, checkpoint_dir=str(tmp_path),
                      log_sink=quiet).run(rf.steps_with_restarts, steps=4, how=how)
    err = info.value
    assert err.kind == kind and err.rank == 1
    assert len(err.attempts) == 1 and "a restart cannot cure this" in err.attempts[0], err.attempts
    assert "after 0 restart(s) (max_restarts=3)" in str(err)


def test_when_restarts_run_out_the_error_gives_every_attempt(tmp_path, no_leftovers):
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2, launcher="gloo", max_restarts=1, checkpoint_dir=str(tmp_path), log_sink=quiet).run(
            rf.steps_with_restarts, steps=6, kill_on_attempts=(0, 1), kill_at=0)
    err = info.value
    assert err.kind == "signal" and err.signal == "SIGKILL"
    assert len(err.attempts) == 2, err.attempts
    assert "attempt 1 failed after" in err.attempts[0] and "killed by SIGKILL (rank 1" in err.attempts[0]
    assert err.attempts[0].endswith("; restarted")
    assert "attempt 2 failed after" in err.attempts[1] and "no restart left" in err.attempts[1]
    message = str(err)
    assert message.startswith("HorovodRunner: the run failed after 1 restart(s) (max_restarts=1)")
    assert "--- the last attempt's error ---\nHorovodRunner: rank 1" in message
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_max_restarts_is_checked_before_anything_runs():
    with pytest.raises(ValueError, match="max_restarts takes an int >= 0"):
        HorovodRunner(np=2, max_restarts=-1)
    with pytest.raises(ValueError, match="max_restarts takes an int >= 0"):
        HorovodRunner(np=2, max_restarts="2")
