"""Fetch the Compose Specification's JSON schema (pinned URL and SHA-256 in pyproject.toml) into the
cache, for tests/test_deploy.py. Prints the schema's path. Idempotent.

Usage: python3 scripts/fetch_compose_schema.py
"""

import hashlib
import io
import os
import pathlib
import sys
import tarfile
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from versions import docker_pins  # noqa: E402


def schema_path() -> pathlib.Path:
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    return cache / "airflow-provider-hvd" / f"compose-spec-{docker_pins()['compose_schema_sha256'][:12]}.json"


def fetch() -> pathlib.Path:
    pins, target = docker_pins(), schema_path()
    if target.exists():
        return target
    with urllib.request.urlopen(pins["compose_schema_url"], timeout=60) as response:
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != pins["compose_schema_sha256"]:
        raise SystemExit(f"fetch_compose_schema: {pins['compose_schema_url']} has sha256 {digest}, "
                         f"pyproject.toml pins {pins['compose_schema_sha256']}: refusing it")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        schema = tar.extractfile(pins["compose_schema_member"]).read()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(schema)
    tmp.replace(target)
    return target


if __name__ == "__main__":
    print(fetch())
