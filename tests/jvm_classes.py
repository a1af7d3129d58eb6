"""A class-data-sharing archive (the JDK's own CDS) of the classes a Spark JVM loads, for the JVMs the
tests start: each maps the archive instead of parsing and verifying Spark's classes again.

Dumped once per JDK and pyspark (a local Spark session with a barrier stage and a Python worker, run
with -XX:ArchiveClassesAtExit) into ~/.cache/airflow-provider-hvd/jvm/. A JVM whose class path does
not start as the archive's (another SPARK_CONF_DIR, say) cannot use it and runs as without; the JDK's
note saying so is silenced (-Xlog:cds=off), so that no JVM's output changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pyspark

SILENT = "-Xlog:cds=off -Xlog:cds+dynamic=off"
PROBE = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.range(100).selectExpr("sum(id)").collect()
spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(lambda rows: [sum(rows)]).collect()
spark.stop()
"""


def _key() -> str:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(f"{p.name} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in jars.glob("*.jar"))
    return hashlib.sha256("\n".join([java, pyspark.__version__, str(jars), *listing]).encode()).hexdigest()[:16]


def archive(java_options: str) -> Path | None:
    """The archive for JVMs started with ``java_options``, dumped first if the cache has none; None
    (and a note on stderr) where it cannot be made: the tests then run without it."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-provider-hvd" / "jvm"
    path = cache / f"spark-{hashlib.sha256(java_options.encode()).hexdigest()[:8]}-{_key()}.jsa"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    env = {**os.environ, "JAVA_TOOL_OPTIONS": f"{java_options} {SILENT} -XX:ArchiveClassesAtExit={partial}"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not partial.exists():
        print(f"tests/jvm_classes.py: no class archive for Spark's JVMs ({done.returncode}); the tests run "
              f"without one:\n{done.stderr[-2000:]}", file=sys.stderr)
        partial.unlink(missing_ok=True)
        return None
    partial.rename(path)  # whole or not at all: a JVM never maps a half-written archive
    return path
