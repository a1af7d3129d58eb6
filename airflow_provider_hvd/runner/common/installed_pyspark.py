"""Import pyspark (and py4j) from their installation, not from Spark's zips, when both are the same release.

Spark starts each Python process it runs (the driver under spark-submit, every executor's Python
worker daemon) with ``$SPARK_HOME/python/lib/pyspark.zip`` and ``py4j-*-src.zip`` first on
``PYTHONPATH``. Python imports a zip's modules without bytecode, and those zips hold none, so
every one of those processes compiles pyspark's source anew before its first line of work,
where an installation's bytecode was compiled once (docs/benchmarks.md). A worker's daemon pays
it on its stage's critical path, and the driver before its SparkContext.

Where the same release is installed on the path as well (``pip install pyspark``, which is also
what a pip-installed Spark's ``SPARK_HOME`` points into), that copy is the same code: the zip
leaves ``sys.path`` before the package is first imported. A zip of another release stays, since
it is the one that matches the JVM side that runs.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
import zipfile

# (package, how Spark's zip of it is named)
SPARK_ZIPS = (("pyspark", re.compile(r"pyspark\.zip")), ("py4j", re.compile(r"py4j-[\w.]+-src\.zip")))
_VERSION = re.compile(r"""^__version__(?:\s*:\s*str)?\s*=\s*["']([^"']+)["']""", re.M)


def prefer_installed() -> list[str]:
    """Drop from ``sys.path`` each of Spark's zips whose package is installed elsewhere on it at
    the same version; returns the zips dropped. Does nothing for a package already imported."""
    dropped = []
    for package, name in SPARK_ZIPS:
        if package in sys.modules:
            continue
        zips = [entry for entry in sys.path if name.fullmatch(os.path.basename(entry)) and os.path.isfile(entry)]
        if not zips:
            continue
        rest = [entry for entry in sys.path if entry not in zips]
        installed = _installed_version(package, rest)
        if installed and all(_zipped_version(path, package) == installed for path in zips):
            sys.path[:] = rest
            dropped += zips
    return dropped


def _installed_version(package: str, path: list[str]) -> str | None:
    spec = importlib.machinery.PathFinder.find_spec(package, path)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
            return _version_in(f.read())
    except OSError:
        return None


def _zipped_version(path: str, package: str) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            return _version_in(archive.read(f"{package}/version.py").decode())
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def _version_in(text: str) -> str | None:
    found = _VERSION.search(text)
    return found.group(1) if found else None
