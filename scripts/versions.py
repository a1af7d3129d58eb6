"""Print the build recipe's pinned versions from pyproject.toml (the one place they live).

Usage: python3 scripts/versions.py horovod|torch|apt
"""

import pathlib
import sys
import tomllib

PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def build_pins() -> dict:
    with PYPROJECT.open("rb") as f:
        return tomllib.load(f)["tool"]["airflow-provider-hvd"]["build"]


if __name__ == "__main__":
    value = build_pins()[sys.argv[1]]
    print(" ".join(value) if isinstance(value, list) else value)
