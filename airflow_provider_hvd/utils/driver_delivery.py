"""How the signing key and the driver's environment reach the Spark driver, per master and deploy mode.

The key signs the payload the driver unpickles, so whoever holds it can run code on the cluster.
It never goes on spark-submit's command line (``/proc/<pid>/cmdline`` shows that to every user of
the host, and the Spark provider logs it), nor into a Spark property (the event log and the UI's
environment page record those):

- **client mode, any master** (``local[*]``, ``spark://``, ``yarn``, ``k8s://``): the driver is
  spark-submit's child on the Airflow worker. The key is written to a file only this user can read,
  in a folder of its own; spark-submit's environment names the file (``HVD_SIGNING_KEY_FILE``); the
  driver reads it and deletes it before any user code runs, and the operator removes the folder when
  spark-submit ends, whatever happened. A one-time exchange: the path outlives the key.
- **YARN cluster mode**: the same file travels with ``--files`` (YARN's distributed cache, through
  the application's staging directory, private to its user and removed when the application ends)
  under the name ``hvd-signing-key``; ``spark.yarn.appMasterEnv.HVD_SIGNING_KEY_FILE`` names it.
- **Kubernetes cluster mode**: the driver pod takes the key from a Kubernetes Secret
  (``spark.kubernetes.driver.secretKeyRef.HVD_SIGNING_KEY=<secret>:<key>``), named by the ``horovod``
  connection's ``kubernetes_secret`` field; that Secret holds the connection's signing key. A key
  made for one run cannot get there without a command line or a pod spec, so this mode needs one.
- **standalone cluster mode**: spark-submit refuses Python applications there, so it submits
  Spark's own ``org.apache.spark.deploy.PythonRunner`` (what it runs for a ``.py`` in client mode)
  with spark_app.py as its first argument; the primary resource is a jar every Spark host has
  (spark-core's), which the driver then leaves out of ``spark.jars`` (HVD_CARRIER_JAR): executors
  need no copy of it. Spark's standalone client hands spark-submit's whole environment to the driver
  over Spark RPC (``spark.authenticate`` and ``spark.network.crypto.enabled`` keep that private to
  the cluster), so the key travels as ``HVD_SIGNING_KEY`` there; it reaches the environment of the
  driver's two processes (the worker's DriverWrapper JVM and its Python child, which drops it
  before user code runs) and nothing else: no rank or executor inherits it, no log, command line
  or Spark property shows it. The legacy RPC client is forced (``spark.master.rest.enabled=false``
  for the submission): the REST client sends SPARK_* variables only, in the clear. Variables
  named ``AIRFLOW*`` (connections, Airflow's own secrets) are left out of that environment.
  The operator follows the driver through the master's REST server (``spark.master.rest.enabled``
  on the master, port ``rest-port`` of the Spark connection, 6066 by default), as the Spark
  provider does, and the driver's output through storage (runner/driver/log_shipper.py).

The driver's other environment (the ranks' extra environment, unbuffered output) goes the way each
mode has for it: spark-submit's environment in client mode, ``spark.yarn.appMasterEnv.*`` or
``spark.kubernetes.driverEnv.*`` in cluster mode. Never through the Spark provider's ``env_vars``,
which puts them on the command line for YARN and Kubernetes even in client mode.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from airflow_provider_hvd.runner import spark_app
from airflow_provider_hvd.runner.spark_app import KEY_FOLDER_PREFIX, SIGNING_KEY_ENV, SIGNING_KEY_FILE_ENV
from airflow_provider_hvd.utils.pyspark_location import pyspark_dir

log = logging.getLogger(__name__)

DEPLOY_MODES = ("client", "cluster")
# The key file's name in a YARN container's working directory.
YARN_KEY_NAME = "hvd-signing-key"
# Spark's per-host address settings: wrong on any other host.
HOST_BOUND_ENV = ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME", "SPARK_PUBLIC_DNS")
# What spark-submit runs for a Python application; named here for standalone cluster mode.
PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"


@dataclass
class DriverDelivery:
    """What to add to spark-submit: Spark properties, ``--files`` entries and spark-submit's environment."""

    conf: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    submit_env: dict[str, str] = field(default_factory=dict)
    # Standalone cluster mode: spark-submit's environment goes to the driver on the cluster.
    environment_travels: bool = False
    # What spark-submit runs: spark_app.py itself, or (standalone cluster) PythonRunner from a jar
    # with spark_app.py and its (empty) --py-files list as the first arguments.
    application: str = field(default_factory=lambda: os.path.abspath(spark_app.__file__))
    main_class: str | None = None
    leading_args: list[str] = field(default_factory=list)


