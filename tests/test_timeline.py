"""The Horovod Timeline reaches a local path or an fsspec URL, during the run and after it."""

import json
import threading
import time
from pathlib import Path

import fsspec
import pytest
import rank_functions as rf

from airflow_provider_hvd import HorovodRunner
from airflow_provider_hvd.runner.errors import RankFailedError
from airflow_provider_hvd.runner.driver.chrome_trace import chrome_trace_snapshot
from airflow_provider_hvd.runner.driver.timeline_publisher import live_view_location


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
    assert json.loads(chrome_trace_snapshot(b"[\n")) == []
    # Horovod killed mid-write: the half event is dropped, the rest stays valid.
    assert json.loads(chrome_trace_snapshot(b'[\n{"ph": "B"},{"ph": "E", "ar')) == [{"ph": "B"}]
    # A clean shutdown's file is kept byte for byte.
    clean = b'[\n{"ph": "B", "args": {"a": 1}},{"ph": "E", "args": {"b": 2}}]'
    assert chrome_trace_snapshot(clean) == clean


@pytest.mark.parametrize("destination, launcher", [("path", "gloo"), ("file-url", "gloo"), ("memory-url", "gloo"),
                                                   ("path", "mpi")])
def test_live_view_mid_run_then_the_complete_timeline_once(tmp_path, destination, launcher, no_leftovers):
    url = {"path": str(tmp_path / "tl" / "timeline.json"),
           "file-url": f"file://{tmp_path}/timeline.json",
           "memory-url": f"memory://hvd-tests/{tmp_path.name}/timeline.json"}[destination]
    live = live_view_location(url)
    assert live.endswith("timeline.live.json")
    fs, path = fsspec.core.url_to_fs(url)
    live_path = fsspec.core.url_to_fs(live)[1]
    box = {}
    runner = HorovodRunner(np=-2, timeline=url, timeline_interval=0.5, launcher=launcher)
    thread = threading.Thread(target=lambda: box.setdefault("out", runner.run(rf.allreduce_steps, steps=80)))
    thread.start()
    mid = None
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
        if fs.exists(live_path):
            events = load_trace(live)  # valid JSON while training still runs
            if any(e.get("name") == "ALLREDUCE" for e in events):
                mid = events
                # The complete file is written once, at the end: not while training runs.
                assert not fs.exists(path)
                break
        time.sleep(0.2)
    assert thread.is_alive(), "training ended before the live view could be checked"
    thread.join(60)
    assert box["out"] == 80
    assert mid is not None
    # The live view names the tensor's row (Horovod's metadata events) and says when the run started.
    assert {"process_name", "process_sort_index"} <= {e["name"] for e in mid if e.get("ph") == "M"}
    assert any(e.get("args", {}).get("name") == "allreduce.grad" for e in mid)
    final = load_trace(url)
    assert len(final) > len(mid)
    assert_allreduce_events(final)
    assert sum(1 for e in final if e.get("name") == "ALLREDUCE" and e.get("ph") == "B") >= 80
    assert not fs.exists(live_path), "the live view stays after the complete timeline was written"
    assert not [p for p in fs.ls(path.rsplit("/", 1)[0], detail=False) if ".tmp-" in p]


