"""Where this host's pyspark is installed, found without importing it.

The operator needs pyspark's folder twice before spark-submit starts (its ``conf`` folder, its
spark-core jar), and ``import pyspark`` costs about 0.45 s (py4j, pandas checks, the SQL types),
on the task's critical path: the import system's finder answers in milliseconds instead.
"""

from __future__ import annotations

import importlib.util
import os


def pyspark_dir() -> str:
    """pyspark's package folder (what ``os.path.dirname(pyspark.__file__)`` would say)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("pyspark is not installed here: the operator submits through its spark-submit "
                                  "(pip install 'airflow-provider-hvd[airflow]')", name="pyspark")
    return os.path.abspath(list(spec.submodule_search_locations)[0])
