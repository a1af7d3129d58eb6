"""Prove the environment is real: horovod has PyTorch (and TensorFlow), MPI and Gloo; Spark runs a barrier stage.

Run by scripts/setup.sh as its last step; exits non-zero naming what is missing.
"""

import os
import re
import shutil
import subprocess
import sys

# What `horovodrun --check-build` must tick; the TensorFlow flavour adds its plugin.
REQUIRED = ("PyTorch", "MPI", "Gloo") + (("TensorFlow",) if os.environ.get("HVD_FLAVOUR") == "tensorflow" else ())


def horovod_build() -> tuple[set[str], str]:
    """What `horovodrun --check-build` ticks (frameworks, controllers, operations), and its output."""
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    if not horovodrun:
        sys.exit("check_env: horovodrun is not installed in this environment; rerun scripts/setup.sh")
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, check=False).stdout
    return set(re.findall(r"\[X\] (\S+)", out)), out


def check_horovod_build() -> None:
    enabled, out = horovod_build()
    missing = [name for name in REQUIRED if name not in enabled]
    if missing:
        sys.exit(f"check_env: horovod was built without {', '.join(missing)}:\n{out}\n"
                 "Delete the cached wheel (~/.cache/airflow-provider-hvd/wheels) and rerun scripts/setup.sh")
    print(f"    horovod build has {', '.join(REQUIRED)}")


def check_spark_barrier() -> None:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("hvd-check-env")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        def task(_):
            from pyspark import BarrierTaskContext
            ctx = BarrierTaskContext.get()
            ctx.barrier()
            yield len(ctx.getTaskInfos())

        got = spark.sparkContext.parallelize([0], 1).barrier().mapPartitions(task).collect()
        if got != [1]:
            sys.exit(f"check_env: the Spark barrier stage returned {got}, expected [1]")
    finally:
        spark.stop()
    print("    a one-task Spark barrier stage ran")


if __name__ == "__main__":
    check_horovod_build()
    check_spark_barrier()
