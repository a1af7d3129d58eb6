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

Each option is added only where the user's own ``spark.driver.extraJavaOptions`` /
``spark.executor.extraJavaOptions`` (the operator's ``conf``) says nothing about that setting:
a collector of their own (two collectors are a JVM start error) or any tiered-compilation flag
wins. Options a cluster's administrators want everywhere belong in
``spark.{driver,executor}.defaultJavaOptions``, which Spark prepends to these.
"""

from __future__ import annotations

import re

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


def quick_start_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the quick-start options merged into the driver's and the executors' options."""
    return {**conf, **{key: with_quick_start(str(conf.get(key, ""))) for key in (DRIVER, EXECUTOR)}}


def quick_start_submit_env(env: dict[str, str]) -> dict[str, str]:
    """spark-submit's environment for a cluster-mode submission, its own JVM quick to start."""
    return {**env, SUBMIT_OPTS: with_quick_start(env.get(SUBMIT_OPTS, ""))}