def cluster_kind(master: str) -> str:
    if master.startswith("local"):
        return "local"
    if master.startswith("yarn"):
        return "yarn"
    if master.startswith("k8s://"):
        return "kubernetes"
    if master.startswith("spark://"):
        return "standalone"
    raise ValueError(f"Spark master {master!r} is not one HorovodRunnerOperator submits to: use local[...], "
                     "spark://host:port, yarn or k8s://https://<api-server>")


def check_deploy_mode(deploy_mode: str | None) -> None:
    """None (the connection's, else client) or one of DEPLOY_MODES."""
    if deploy_mode is not None and deploy_mode not in DEPLOY_MODES:
        raise ValueError(f"deploy_mode {deploy_mode!r} is not one of {', '.join(DEPLOY_MODES)}")


def check(master: str, deploy_mode: str | None, *, connection_key: bool, kubernetes_secret: str | None) -> str:
    """The deploy mode to use ("client" or "cluster"), or a ValueError saying what to change; called
    before anything is written or submitted."""
    check_deploy_mode(deploy_mode)
    mode = deploy_mode or "client"
    kind = cluster_kind(master)
    if mode == "client":
        return mode
    if kind == "local":
        raise ValueError(f"deploy_mode 'cluster' needs a cluster, and the Spark master is {master!r}: use "
                         "deploy_mode 'client' (the default) for local Spark")
    if kind == "standalone" and "," in master:
        raise ValueError(f"deploy_mode 'cluster' on a standalone master with standby masters ({master}): the "
                         "operator follows the driver through one master's REST server. Name the active master, or "
                         "use deploy_mode 'client'.")
    if kind == "kubernetes":
        if not connection_key:
            raise ValueError("deploy_mode 'cluster' on Kubernetes needs the horovod connection's signing key (its "
                             "password) and a Kubernetes Secret holding the same key: a key made for one run "
                             "cannot reach the driver pod without a command line. Set the password, create the "
                             "Secret (kubectl create secret generic hvd-signing-key --from-literal=key=<hex>) and "
                             "set the connection's kubernetes_secret field to hvd-signing-key:key.")
        if not kubernetes_secret or ":" not in kubernetes_secret:
            raise ValueError(f"deploy_mode 'cluster' on Kubernetes takes the signing key from a Kubernetes Secret: "
                             f"set the horovod connection's kubernetes_secret field to <secret name>:<key> (got "
                             f"{kubernetes_secret!r})")
    return mode


def check_storage(storage_url: str, deploy_mode: str) -> None:
    """In cluster mode the driver runs on a cluster host: a ``file://`` storage path names the
    Airflow worker's own disk, where that driver would find no payload and leave no result."""
    if deploy_mode == "cluster" and storage_url.startswith(("file://", "/", "local://")):
        raise ValueError(f"storage path {storage_url} is a local path, and in deploy_mode 'cluster' the Spark driver "
                         "runs on a cluster host that cannot read this Airflow worker's disk: use object storage "
                         "every host reaches (s3://, gs://, abfs://; the horovod connection's storage_path) or "
                         "deploy_mode 'client'")


@contextmanager
def key_file(key: bytes) -> Iterator[str]:
    """The key, hex, in a file only this user can read, inside a folder of its own; both gone on exit."""
    # Mode 0700. The driver removes the file and, by its prefix, this folder once it has read the key.
    folder = tempfile.mkdtemp(prefix=KEY_FOLDER_PREFIX)
    try:
        path = os.path.join(folder, YARN_KEY_NAME)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.hex())
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_gpus(gpus_per_executor: int | None, discovery_script: str | None) -> None:
    if discovery_script and not gpus_per_executor:
        raise ValueError("gpu_discovery_script without gpus_per_executor: say how many GPUs each executor has")
    if gpus_per_executor is not None and int(gpus_per_executor) < 1:
        raise ValueError(f"gpus_per_executor must be 1 or more, got {gpus_per_executor!r}")


