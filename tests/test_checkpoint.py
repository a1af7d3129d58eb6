"""Checkpoints are streamed into their destination and appear whole or not at all: on a local
disk and on S3 (moto's standalone server, the stand-in for a cloud bucket)."""

import tracemalloc

import fsspec
import pytest

from airflow_provider_hvd import latest_checkpoint, load_checkpoint, save_checkpoint
from airflow_provider_hvd.runner.common.storage import atomic_open, remove_partial_writes, tmp_name

MIB = 1 << 20


@pytest.fixture(params=["file", "s3"])
def folder(request, tmp_path):
    if request.param == "file":
        return str(tmp_path / "checkpoints")
    return f"s3://{request.getfixturevalue('s3_bucket')}/run/checkpoints"


def names(folder):
    fs, path = fsspec.core.url_to_fs(folder)
    try:
        return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
    except FileNotFoundError:
        return []


def test_a_streamed_checkpoint_holds_no_copy_of_the_state(folder):
    import torch

    state = {"w": torch.arange(64 * MIB // 4, dtype=torch.float32), "epoch": 7}  # 64 MiB of tensor
    tracemalloc.start()
    try:
        url = save_checkpoint(state, folder, step=7)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Built in memory first (torch.save into BytesIO, then bytes), this was over 128 MiB of
    # Python objects; streamed, what is held does not grow with the state: on S3 one 8 MiB
    # upload part and botocore's copies of it (~25 MiB), on a disk almost nothing.
    assert peak < 32 * MIB, f"{peak / MIB:.1f} MiB traced while saving 64 MiB"
    assert url == latest_checkpoint(folder) and url.endswith("/ckpt-0000000007.pt")
    loaded = load_checkpoint(url)
    assert loaded["epoch"] == 7 and torch.equal(loaded["w"], state["w"])


def test_a_write_that_fails_midway_leaves_nothing(folder):
    save_checkpoint({"epoch": 1}, folder, step=1)
    with pytest.raises(RuntimeError, match="disk gone"):
        with atomic_open(f"{folder}/ckpt-0000000002.pt") as f:
            f.write(b"x" * (9 * MIB))  # past one upload part on S3
            raise RuntimeError("disk gone")
    assert names(folder) == ["ckpt-0000000001.pt"]
    assert latest_checkpoint(folder).endswith("/ckpt-0000000001.pt")


def test_a_state_torch_cannot_save_leaves_nothing(folder):
    with pytest.raises(Exception):
        save_checkpoint({"fn": lambda: 0}, folder, step=3)
    assert names(folder) == []
    assert latest_checkpoint(folder) is None


def test_partial_files_are_ignored_and_only_the_runs_own_are_removed(tmp_path):
    folder = tmp_path / "checkpoints"
    save_checkpoint({"epoch": 1}, str(folder), step=1)
    mine, other = folder / tmp_name("ckpt-0000000002.pt", "run1"), folder / tmp_name("ckpt-0000000002.pt", "run2")
    mine.write_bytes(b"torn")
    other.write_bytes(b"still being written by another run")
    assert latest_checkpoint(str(folder)).endswith("/ckpt-0000000001.pt")
    assert [p.rsplit("/", 1)[-1] for p in remove_partial_writes(str(folder), "run1")] == [mine.name]
    assert sorted(p.name for p in folder.iterdir()) == sorted(["ckpt-0000000001.pt", other.name])


def test_a_checkpoint_that_cannot_be_written_names_itself_and_where(tmp_path):
    from airflow_provider_hvd.runner.checkpoint import CheckpointWriteError

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the checkpoint folder should be")
    with pytest.raises(CheckpointWriteError, match=rf"writing checkpoint 3 to {blocker}/ckpt-0000000003.pt failed: "):
        save_checkpoint({"epoch": 3}, str(blocker), step=3)
    assert blocker.read_text().startswith("a file")  # nothing half-written in its place
