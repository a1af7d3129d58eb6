"""What a retry does about the driver its earlier try left on a standalone cluster (placements/earlier_driver.py).

The whole story, with a real Airflow worker killed mid-training, is in tests/test_cluster_mode.py;
here each answer of the master, and the heartbeat that settles a forgotten submission id.
"""

import pytest

from airflow_provider_hvd.placements.earlier_driver import (
    HEARTBEAT_STALE_AFTER,
    DriverRecord,
    DriverStillRunning,
    decide,
)
from airflow_provider_hvd.runner.wire.driver_log import Heartbeat

RECORD = DriverRecord(driver_id="driver-20261204000000-0003", rest_endpoint="http://10.0.0.5:6066", try_number=1,
                      log_dir="s3://bucket/runs/d/r/train/try-1/driver-log", submitted_at=1.0)
NOW = 1_800_000_000.0


def test_a_record_reads_back_as_written():
    assert DriverRecord.from_json(RECORD.to_json()) == RECORD


@pytest.mark.parametrize("state", ["SUBMITTED", "RUNNING", "RELAUNCHING", "UNKNOWN"])
def test_a_driver_that_still_runs_is_attached_to(state):
    decision = decide(RECORD, state, heartbeat=None, now=NOW)
    assert decision.attach
    assert f"{RECORD.driver_id} of try 1 is still {state}: attaching" in decision.message


def test_a_driver_that_finished_unwatched_gives_its_result_without_training_again():
    decision = decide(RECORD, "FINISHED", heartbeat=None, now=NOW)
    assert decision.attach and "taking its result" in decision.message


@pytest.mark.parametrize("state", ["FAILED", "KILLED", "ERROR"])
def test_a_driver_that_ended_badly_is_replaced(state):
    decision = decide(RECORD, state, heartbeat=Heartbeat(time=NOW, chunks=0), now=NOW)
    assert not decision.attach and f"ended {state}: starting a new driver" in decision.message


def test_a_forgotten_id_whose_driver_still_beats_is_refused_naming_it_and_what_to_do():
    with pytest.raises(DriverStillRunning) as raised:
        decide(RECORD, "NOT_FOUND", heartbeat=Heartbeat(time=NOW - 5, chunks=12), now=NOW)
    message = str(raised.value)
    assert RECORD.driver_id in message and RECORD.rest_endpoint in message and RECORD.log_dir in message
    assert "5 s old" in message and "Kill that driver" in message and "starts nothing" in message


@pytest.mark.parametrize("heartbeat, said", [(None, "it never beat"),
                                             (Heartbeat(time=NOW - HEARTBEAT_STALE_AFTER - 1, chunks=0), "61 s old")])
def test_a_forgotten_id_whose_driver_is_silent_is_replaced(heartbeat, said):
    decision = decide(RECORD, "NOT_FOUND", heartbeat=heartbeat, now=NOW)
    assert not decision.attach
    assert f"{RECORD.driver_id} of try 1 is unknown to the Spark master" in decision.message
    assert said in decision.message and "Starting a new driver" in decision.message
