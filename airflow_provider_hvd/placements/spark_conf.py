"""The Spark conf every placement starts from: GPU scheduling, quick-start JVMs, and where pyspark is.

The application's own JVMs (driver, executors) start on every task's critical path and then mostly
wait, so they start with the C1 compiler only and the serial collector (docs/benchmarks.md);
each option is added to what the user already gives those properties (the operator's ``conf``,
else the spark-defaults.conf spark-submit reads, whose value a ``--conf`` would replace), and only
where that says nothing about the option's setting: the user's collector or tiered-compilation
flag wins (two collectors are a JVM start error).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re

DRIVER = "spark.driver.extraJavaOptions"
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
EXECUTOR = "spark.executor.extraJavaOptions"
# (option, what in the user's options means they chose that setting themselves)
QUICK_START = (
    ("-XX:TieredStopAtLevel=1", re.compile(r"-XX:[+-]?Tiered")),
    ("-XX:+UseSerialGC", re.compile(r"-XX:\+Use\w*GC\b")),
)


def pyspark_dir() -> str:
    """pyspark's package folder, found without importing pyspark (its import is slow, on the task's path)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("pyspark is not installed here: the operator submits through its spark-submit "
                                  "(pip install 'airflow-provider-hvd[airflow]')", name="pyspark")
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def spark_core_jar() -> str:
    """A jar every Spark host has: spark-core's, at the path this pyspark has it (the training image and
    the Airflow image install the same pyspark)."""
    found = sorted(glob.glob(os.path.join(pyspark_dir(), "jars", "spark-core_*.jar")))
    if not found:
        raise ValueError("deploy_mode 'cluster' on a standalone master needs a Spark jar as the primary resource "
                         "and this pyspark has no jars/spark-core_*.jar: set the horovod connection's "
                         "cluster_spark_jar field to a jar path every Spark host has")
    return found[0]


def check_gpus(gpus_per_executor: int | None, discovery_script: str | None) -> None:
    if discovery_script and not gpus_per_executor:
        raise ValueError("gpu_discovery_script without gpus_per_executor: say how many GPUs each executor has")
    if gpus_per_executor is not None and int(gpus_per_executor) < 1:
        raise ValueError(f"gpus_per_executor must be 1 or more, got {gpus_per_executor!r}")


def gpu_conf(gpus_per_executor: int | None, discovery_script: str | None, vendor: str | None) -> dict[str, str]:
    """Spark's GPU scheduling for one GPU per rank: each barrier task (rank) holds one GPU, each
    executor offers ``gpus_per_executor``; HorovodRunner then pins each rank to its task's GPU."""
    check_gpus(gpus_per_executor, discovery_script)
    if not gpus_per_executor:
        return {}
    conf = {"spark.executor.resource.gpu.amount": str(int(gpus_per_executor)),
            "spark.task.resource.gpu.amount": "1"}
    if discovery_script:
        conf["spark.executor.resource.gpu.discoveryScript"] = discovery_script
    if vendor:
        conf["spark.executor.resource.gpu.vendor"] = vendor
    return conf


def with_quick_start(existing: str) -> str:
    """``existing`` JVM options plus each quick-start option whose setting they leave alone."""
    added = [option for option, chosen in QUICK_START if not chosen.search(existing)]
    return " ".join([existing.strip(), *added]).strip()


def spark_defaults() -> dict[str, str]:
    """The properties of the spark-defaults.conf that spark-submit reads on this host
    (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else pyspark's own ``conf``); empty when none."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = os.environ.get("SPARK_HOME") or pyspark_dir()
        conf_dir = os.path.join(home, "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf")) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:  # Java properties, as Spark writes them: "key value" (or key=value, key: value)
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"(\S+?)(?:\s*[=:]\s*|\s+)(.*)$", line)
        key, value = (match.group(1), match.group(2)) if match else (line, "")
        found[key] = value.strip()
    return found


def quick_start_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the quick-start options merged into the driver's and the executors' options
    (their value in ``conf``, else in spark-defaults.conf, kept)."""
    defaults = spark_defaults() if any(key not in conf for key in (DRIVER, EXECUTOR)) else {}
    return {**conf, **{key: with_quick_start(str(conf.get(key, defaults.get(key, "")))) for key in (DRIVER, EXECUTOR)}}


def quick_start_submit_env(env: dict[str, str]) -> dict[str, str]:
    """spark-submit's environment for a cluster-mode submission, its own JVM quick to start."""
    return {**env, SUBMIT_OPTS: with_quick_start(env.get(SUBMIT_OPTS, ""))}


def quiet_driver_log(conf: dict[str, str], log4j2_config: str) -> dict[str, str]:
    """Spark's INFO lines would bury the ranks' in the task log, and spark.log.level applies only once
    the SparkContext exists: the driver's JVM starts with our log4j2 configuration (WARN, plus the line
    with the Spark UI's address). ``spark.log.level`` INFO (or DEBUG, ...) leaves Spark's own in place."""
    conf = dict(conf)
    level = str(conf.setdefault("spark.log.level", "WARN")).upper()
    existing = str(conf.get(DRIVER, ""))
    if level in ("WARN", "ERROR", "FATAL", "OFF") and "log4j2.configurationFile" not in existing:
        conf[DRIVER] = f"{existing} -Dlog4j2.configurationFile=file:{log4j2_config}".strip()
    return conf
