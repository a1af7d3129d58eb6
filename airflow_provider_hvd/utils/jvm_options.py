"""JVM options for the application's own JVMs: its driver and its executors.

Those JVMs start for one training run and then mostly wait: the driver schedules one barrier stage
and relays nothing (the payload, logs and result travel over the runner's own channels), and each
executor hands its task to Python. Their start is on every task's critical path, and on a busy
host (two executors and a driver starting at once, on the same cores as the ranks) the JIT's
optimising compiler threads and the parallel collector's threads are most of what a JVM spends
starting. So the application asks for the quick-start setup: the C1 compiler only
(``-XX:TieredStopAtLevel=1``) and the serial collector (``-XX:+UseSerialGC``). Measured
(docs/benchmarks.md): spark-submit of a 2-task barrier job on ``local[2]``, 6.16 s -> 5.40 s.

In cluster mode spark-submit's own JVM only hands the application over (and, on YARN and
Kubernetes, waits for it): it starts the same way, through ``SPARK_SUBMIT_OPTS`` (in client mode
that JVM is the driver, which ``spark.driver.extraJavaOptions`` covers).

Each option is added to what the user already gives those properties (the operator's ``conf``,
else the ``spark-defaults.conf`` that spark-submit reads, whose value a ``--conf`` would otherwise
replace), and only where that says nothing about the option's setting: a collector of the user's
own (two collectors are a JVM start error) or any tiered-compilation flag wins.
"""

from __future__ import annotations

import os
import re

from airflow_provider_hvd.utils.pyspark_location import pyspark_dir

DRIVER = "spark.driver.extraJavaOptions"
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
EXECUTOR = "spark.executor.extraJavaOptions"
# (option, what in the user's options means they chose that setting themselves)
QUICK_START = (
    ("-XX:TieredStopAtLevel=1", re.compile(r"-XX:[+-]?Tiered")),
    ("-XX:+UseSerialGC", re.compile(r"-XX:\+Use\w*GC\b")),
)


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
