"""The signing key on its way to the Spark driver, and spark-submit's environment without it.

The key signs the payload the driver unpickles, so whoever holds it can run code on the cluster.
It never goes on spark-submit's command line (``/proc/<pid>/cmdline`` shows that to every user of
the host, and the Spark provider logs it), nor into a Spark property (the event log and the UI's
environment page record those). Each placement says how it gets there (its ``deliver_key``):

- client mode, any master: a file only this user can read (``key_file``), named by
  ``HVD_SIGNING_KEY_FILE`` in spark-submit's environment; the driver reads and deletes it before any
  user code runs, and the folder goes when spark-submit ends, whatever happened.
- YARN cluster mode: the same file through ``--files`` (the application's private staging directory).
- Kubernetes cluster mode: a Kubernetes Secret the driver pod reads (``secretKeyRef``).
- standalone cluster mode: spark-submit's environment, which Spark's RPC client hands to the driver
  (``spark.authenticate`` and ``spark.network.crypto.enabled`` keep that private to the cluster).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from airflow_provider_hvd.runner.spark_app import KEY_FOLDER_PREFIX

log = logging.getLogger(__name__)

# The key file's name (a YARN container's working directory has it under this name).
KEY_FILE_NAME = "hvd-signing-key"
# Spark's per-host address settings: wrong on any other host.
HOST_BOUND_ENV = ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME", "SPARK_PUBLIC_DNS")


@contextmanager
def key_file(key: bytes) -> Iterator[str]:
    """The key, hex, in a file only this user can read, inside a folder of its own; both gone on exit."""
    # Mode 0700. The driver removes the file and, by its prefix, this folder once it has read the key.
    folder = tempfile.mkdtemp(prefix=KEY_FOLDER_PREFIX)
    try:
        path = os.path.join(folder, KEY_FILE_NAME)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.hex())
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def environment_without(key: bytes, added: dict[str, str], travels: bool) -> dict[str, str]:
    """spark-submit's environment: this process's, less every variable that carries the key (the
    ``horovod`` connection given as an ``AIRFLOW_CONN_*`` variable would otherwise reach the driver,
    local executors and ranks), plus ``added``. ``travels``: it goes to the driver on the cluster,
    so Airflow's connections and settings stay here."""
    key_hex = key.hex()
    kept = {name: value for name, value in os.environ.items()
            if key_hex not in value.lower() and key_hex not in name.lower()}
    if travels:
        kept = {name: value for name, value in kept.items() if not name.lstrip("_").startswith("AIRFLOW")}
        bound = sorted(set(kept) & set(HOST_BOUND_ENV))
        if bound:
            log.warning("%s set here will reach the Spark driver on the cluster (Spark's standalone client sends "
                        "spark-submit's environment along), binding it to this host's address: unset them on the "
                        "Airflow worker unless that address is right for the driver too", ", ".join(bound))
    return {**kept, **added}
