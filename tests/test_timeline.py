"""The Horovod Timeline reaches a local path or an fsspec URL, during the run and after it."""

import json
import threading
import time

import fsspec
import pytest
import rank_functions as rf

from airflow_provider_hvd import HorovodRunner
from airflow_provider_hvd.runner.errors import RankFailedError
from airflow_provider_hvd.runner.driver.timeline_publisher import chrome_trace_snapshot


def load_trace(url):
    with fsspec.open(url, "rb") as f:
        return json.loads(f.read())


def assert_allreduce_events(events):
    names = {e.get("name") for e in events}
    assert {"ALLREDUCE", "NEGOTIATE_ALLREDUCE"} <= names
    # The negotiation records when each rank was ready: one instant event per rank.
    assert {"0", "1"} <= names
    assert all("ph" in e for e in events)


def test_snapshot_closes_horovods_open_array():
    assert json.loads(chrome_trace_snapshot(b'[\n{"ph": "B"},{"ph": "E"},')) == [{"ph": "B"}, {"ph": "E"}]
    assert json.loads(chrome_trace_snapshot(b'[\n{"ph": "B"}]')) == [{"ph": "B"}]
    assert json.loads(chrome_trace_snapshot(b"")) == []


@pytest.mark.parametrize("destination, launcher", [("path", "gloo"), ("file-url", "gloo"), ("memory-url", "gloo"),
                                                   ("path", "mpi")])
def test_timeline_is_readable_mid_run_and_complete_after(tmp_path, destination, launcher, no_leftovers):
    url = {"path": str(tmp_path / "tl" / "timeline.json"),
           "file-url": f"file://{tmp_path}/timeline.json",
           "memory-url": f"memory://hvd-tests/{tmp_path.name}/timeline.json"}[destination]
    box = {}
    runner = HorovodRunner(np=-2, timeline=url, timeline_interval=0.5, launcher=launcher)
    thread = threading.Thread(target=lambda: box.setdefault("out", runner.run(rf.allreduce_steps, steps=80)))
    thread.start()
    mid = None
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
        fs, path = fsspec.core.url_to_fs(url)
        if fs.exists(path):
            events = load_trace(url)  # valid JSON while training still runs
            if any(e.get("name") == "ALLREDUCE" for e in events):
                mid = events
                break
        time.sleep(0.2)
    assert thread.is_alive(), "training ended before a mid-run snapshot could be checked"
    thread.join(60)
    assert box["out"] == 80
    assert mid is not None
    final = load_trace(url)
    assert len(final) > len(mid)
    assert_allreduce_events(final)
    assert sum(1 for e in final if e.get("name") == "ALLREDUCE" and e.get("ph") == "B") >= 80


def test_timeline_is_delivered_when_training_fails(tmp_path, no_leftovers):
    url = str(tmp_path / "failed.json")
    with pytest.raises(RankFailedError, match="diverged at step 10"):
        HorovodRunner(np=-2, timeline=url).run(rf.allreduce_steps, steps=30, fail_at=10)
    assert_allreduce_events(load_trace(url))


def test_horovod_timeline_env_of_the_driver_is_honoured(tmp_path, monkeypatch, no_leftovers):
    url = str(tmp_path / "from-env.json")
    monkeypatch.setenv("HOROVOD_TIMELINE", url)
    HorovodRunner(np=-2).run(rf.allreduce_steps, steps=5)
    assert_allreduce_events(load_trace(url))


def test_barrier_mode_timeline(spark_local2, tmp_path, no_leftovers):
    url = f"file://{tmp_path}/barrier.json"
    assert HorovodRunner(np=2, timeline=url).run(rf.allreduce_steps, steps=5) == 5
    assert_allreduce_events(load_trace(url))
