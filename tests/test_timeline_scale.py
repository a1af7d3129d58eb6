"""A long run's Horovod Timeline, compressed into a minute: a synthetic multi-GiB timeline, written the way
Horovod writes it, goes through the real tail (barrier/timeline_tail.py), the real authenticated channel from a
launcher's DriverLink to the DriverService, and the real publisher, to a local file and to S3.

The S3 endpoint is moto's standalone server: a stand-in for a cloud bucket, which cannot be reached from here.
"""

import hashlib
import json
import os
import threading
import time
import tracemalloc

import fsspec
import pytest

from airflow_provider_hvd.runner import defaults
from airflow_provider_hvd.runner.common.storage import atomic_write_stream
from airflow_provider_hvd.runner.driver.service import DriverService
from airflow_provider_hvd.runner.driver.timeline_publisher import METADATA_MAX_BYTES, TimelinePublisher, \
    live_view_location
from airflow_provider_hvd.runner.barrier.driver_link import DriverLink
from airflow_provider_hvd.runner.wire import payload
from airflow_provider_hvd.runner.wire.messages import Role

GIB = float(os.environ.get("HVD_TIMELINE_TEST_GIB", "2"))
# The S3 run shows the same bound through multipart uploads: 0.5 GiB is 64 parts of 8 MiB, and its peak
# (57 MiB at 0.25 GiB, 59.5 MiB at 2 GiB, measured) does not grow with size; 2 GiB through moto cost CI
# about 2.5 minutes more (moto receives and serves it back at ~40 MB/s).
S3_GIB = float(os.environ.get("HVD_TIMELINE_TEST_S3_GIB", "0.5"))
INTERVAL = 0.25
# Driver memory allowed for the whole pipeline, whatever the timeline's size: the live window (8 MiB) and the
# metadata events (up to 1 MiB); a live-view upload (s3fs and botocore hold about three copies of an 8 MiB
# upload block: 25 MiB measured), then the final upload (the same, never at the same time); chunks in
# flight through the tail, the channel and the service (4 MiB each, a few copies). Measured: 32 MiB to
# file://, 57 MiB to S3, the same for 0.25 GiB as for 2 GiB.
MEMORY_BOUND = 96 << 20


class SyntheticHorovodTimeline:
    """Appends events to a file exactly as Horovod's rank 0 does: "[" first, metadata events that register
    each tensor name, events separated by ",", and after every write a closing "]" that the next write
    seeks back over. ``sha256`` is the digest of the file Horovod leaves after a clean shutdown."""

    def __init__(self, path, tensors=300, block_bytes=1 << 20, variants=8):
        self.path = path
        self.tensors = tensors
        self._digest = hashlib.sha256()
        self.size = 0
        # Rendered up front (before memory is measured): blocks of ordinary events, cycled.
        self._blocks = []
        for v in range(variants):
            events, n, ts = [], 0, v * 10_000_000
            while n < block_bytes:
                pid = 1 + (ts % tensors)
                e = (f'{{"ph": "B", "name": "ALLREDUCE", "ts": {ts}, "pid": {pid}}},'
                     f'{{"ph": "E", "ts": {ts + 7}, "pid": {pid}, "args": {{"dtype": "float32", "shape": "[1024]"}}}}')
                events.append(e)
                n += len(e) + 1
                ts += 11
            self._blocks.append(",".join(events).encode())

    def _metadata(self, first, last):
        return ",\n".join(
            f'{{"name": "process_name", "ph": "M", "pid": {p}, "args": {{"name": "allreduce.layer{p}.weight"}}}},\n'
            f'{{"name": "process_sort_index", "ph": "M", "pid": {p}, "args": {{"sort_index": {p}}}}}'
            for p in range(first, last + 1)).encode()

    def write(self, total_bytes, stop, on_progress=lambda size: None):
        with open(self.path, "wb") as f:
            head = (b'[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1}},\n'
                    + self._metadata(1, self.tensors))
            self._append(f, head, first=True)
            i = 0
            while self.size < total_bytes and not stop.is_set():
                self._append(f, self._blocks[i % len(self._blocks)])
                i += 1
                on_progress(self.size)
            self._digest.update(b"]")
            self.size += 1
            self.sha256 = self._digest.hexdigest()

    def _append(self, f, data, first=False):
        if not first:
            f.seek(-1, os.SEEK_END)  # over Horovod's closing "]"
            data = b"," + data
        f.write(data + b"]")
        f.flush()
        self._digest.update(data)
        self.size += len(data)


