"""The driver's output shipped through storage (cluster deploy mode): every line once, in order, whole."""

import sys

from airflow_provider_hvd.runner.driver.log_shipper import LogShipper, LogTail


def test_the_tail_reads_every_line_once_in_order_and_lines_split_across_chunks_come_whole(tmp_path):
    url = f"file://{tmp_path}/driver-log"
    shipper = LogShipper(url, interval=3600).start()  # shipped by hand below, not by the thread
    tail = LogTail(url)
    try:
        assert tail.heartbeat() is not None  # beaten at start: the follower knows the driver lives
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
    assert tail.heartbeat()["chunks"] == 3
    # Closed without an exit code: only the master can say how the driver ended.
    assert tail.look(ended=False) == ([], False)
    assert sorted(p.name for p in (tmp_path / "driver-log").iterdir()) == [
        "00000000.log", "00000001.log", "00000002.log", "heartbeat.json"]
