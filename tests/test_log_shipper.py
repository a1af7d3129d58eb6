"""The driver's output shipped through storage (cluster deploy mode): every line once, in order, whole."""

import json
import sys
import time

from airflow_provider_hvd.hooks.standalone_driver import DriverOutput
from airflow_provider_hvd.runner.driver.log_shipper import LogShipper


def test_the_tail_reads_every_line_once_in_order_and_lines_split_across_chunks_come_whole(tmp_path):
    url = f"file://{tmp_path}/driver-log"
    shipper = LogShipper(url, interval=3600).start()  # shipped by hand below, not by the thread
    tail = DriverOutput(url)
    try:
        # Beaten at start (from the shipper's thread): the follower soon knows the driver lives.
        deadline = time.monotonic() + 10
        while tail.heartbeat() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        beat = tail.heartbeat()
        assert beat is not None and beat.chunks == 0, beat
        print("rank 0: epoch 1")
        sys.stdout.write("rank 1: half a li")
        shipper.ship()
        # What a follower does: the heartbeat counts the chunks to read; the half line waits for its end.
        assert tail.look(ended=False) == (["rank 0: epoch 1"], False)
        sys.stdout.write("ne\n")
        print("to stderr", file=sys.stderr)
        shipper.ship()
        assert tail.read_new() == ["rank 1: half a line", "to stderr"]
        assert tail.read_new() == []  # nothing new: nothing twice
        sys.stdout.write("no newline at the end")
    finally:
        shipper.close()
    assert tail.read_new(final=True) == ["no newline at the end"]
    assert tail.heartbeat().chunks == 3
    # Closed without an exit code: only the master can say how the driver ended.
    assert tail.look(ended=False) == ([], False)
    assert sorted(p.name for p in (tmp_path / "driver-log").iterdir()) == [
        "00000000.log", "00000001.log", "00000002.log", "heartbeat.json"]


def test_a_follower_reads_the_heartbeat_while_the_driver_rewrites_it_on_s3(s3_bucket):
    """The driver rewrites heartbeat.json (S3 on moto's server, the stand-in for a bucket) while the task's
    follower reads it every look: each read is one whole version, never an error. (A file object pins the
    version its first request saw and fails with HTTP 412 when the object changes before its read: that
    failed a deferred task in the bench.)"""
    import threading

    from airflow_provider_hvd.runner.common.storage import atomic_write

    url = f"s3://{s3_bucket}/driver-log"
    stop = threading.Event()

    def rewrite():
        n = 0
        while not stop.is_set():
            n += 1
            atomic_write(f"{url}/heartbeat.json", json.dumps({"time": n, "chunks": 0}).encode())

    atomic_write(f"{url}/heartbeat.json", json.dumps({"time": 0, "chunks": 0}).encode())
    writer = threading.Thread(target=rewrite)
    writer.start()
    tail = DriverOutput(url)
    try:
        seen = [tail.heartbeat().time for _ in range(150)]
        looks = [tail.look(ended=False) for _ in range(50)]
    finally:
        stop.set()
        writer.join()
    assert seen == sorted(seen) and seen[-1] > seen[0], seen  # newer versions, each read whole
    assert looks == [([], False)] * 50


def test_a_chunk_storage_fails_to_return_is_read_on_the_next_look_and_nothing_is_lost(tmp_path):
    """A chunk the heartbeat counts cannot be read for a moment (here: a directory where the file should be,
    a real filesystem error): the look returns the lines before it and the follower carries on; a later
    look reads it. The look that sees the driver's end tries its last read again before it gives up."""
    import threading

    url = f"file://{tmp_path}/driver-log"
    shipper = LogShipper(url, interval=3600).start()
    tail = DriverOutput(url)
    try:
        for n in range(3):
            print(f"line {n}")
            shipper.ship()
        chunk_1 = tmp_path / "driver-log" / "00000001.log"
        aside = chunk_1.with_suffix(".aside")
        chunk_1.rename(aside)
        chunk_1.mkdir()  # reading it now fails with IsADirectoryError
        lines, finished = tail.look(ended=False)
        assert (lines, finished) == (["line 0"], False) and isinstance(tail.read_error, IsADirectoryError)
        print("line 3")
    finally:
        shipper.close(exit_code=0)

    def storage_back():  # while the last read waits to try again
        time.sleep(0.5)
        chunk_1.rmdir()
        aside.rename(chunk_1)

    back = threading.Thread(target=storage_back)
    back.start()
    more, finished = tail.look(ended=False)  # the exit code: the driver's last look
    back.join()
    assert finished and lines + more == ["line 0", "line 1", "line 2", "line 3"] and tail.read_error is None