def first_difference(url_a, url_b, block=8 << 20):
    """Where two files first differ, with the bytes around it on each side (for a failure message)."""
    fa, pa = fsspec.core.url_to_fs(url_a)
    fb, pb = fsspec.core.url_to_fs(url_b)
    with fa.open(pa, "rb") as a, fb.open(pb, "rb", block_size=block) as b:
        offset = 0
        while True:
            x, y = a.read(block), b.read(block)
            if x != y:
                n = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
                return (f"first difference at byte {offset + n}: Horovod's {x[max(0, n - 80):n + 80]!r} "
                        f"against ours {y[max(0, n - 80):n + 80]!r}")
            if not x:
                return "no difference"
            offset += len(x)


def sha256_of(url):
    h = hashlib.sha256()
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb", block_size=8 << 20) as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()



def open_uploads(bucket):
    import boto3

    return boto3.client("s3").list_multipart_uploads(Bucket=bucket).get("Uploads", [])


@pytest.mark.parametrize("store", ["file", "s3"])
def test_multi_gib_timeline_with_bounded_memory_and_bounded_writes(store, tmp_path, request):
    gib = GIB if store == "file" else S3_GIB
    total = int(gib * (1 << 30))
    if store == "file":
        destination = f"file://{tmp_path}/out/timeline.json"
    else:
        destination = f"s3://{request.getfixturevalue('s3_bucket')}/run/timeline.json"
    source = tmp_path / "rank0-timeline.json"
    horovod = SyntheticHorovodTimeline(str(source))
    secret = payload.new_secret()
    seen = {"views": 0, "max": 0}
    last_view = tmp_path / "last-live-view.json"
    live_fs, live_path = fsspec.core.url_to_fs(live_view_location(destination))
    stop = threading.Event()

    def watch_live_view():  # what a person refreshing Perfetto would get, copied to disk
        while not stop.wait(0.1):
            copy = last_view.with_suffix(".part")
            try:
                # One GET streamed to disk: a consistent copy even while the next publish replaces it.
                live_fs.get_file(live_path, str(copy))
            except FileNotFoundError:  # not published yet
                continue
            copy.replace(last_view)
            seen["views"] += 1
            seen["max"] = max(seen["max"], last_view.stat().st_size)

    def let_a_reader_look(size, every=256 << 20, marks=[0]):
        """Horovod writes MBs a minute, this writer hundreds a second: every 256 MiB it waits until a
        reader has fetched a live view, so the test sees them mid-run rather than racing the writer."""
        if size // every > marks[0]:
            marks[0] = size // every
            views, deadline = seen["views"], time.monotonic() + 30
            while seen["views"] == views and time.monotonic() < deadline:
                time.sleep(0.05)

    tracemalloc.start()
    t0 = time.monotonic()
    publisher = TimelinePublisher(destination, INTERVAL, defaults.TIMELINE_LIVE_BYTES)
    service = DriverService(secret, b"", lambda *a: None, host="127.0.0.1", on_timeline=publisher.add)
    writer = threading.Thread(target=horovod.write, args=(total, stop, let_a_reader_look))
    watcher = threading.Thread(target=watch_live_view)
    try:
        link = DriverLink(("127.0.0.1", service.port), secret, {"role": Role.LAUNCHER, "rank": 0, "ranks": [0]})
        link.ship_timeline(str(source), INTERVAL)
        writer.start()
        watcher.start()
        writer.join()
        link.finish([])  # the launcher's last read ships what is left, Horovod's closing "]" included
        deadline = time.monotonic() + 120
        while publisher.staged_bytes < horovod.size and time.monotonic() < deadline:
            time.sleep(0.05)
        fed = time.monotonic() - t0
        # No new events, no new write: an idle run costs storage nothing, however long it waits.
        # First the publish of the last chunks, however long the store takes it (once, on a loaded
        # machine, moto took more than the 2 intervals this test used to allow: counted as idle).
        deadline = time.monotonic() + 60
        while (publisher._dirty or publisher.live_publishing) and time.monotonic() < deadline:
            time.sleep(INTERVAL / 5)
        before_idle = publisher.live_publishes
        time.sleep(6 * INTERVAL)
        idle_publishes = publisher.live_publishes - before_idle
    finally:
        stop.set()
        watcher.join()
        service.close()
    t_final = time.monotonic()
    publisher.finish()
    final_s = time.monotonic() - t_final
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    print(f"\n{store}: {horovod.size / 2**30:.2f} GiB fed in {fed:.1f} s, complete file written after "
          f"{final_s:.1f} s more; peak traced memory {peak / 2**20:.1f} MiB; "
          f"{publisher.live_publishes} live-view writes of at most {publisher.live_bytes_max / 2**20:.2f} MiB "
          f"({publisher.live_bytes_total / 2**20:.0f} MiB in all)")
    assert horovod.size >= total
    # Bounded driver memory: the whole timeline passed through, a constant stayed.
    assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.1f} MiB for a {horovod.size / 2**30:.1f} GiB timeline"
    # Bounded writes per interval: at most one live view per interval, each at most the window plus the
    # tensors' metadata events.
    assert publisher.live_publishes >= 1
    assert idle_publishes == 0, f"{idle_publishes} live views rewritten while no event came"
    assert publisher.live_bytes_max <= defaults.TIMELINE_LIVE_BYTES + METADATA_MAX_BYTES
    assert 0 < seen["max"] <= publisher.live_bytes_max
    assert seen["views"] >= int(gib * 4)  # one at least after every 256 MiB
    live = json.loads(last_view.read_bytes())  # a valid trace, with every tensor's name
    assert sum(1 for e in live if e.get("name") == "process_name") == horovod.tensors + 1
    assert {e.get("name") for e in live if e.get("ph") != "M"} == {"ALLREDUCE", None}
    # The complete timeline: written once, byte for byte Horovod's own file.
    assert publisher.final_bytes == horovod.size
    assert sha256_of(destination) == horovod.sha256, first_difference(str(source), destination)
    with fsspec.open(destination, "rb") as f:
        head = f.read(1 << 20)
        f.seek(-64, os.SEEK_END)
        end = f.read()
    assert head.startswith(b"[\n") and end.endswith(b"}}]")
    # Nothing left behind: the live view is gone, no temporary object or half-finished upload.
    fs, out_dir = fsspec.core.url_to_fs(destination.rsplit("/", 1)[0])
    assert fs.ls(out_dir, detail=False) == [fsspec.core.url_to_fs(destination)[1]]
    if store == "s3":
        assert open_uploads(out_dir.split("/")[0]) == []
    source.unlink()
    fs.rm(fsspec.core.url_to_fs(destination)[1])


def test_failed_upload_leaves_no_object_and_no_open_upload(s3_bucket):
    """A write that fails halfway (storage or driver error) aborts its upload: no half object, nothing billed."""

    def chunks():
        yield b"x" * (9 << 20)  # past one upload part: a multipart upload is under way
        yield b"y" * (9 << 20)
        raise ConnectionError("the driver lost the storage mid-write")

    with pytest.raises(ConnectionError):
        atomic_write_stream(f"s3://{s3_bucket}/run/timeline.json", chunks())
    fs = fsspec.filesystem("s3")
    assert not fs.exists(f"{s3_bucket}/run/timeline.json")
    assert open_uploads(s3_bucket) == []