def gpu_conf(master: str, gpus_per_executor: int | None, discovery_script: str | None) -> dict[str, str]:
    """Spark's GPU scheduling for one GPU per rank: each barrier task (rank) holds one GPU, each
    executor offers ``gpus_per_executor``; HorovodRunner then pins each rank to its task's GPU."""
    check_gpus(gpus_per_executor, discovery_script)
    if not gpus_per_executor:
        return {}
    conf = {"spark.executor.resource.gpu.amount": str(int(gpus_per_executor)),
            "spark.task.resource.gpu.amount": "1"}
    if discovery_script:
        conf["spark.executor.resource.gpu.discoveryScript"] = discovery_script
    if cluster_kind(master) == "kubernetes":
        # Kubernetes asks the device plugin's resource name; YARN maps "gpu" to yarn.io/gpu itself.
        conf["spark.executor.resource.gpu.vendor"] = "nvidia.com"
    return conf


def submit_environment(key: bytes, delivery: DriverDelivery) -> dict[str, str]:
    """spark-submit's environment: this process's, less every variable that carries the key (the
    ``horovod`` connection given as an ``AIRFLOW_CONN_*`` variable would otherwise reach the driver,
    local executors and ranks), plus the delivery's."""
    key_hex = key.hex()
    kept = {name: value for name, value in os.environ.items()
            if key_hex not in value.lower() and key_hex not in name.lower()}
    if delivery.environment_travels:  # to the cluster: Airflow's connections and settings stay here
        kept = {name: value for name, value in kept.items() if not name.lstrip("_").startswith("AIRFLOW")}
        bound = sorted(set(kept) & set(HOST_BOUND_ENV))
        if bound:
            log.warning("%s set here will reach the Spark driver on the cluster (Spark's standalone client sends "
                        "spark-submit's environment along), binding it to this host's address: unset them on the "
                        "Airflow worker unless that address is right for the driver too", ", ".join(bound))
    return {**kept, **delivery.submit_env}


def spark_core_jar() -> str:
    """A jar every Spark host has, as standalone cluster mode's primary resource: spark-core's, at the
    path this pyspark has it (the training image and the Airflow image install the same pyspark)."""
    found = sorted(glob.glob(os.path.join(pyspark_dir(), "jars", "spark-core_*.jar")))
    if not found:
        raise ValueError("deploy_mode 'cluster' on a standalone master needs a Spark jar as the primary resource "
                         "and this pyspark has no jars/spark-core_*.jar: set the horovod connection's "
                         "cluster_spark_jar field to a jar path every Spark host has")
    return found[0]


def plan(master: str, deploy_mode: str, *, key_path: str, driver_env: dict[str, str],
         kubernetes_secret: str | None = None, key: bytes | None = None, cluster_app: str | None = None,
         cluster_jar: str | None = None) -> DriverDelivery:
    """The delivery for a checked (``check``) master and deploy mode. Standalone cluster mode also
    takes ``key`` and, where the cluster's hosts have them elsewhere than this host, the path of
    spark_app.py (``cluster_app``) and of a Spark jar (``cluster_jar``) there."""
    kind = cluster_kind(master)
    if deploy_mode == "client":
        return DriverDelivery(submit_env={**driver_env, SIGNING_KEY_FILE_ENV: key_path})
    if kind == "standalone":
        if key is None:
            raise ValueError("standalone cluster mode hands the key itself to spark-submit's environment: pass key")
        jar = cluster_jar or spark_core_jar()
        application = jar if "://" in jar or jar.startswith("file:") else f"file:{jar}"
        return DriverDelivery(
            # The driver leaves the carrier jar out of what its executors fetch (spark_app.CARRIER_JAR_ENV).
            submit_env={**driver_env, SIGNING_KEY_ENV: key.hex(), spark_app.CARRIER_JAR_ENV: application},
            environment_travels=True,
            conf={"spark.master.rest.enabled": "false"},  # the RPC client: it forwards the environment
            application=application, main_class=PYTHON_RUNNER,
            leading_args=[cluster_app or os.path.abspath(spark_app.__file__), ""])
    if kind == "yarn":
        conf = {f"spark.yarn.appMasterEnv.{name}": value for name, value in driver_env.items()}
        conf[f"spark.yarn.appMasterEnv.{SIGNING_KEY_FILE_ENV}"] = YARN_KEY_NAME
        return DriverDelivery(conf=conf, files=[f"{key_path}#{YARN_KEY_NAME}"])
    if kind == "kubernetes":
        conf = {f"spark.kubernetes.driverEnv.{name}": value for name, value in driver_env.items()}
        conf[f"spark.kubernetes.driver.secretKeyRef.{SIGNING_KEY_ENV}"] = str(kubernetes_secret)
        return DriverDelivery(conf=conf)
    raise ValueError(f"no cluster-mode delivery for {master!r}: call check() first")
