"""GPU pinning without a GPU: Spark's resource scheduling runs docker/'s real discovery script
(docker/spark/gpu_discovery.sh) over a FAKE nvidia-smi that reports GPUs 4 and 7 (this machine has
none), and a driver whose CUDA_VISIBLE_DEVICES names fake GPUs. No GPU machine was lent to the
sessions that wrote this: the NCCL path is not run here."""

import os
import shutil
import stat
from pathlib import Path

import pytest
import rank_functions as rf
from conftest import new_session

from airflow_provider_hvd import HorovodRunner

REPO = Path(__file__).resolve().parent.parent


def visible_devices():
    import horovod.torch as hvd

    hvd.init()
    return hvd.allgather_object({"rank": hvd.rank(), "local_rank": hvd.local_rank(),
                                 "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})


@pytest.fixture(scope="module")
def spark_with_fake_gpus(tmp_path_factory):
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    fake_bin = tmp_path_factory.mktemp("fake-nvidia-smi")
    nvidia_smi = fake_bin / "nvidia-smi"  # FAKE: answers the discovery script's query with GPUs 4 and 7
    nvidia_smi.write_text("#!/bin/sh\nprintf '4\\n7\\n'\n")
    nvidia_smi.chmod(nvidia_smi.stat().st_mode | stat.S_IEXEC)
    # local-cluster's worker runs inside the driver's JVM, which may predate this test: its
    # environment cannot be changed, so a wrapper puts the FAKE nvidia-smi on the real script's PATH.
    script = fake_bin / "discover.sh"
    script.write_text(f'#!/bin/sh\nPATH="{fake_bin}:$PATH" exec "{REPO / "docker" / "spark" / "gpu_discovery.sh"}"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    spark = new_session("local-cluster[1,2,1024]", "hvd-tests-fake-gpus", **{
        "spark.executor.memory": "768m",
        "spark.worker.resource.gpu.amount": "2", "spark.worker.resource.gpu.discoveryScript": str(script),
        "spark.executor.resource.gpu.amount": "2", "spark.executor.resource.gpu.discoveryScript": str(script),
        "spark.task.resource.gpu.amount": "1"})
    yield spark
    spark.stop()


def test_each_barrier_rank_sees_only_its_tasks_gpu(spark_with_fake_gpus, no_leftovers):
    seen = HorovodRunner(np=2, slot_wait_timeout=60).run(visible_devices)
    assert sorted(r["cuda_visible_devices"] for r in seen) == ["4", "7"]
    assert sorted(r["local_rank"] for r in seen) == [0, 1]


def test_local_mode_pins_by_local_rank_over_the_drivers_gpus(monkeypatch, no_leftovers):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    seen = HorovodRunner(np=-2).run(visible_devices)
    assert {r["local_rank"]: r["cuda_visible_devices"] for r in seen} == {0: "2", 1: "5"}


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="asserts the CPU-only path: this machine has GPUs")
def test_no_gpus_no_pinning(no_leftovers):
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None
    assert HorovodRunner(np=-2).run(rf.echo_env, name="CUDA_VISIBLE_DEVICES") is None
