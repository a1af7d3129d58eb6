"""Prove the environment is real: horovod has PyTorch (and TensorFlow), MPI and Gloo; Spark runs a barrier stage.

Run by scripts/setup.sh as its last step; exits non-zero naming what is missing.
"""

import os
import re
import shutil
import subprocess
import sys

# What horovod must be built with (what `horovodrun --check-build` ticks); the TensorFlow flavour adds its plugin.
REQUIRED = ("PyTorch", "MPI", "Gloo") + (("TensorFlow",) if os.environ.get("HVD_FLAVOUR") == "tensorflow" else ())


def horovod_build() -> tuple[set[str], str]:
    """What `horovodrun --check-build` ticks (frameworks, controllers, operations), and its output: the
    user's own check, which tests/test_tensorflow.py runs; the set-up reads the same in-process."""
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    if not horovodrun:
        sys.exit("check_env: horovodrun is not installed in this environment; rerun scripts/setup.sh")
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, check=False).stdout
    return set(re.findall(r"\[X\] (\S+)", out)), out


# The plugin module of each framework horovod can be built for.
PLUGINS = {"PyTorch": "horovod.torch", "TensorFlow": "horovod.tensorflow"}


def horovod_plugins() -> tuple[set[str], list[str]]:
    """What `horovodrun --check-build` would tick for the frameworks in REQUIRED, read in this process:
    each plugin loads, and the controllers it was built with. (horovodrun checks every framework in a
    process of its own: 9 s on every set-up, against under 2 s here.) Also the import errors seen."""
    import importlib

    enabled, errors = set(), []
    for name in REQUIRED:
        if name not in PLUGINS:
            continue
        try:
            plugin = importlib.import_module(PLUGINS[name])
        except ImportError as exc:
            errors.append(f"{PLUGINS[name]}: {exc}")
            continue
        enabled.add(name)
        enabled |= {"MPI"} if plugin.mpi_built() else set()
        enabled |= {"Gloo"} if plugin.gloo_built() else set()
    return enabled, errors


def check_horovod_build() -> None:
    enabled, errors = horovod_plugins()
    missing = [name for name in REQUIRED if name not in enabled]
    if missing:
        sys.exit(f"check_env: horovod was built without {', '.join(missing)}" + "".join(f"\n  {e}" for e in errors) +
                 "\nDelete the cached wheel (~/.cache/airflow-provider-hvd/wheels) and rerun scripts/setup.sh")
    print(f"    horovod build has {', '.join(REQUIRED)}")


def check_spark_barrier() -> None:
    from pyspark import SparkConf, SparkContext

    # A SparkContext (no Spark SQL) and the JVM options the operator gives its own drivers: 4 s less.
    sc = SparkContext(conf=SparkConf().setMaster("local[1]").setAppName("hvd-check-env")
                      .set("spark.ui.enabled", "false")
                      .set("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"))
    try:
        def task(_):
            from pyspark import BarrierTaskContext
            ctx = BarrierTaskContext.get()
            ctx.barrier()
            yield len(ctx.getTaskInfos())

        got = sc.parallelize([0], 1).barrier().mapPartitions(task).collect()
        if got != [1]:
            sys.exit(f"check_env: the Spark barrier stage returned {got}, expected [1]")
    finally:
        sc.stop()
    print("    a one-task Spark barrier stage ran")


if __name__ == "__main__":
    check_horovod_build()
    check_spark_barrier()