def test_live_view_stays_within_its_window_on_a_long_run(tmp_path, no_leftovers):
    """A run whose timeline outgrows the window: each refresh of the live view is at most the
    window plus the metadata events, it keeps the tensors' names, and the complete file has everything."""
    url = str(tmp_path / "timeline.json")
    window = 64 << 10
    sizes = []
    stop = threading.Event()

    def watch():
        while not stop.wait(0.05):
            try:
                with open(live_view_location(url), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            if data and data not in sizes[-1:]:
                sizes.append(len(data))
                json.loads(data)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        HorovodRunner(np=-2, timeline=url, timeline_interval=0.2, timeline_live_bytes=window).run(
            rf.allreduce_steps, steps=1500, pause=0.002)
    finally:
        stop.set()
        watcher.join()
    final = Path(url).read_bytes()
    assert len(final) > 3 * window, f"the run's timeline ({len(final)} bytes) did not outgrow the window"
    assert sizes, "no live view was seen during the run"
    assert max(sizes) <= window + 4096, f"live view sizes {sizes} exceed the {window}-byte window"
    assert_allreduce_events(json.loads(final))


def test_no_live_view_when_turned_off(tmp_path, no_leftovers):
    url = str(tmp_path / "timeline.json")
    HorovodRunner(np=-2, timeline=url, timeline_interval=0.2, timeline_live_bytes=0).run(
        rf.allreduce_steps, steps=20)
    assert_allreduce_events(load_trace(url))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.json"]


@pytest.mark.parametrize("value", [-1, 1000, 1.5, True])
def test_bad_live_window_is_refused_before_anything_starts(value):
    with pytest.raises(ValueError, match="timeline_live_bytes"):
        HorovodRunner(np=-2, timeline="/tmp/never.json", timeline_live_bytes=value)


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


def test_time_window_of_a_complete_timeline(tmp_path, monkeypatch, no_leftovers):
    """A trace too large for the viewer: cut the seconds you want, with every tensor's name, as a valid trace."""
    import subprocess
    import sys

    from airflow_provider_hvd.runner import timeline_window

    source = str(tmp_path / "timeline.json")
    HorovodRunner(np=-2, timeline=source).run(rf.allreduce_steps, steps=40)
    events = load_trace(source)
    times = sorted(e["ts"] for e in events if e.get("ph") != "M")
    low, high = times[len(times) // 3], times[2 * len(times) // 3]
    start, duration = low / 1e6, (high - low) / 1e6
    expected = [e for e in events if e.get("ph") == "M" or int(start * 1e6) <= e["ts"] < int((start + duration) * 1e6)]
    assert 0 < len(expected) < len(events)

    out = subprocess.run([sys.executable, "-m", "airflow_provider_hvd.runner.timeline_window", source,
                          f"file://{tmp_path}/window.json", "--start", repr(start), "--duration", repr(duration)],
                         capture_output=True, text=True, check=True)
    assert f"kept {len(expected)} of {len(events)} events" in out.stdout
    assert load_trace(str(tmp_path / "window.json")) == expected
    # The same through blocks far smaller than one event's neighbourhood: boundaries fall anywhere.
    monkeypatch.setattr(timeline_window, "_BLOCK", 100)
    timeline_window.cut_window(source, str(tmp_path / "small-blocks.json"), start, duration)
    assert load_trace(str(tmp_path / "small-blocks.json")) == expected


def test_time_window_refuses_what_is_not_a_timeline(tmp_path):
    import subprocess
    import sys

    (tmp_path / "notes.json").write_text('{"not": "a trace"}')
    cli = [sys.executable, "-m", "airflow_provider_hvd.runner.timeline_window"]
    out = subprocess.run([*cli, str(tmp_path / "notes.json"), str(tmp_path / "w.json")], capture_output=True, text=True)
    assert out.returncode == 2 and "not a Horovod Timeline" in out.stderr
    out = subprocess.run([*cli, str(tmp_path / "missing.json"), str(tmp_path / "w.json")], capture_output=True, text=True)
    assert out.returncode == 2 and "no such timeline" in out.stderr
    out = subprocess.run([*cli, "a.json", "b.json", "--start", "-5"], capture_output=True, text=True)
    assert out.returncode == 2 and "--start must be >= 0" in out.stderr
    assert not (tmp_path / "w.json").exists()


def test_tail_restores_a_closing_bracket_horovod_has_since_overwritten(tmp_path):
    """A read that overlaps Horovod's append sees the old "]" and the next event after it ("}]{"):
    the tail ships what the file holds once the append is done ("},{"), so the trace stays valid."""
    from airflow_provider_hvd.runner.barrier.timeline_tail import TimelineTail

    path = tmp_path / "timeline.json"
    # What one read() returned while Horovod appended: its bytes came from before and after the append.
    path.write_bytes(b'[\n{"ph": "B", "ts": 1, "pid": 1}]{"ph": "E", "ts": 2, "pid": 1}]\n{"ph": "B", "ts": 3}]')
    tail = TimelineTail(str(path))
    shipped = tail.read_new() + tail.read_new(final=True)
    assert shipped == b'[\n{"ph": "B", "ts": 1, "pid": 1},{"ph": "E", "ts": 2, "pid": 1},\n{"ph": "B", "ts": 3}]'
    assert [e["ts"] for e in json.loads(shipped)] == [1, 2, 3]


def test_undeliverable_timeline_stays_on_the_driver(tmp_path, caplog, no_leftovers):
    """Storage refuses the complete timeline (here: its folder is a file): training still returns, the
    error names the destination and where the complete timeline was kept, and that file is whole."""
    import logging
    import re

    (tmp_path / "not-a-folder").write_text("")
    url = f"file://{tmp_path}/not-a-folder/timeline.json"
    with caplog.at_level(logging.INFO, logger="airflow_provider_hvd.runner"):
        assert HorovodRunner(np=-2, timeline=url, timeline_live_bytes=0).run(rf.allreduce_steps, steps=10) == 10
    message = next(r.getMessage() for r in caplog.records if "could not write the timeline" in r.getMessage())
    assert "not-a-folder/timeline.json after 3 attempts" in message
    kept = Path(re.search(r"stays on the driver at (\S+)", message).group(1))
    try:
        assert_allreduce_events(json.loads(kept.read_bytes()))
    finally:
        kept.unlink()


def test_a_timeline_store_that_does_not_answer_is_not_tried_again(tmp_path, caplog, monkeypatch):
    """Nothing listens at the S3 endpoint (the store is down): its client has retried already, so the
    complete timeline is kept on the driver at once, not after more attempts of ours that would
    only delay the run's own error."""
    import logging
    import re
    import socket

    from airflow_provider_hvd.runner.driver.timeline_publisher import TimelinePublisher

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    fsspec.config.conf.pop("s3", None)
    publisher = TimelinePublisher("s3://hvd-down/run/timeline.json", 5, 0)
    publisher.add(b'[\n{"name": "process_name", "ph": "M", "pid": 1},\n{"ph": "B", "ts": 1, "pid": 1},\n')
    with caplog.at_level(logging.INFO, logger="airflow_provider_hvd.runner"):
        publisher.finish()
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "retrying" in m], said
    message = next(m for m in said if "could not write the timeline" in m)
    assert "s3://hvd-down/run/timeline.json (the store did not answer)" in message, message
    kept = Path(re.search(r"stays on the driver at (\S+)", message).group(1))
    try:
        assert [e["ph"] for e in json.loads(chrome_trace_snapshot(kept.read_bytes()))] == ["M", "B"]
    finally:
        kept.unlink()
