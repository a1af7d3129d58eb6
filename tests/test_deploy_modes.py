"""Where the Spark driver runs (deploy mode) and how the signing key gets there, for every master.

No YARN or Kubernetes runs here. `airflow tasks test` runs the real operator and the real Spark
provider hook against a yarn or k8s:// connection, with a stand-in `spark-submit` first on PATH
that records its arguments, its environment and the key file it was pointed to, then fails as a
submission to an unreachable ResourceManager or API server would. What each master then does with
those arguments is Spark's, documented in docs/deploy.md.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).parent / "airflow")

# Stands in for spark-submit on a YARN client machine: records what it was given, then fails.
STAND_IN_SPARK_SUBMIT = """#!{python}
import json, os, sys
args = sys.argv[1:]
files = args[args.index("--files") + 1] if "--files" in args else None
key_file = os.environ.get("HVD_SIGNING_KEY_FILE") or (files.split("#")[0] if files else None)
record = {{"argv": args, "env": {{k: v for k, v in os.environ.items() if k.startswith(("HVD_", "PYTHON", "SPARK_SUBMIT"))}},
          "key_file": key_file, "key_file_mode": oct(os.stat(key_file).st_mode & 0o777) if key_file else None,
          "key_folder_mode": oct(os.stat(os.path.dirname(key_file)).st_mode & 0o777) if key_file else None,
          "key": open(key_file).read() if key_file else None}}
with open(os.environ["HVD_TEST_RECORD"], "w") as f:
    json.dump(record, f)
print("stand-in spark-submit: no YARN ResourceManager here", flush=True)
sys.exit(1)
"""


def submit_to_stand_in(airflow, tmp_path, spark_conn: dict, deploy_mode: str = "", horovod_extra: dict | None = None,
                       storage: str | None = None, **dag_env: str) -> tuple[dict, str, str]:
    """`airflow tasks test` of the training task; returns (what spark-submit got, the task's output, the key)."""
    from airflow_provider_hvd.runner.wire import payload

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "spark-submit"
    stand_in.write_text(STAND_IN_SPARK_SUBMIT.format(python=sys.executable))
    stand_in.chmod(0o755)
    key_hex = payload.new_secret().hex()
    record = tmp_path / "spark-submit.json"
    env = {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
           "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod", "password": key_hex,
                                                       "extra": {"storage_path": storage or f"file://{tmp_path}/storage",
                                                                 **(horovod_extra or {})}}),
           "AIRFLOW_CONN_SPARK_TEST": json.dumps(spark_conn), "HVD_TEST_SPARK_CONN": "spark_test",
           "HVD_TEST_DEPLOY_MODE": deploy_mode, "HVD_TEST_RECORD": str(record),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **dag_env}
    done = subprocess.run([AIRFLOW, "tasks", "test", "hvd_key_secrecy", "train"], env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert record.exists(), out[-4000:]
    return json.loads(record.read_text()), out, key_hex


# Cluster mode refuses local paths (the driver runs elsewhere). These tests look at the command, not at
# storage: fsspec's in-memory file system keeps the payload the operator writes off disk and network.
CLUSTER_STORAGE = "memory://hvd-test"


def conf_of(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_yarn_client_mode_hands_the_key_to_the_driver_in_a_file_named_in_spark_submits_environment(
        airflow, tmp_path):
    got, out, key_hex = submit_to_stand_in(airflow, tmp_path, {"conn_type": "spark", "host": "yarn"})
    argv = got["argv"]
    assert argv[argv.index("--master") + 1] == "yarn"
    assert "--deploy-mode" in argv and argv[argv.index("--deploy-mode") + 1] == "client"
    assert key_hex not in " ".join(argv).lower() and key_hex not in out.lower()
    # The driver (spark-submit's child in client mode) finds the key in a file only this user reads.
    assert got["key"] == key_hex and got["key_file_mode"] == "0o600" and got["key_folder_mode"] == "0o700"
    assert got["env"]["HVD_SIGNING_KEY_FILE"] == got["key_file"]
    assert "SPARK_SUBMIT_OPTS" not in got["env"]  # spark-submit's JVM is the driver: its extraJavaOptions
    assert json.loads(got["env"]["HVD_RANK_ENV_JSON"])["HVD_CHECKPOINT_DIR"].endswith("/checkpoints")
    # Not through the Spark provider's env_vars, which become --conf for YARN even in client mode.
    assert not [c for c in conf_of(argv) if c.startswith("spark.yarn.appMasterEnv.")]
    assert "stand-in spark-submit: no YARN ResourceManager here" in out
    assert not Path(got["key_file"]).exists() and not Path(got["key_file"]).parent.exists()


def test_yarn_cluster_mode_ships_the_key_file_through_yarns_distributed_cache(airflow, tmp_path):
    got, out, key_hex = submit_to_stand_in(airflow, tmp_path, {"conn_type": "spark", "host": "yarn"}, "cluster",
                                           storage=CLUSTER_STORAGE, HVD_TEST_GPUS_PER_EXECUTOR="4",
                                           HVD_TEST_GPU_DISCOVERY="/opt/spark/gpu_discovery.sh")
    argv = got["argv"]
    assert argv[argv.index("--deploy-mode") + 1] == "cluster"
    assert key_hex not in " ".join(argv).lower() and key_hex not in out.lower()
    files = argv[argv.index("--files") + 1]
    assert files == f"{got['key_file']}#hvd-signing-key" and got["key"] == key_hex
    conf = conf_of(argv)
    # The application master (the driver) finds it by that name in its container's working directory.
    assert conf["spark.yarn.appMasterEnv.HVD_SIGNING_KEY_FILE"] == "hvd-signing-key"
    assert json.loads(conf["spark.yarn.appMasterEnv.HVD_RANK_ENV_JSON"])["HVD_CHECKPOINT_DIR"]
    assert conf["spark.yarn.appMasterEnv.PYTHONUNBUFFERED"] == "1"
    assert "HVD_SIGNING_KEY_FILE" not in got["env"]
    assert not Path(got["key_file"]).parent.exists()  # removed once spark-submit ended
    # One GPU per rank, four per executor, found by the given script (YARN maps "gpu" to yarn.io/gpu).
    assert conf["spark.executor.resource.gpu.amount"] == "4" and conf["spark.task.resource.gpu.amount"] == "1"
    assert conf["spark.executor.resource.gpu.discoveryScript"] == "/opt/spark/gpu_discovery.sh"
    assert "spark.executor.resource.gpu.vendor" not in conf


def placement_for(monkeypatch, master: str, deploy_mode: str | None, **settings):
    """The placement the operator would choose for a Spark connection to ``master``."""
    from airflow_provider_hvd.hooks.spark_submit import HorovodSparkSubmitHook
    from airflow_provider_hvd.placements import ConnectionSettings, choose

    monkeypatch.setenv("AIRFLOW_CONN_HVD_PLACEMENT_TEST", json.dumps({"conn_type": "spark", "host": master}))
    hook = HorovodSparkSubmitHook(conn_id="hvd_placement_test", deploy_mode=deploy_mode)
    return choose(hook, ConnectionSettings(**{"has_key": False, **settings}))


def object_storage_try():
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_hvd.placements.try_files import TryFiles

    return TryFiles(ObjectStoragePath("s3://bucket/runs/d/r/train"), 1)


def test_the_drivers_and_executors_jvms_start_quick_unless_the_user_chose_their_own():
    """C1 only and the serial collector for the application's JVMs (placements/spark_conf.py); a collector or
    tiered-compilation choice of the user's own wins, so that the JVM never gets two collectors."""
    from airflow_provider_hvd.placements import spark_conf as jvm_options

    assert jvm_options.with_quick_start("") == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert jvm_options.with_quick_start("-XX:+UseG1GC -Dx=1") == "-XX:+UseG1GC -Dx=1 -XX:TieredStopAtLevel=1"
    assert jvm_options.with_quick_start("-XX:-TieredCompilation") == "-XX:-TieredCompilation -XX:+UseSerialGC"
    assert jvm_options.with_quick_start("-XX:+UseZGC -XX:TieredStopAtLevel=4") == "-XX:+UseZGC -XX:TieredStopAtLevel=4"


def test_the_submitted_jvm_options_keep_the_users_own(airflow, tmp_path):
    user = {"spark.executor.extraJavaOptions": "-XX:+UseParallelGC -Dteam=ml"}
    got, out, _ = submit_to_stand_in(airflow, tmp_path, {"conn_type": "spark", "host": "yarn"}, "cluster",
                                     storage=CLUSTER_STORAGE, HVD_TEST_CONF=json.dumps(user))
    conf = conf_of(got["argv"])
    assert conf["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC -Dteam=ml -XX:TieredStopAtLevel=1"
    assert conf["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    # In cluster mode spark-submit's own JVM only hands the application over: quick to start too.
    assert got["env"]["SPARK_SUBMIT_OPTS"] == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def test_the_jvm_options_of_spark_defaults_conf_are_kept_not_replaced(airflow, tmp_path):
    """spark-submit's --conf replaces a property spark-defaults.conf sets: the operator merges into its value."""
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("# the cluster's own\n"
                                                  "spark.executor.extraJavaOptions   -Dteam.defaults=1 -XX:+UseG1GC\n"
                                                  "spark.driver.extraJavaOptions=-Dteam.driver=1\n")
    got, out, _ = submit_to_stand_in(airflow, tmp_path, {"conn_type": "spark", "host": "yarn"}, "cluster",
                                     storage=CLUSTER_STORAGE, SPARK_CONF_DIR=str(conf_dir))
    conf = conf_of(got["argv"])
    assert conf["spark.executor.extraJavaOptions"] == "-Dteam.defaults=1 -XX:+UseG1GC -XX:TieredStopAtLevel=1"
    assert conf["spark.driver.extraJavaOptions"] == "-Dteam.driver=1 -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def test_kubernetes_cluster_mode_takes_the_key_from_a_kubernetes_secret_in_the_submitted_command(
        airflow, tmp_path):
    spark = {"conn_type": "spark", "host": "k8s://https://kubernetes.example:6443",
             "extra": {"namespace": "training"}}
    got, out, key_hex = submit_to_stand_in(airflow, tmp_path, spark, "cluster",
                                           {"kubernetes_secret": "hvd-signing-key:key"}, storage=CLUSTER_STORAGE,
                                           HVD_TEST_GPUS_PER_EXECUTOR="1")
    argv = got["argv"]
    assert argv[argv.index("--master") + 1] == "k8s://https://kubernetes.example:6443"
    assert argv[argv.index("--deploy-mode") + 1] == "cluster"
    assert key_hex not in " ".join(argv).lower() and key_hex not in out.lower()
    conf = conf_of(argv)
    assert conf["spark.kubernetes.driver.secretKeyRef.HVD_SIGNING_KEY"] == "hvd-signing-key:key"
    assert conf["spark.kubernetes.namespace"] == "training"
    assert json.loads(conf["spark.kubernetes.driverEnv.HVD_RANK_ENV_JSON"])["HVD_CHECKPOINT_DIR"]
    assert conf["spark.executor.resource.gpu.vendor"] == "nvidia.com"
    assert conf["spark.executor.resource.gpu.amount"] == "1" and conf["spark.task.resource.gpu.amount"] == "1"
    assert "--files" not in argv and got["key"] is None  # nothing of the key leaves the Airflow worker


def test_kubernetes_cluster_mode_refuses_without_a_connection_key_and_a_secret(monkeypatch):
    from airflow_provider_hvd.placements.client import KubernetesClientMode
    from airflow_provider_hvd.placements.kubernetes import KubernetesCluster

    master = "k8s://https://kubernetes.default.svc:443"
    cluster = placement_for(monkeypatch, master, "cluster", has_key=True, kubernetes_secret="hvd-signing-key:key")
    assert type(cluster) is KubernetesCluster
    cluster.check(object_storage_try(), deferrable=False)
    plan = cluster.deliver_key(b"k" * 32, "/nowhere", {"HVD_RANK_ENV_JSON": "{}"})
    assert plan.conf == {"spark.kubernetes.driverEnv.HVD_RANK_ENV_JSON": "{}",
                         "spark.kubernetes.driver.secretKeyRef.HVD_SIGNING_KEY": "hvd-signing-key:key"}
    assert plan.files == [] and plan.submit_env == {}
    with pytest.raises(ValueError, match="needs the horovod connection's signing key"):
        placement_for(monkeypatch, master, "cluster", kubernetes_secret="hvd-signing-key:key").check(
            object_storage_try(), deferrable=False)
    with pytest.raises(ValueError, match="set the horovod connection's kubernetes_secret field"):
        placement_for(monkeypatch, master, "cluster", has_key=True).check(object_storage_try(), deferrable=False)
    # Client mode on Kubernetes: the driver is spark-submit's child, so the key file works as for YARN.
    client = placement_for(monkeypatch, master, None)
    assert type(client) is KubernetesClientMode
    client.check(object_storage_try(), deferrable=False)
    planned = client.deliver_key(b"k" * 32, "/k", {})
    assert planned.submit_env == {"HVD_SIGNING_KEY_FILE": "/k"} and planned.conf == {}


@pytest.mark.parametrize("master, deploy_mode, message", [
    ("spark://10.0.0.5:7077,10.0.0.6:7077", "cluster", "standby masters"),
    ("local[*]", "cluster", "needs a cluster"),
    ("mesos://10.0.0.5:5050", None, "is not one HorovodRunnerOperator submits to"),
    ("yarn", "clustre", "deploy_mode 'clustre' is not one of client, cluster"),
])
def test_a_deploy_mode_the_key_cannot_reach_is_refused_saying_what_to_use(master, deploy_mode, message, monkeypatch):
    with pytest.raises(ValueError, match=message):
        # Refused before any address is reached: the standby masters' check comes before the REST server's.
        placement_for(monkeypatch, master, deploy_mode, has_key=True).check(object_storage_try(), deferrable=False)


def test_an_unknown_deploy_mode_or_half_a_gpu_setting_fails_when_the_dag_is_parsed():
    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator

    with pytest.raises(ValueError, match="deploy_mode 'yarn' is not one of client, cluster"):
        HorovodRunnerOperator(task_id="t", python_callable=print, np=2, deploy_mode="yarn")
    with pytest.raises(ValueError, match="gpu_discovery_script without gpus_per_executor"):
        HorovodRunnerOperator(task_id="t", python_callable=print, np=2, gpu_discovery_script="/gpus.sh")
    with pytest.raises(ValueError, match="gpus_per_executor must be 1 or more"):
        HorovodRunnerOperator(task_id="t", python_callable=print, np=2, gpus_per_executor=-2)


def refused_cluster_submission(airflow, storage: Path, master: str) -> str:
    """`airflow tasks test` of the training task in cluster mode, storage on this disk; its output."""
    env = {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
           "AIRFLOW_CONN_SPARK_TEST": json.dumps({"conn_type": "spark", "host": master}),
           "HVD_TEST_SPARK_CONN": "spark_test", "HVD_TEST_DEPLOY_MODE": "cluster",
           "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod",
                                                       "extra": {"storage_path": f"file://{storage}"}})}
    done = subprocess.run([AIRFLOW, "tasks", "test", "hvd_key_secrecy", "train"], env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "new_state=failed" in out, out[-3000:]
    assert not storage.exists(), out[-3000:]  # no payload written, nothing submitted
    return out


def test_standalone_cluster_mode_without_the_masters_rest_server_fails_before_anything_is_written(airflow, tmp_path):
    """The driver could be started but neither followed nor killed: refused, saying how to turn it on."""
    from spark_cluster import free_port

    bin_dir = tmp_path / "bin"  # a spark-submit that records being called: it must not be
    bin_dir.mkdir()
    (bin_dir / "spark-submit").write_text(f"#!/bin/sh\ntouch {tmp_path}/submitted\nexit 1\n")
    (bin_dir / "spark-submit").chmod(0o755)
    rest_port = free_port()  # nothing listens there
    env = {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
           "AIRFLOW_CONN_SPARK_TEST": json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:7077",
                                                  "extra": {"rest-port": str(rest_port)}}),
           "HVD_TEST_SPARK_CONN": "spark_test", "HVD_TEST_DEPLOY_MODE": "cluster",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod",
                                                       "extra": {"storage_path": CLUSTER_STORAGE}})}
    done = subprocess.run([AIRFLOW, "tasks", "test", "hvd_key_secrecy", "train"], env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "new_state=failed" in out, out[-3000:]
    assert f"REST server at http://127.0.0.1:{rest_port} does not answer" in out, out[-3000:]
    assert "spark.master.rest.enabled=true" in out and "rest-port" in out
    assert "Payload (" not in out and not (tmp_path / "submitted").exists()


def test_cluster_mode_refuses_storage_on_the_airflow_workers_own_disk(airflow, tmp_path):
    """The driver on a cluster host would find no payload there: refused before anything is written."""
    storage = tmp_path / "storage"
    out = refused_cluster_submission(airflow, storage, "yarn")
    assert f"storage path file://{storage}" in out and "cannot read this Airflow worker's disk" in out, out[-3000:]


def test_standalone_cluster_mode_submits_pythonrunner_and_keeps_airflows_environment_home(monkeypatch):
    """spark-submit's environment travels to the driver on the cluster: the key and the driver's
    settings go, Airflow's connections and settings stay; the RPC client (which forwards it) is forced."""
    from airflow_provider_hvd.placements.standalone import StandaloneCluster
    from airflow_provider_hvd.runner import spark_app

    key = bytes(range(32))
    placement = placement_for(monkeypatch, "spark://m:7077", "cluster")
    assert type(placement) is StandaloneCluster
    monkeypatch.setenv("AIRFLOW_CONN_POSTGRES_DEFAULT", "postgresql://u:secret@db/airflow")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "d")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    delivery = placement.deliver_key(key, "/unused", {"HVD_RANK_ENV_JSON": "{}"})
    assert delivery.java_class == "org.apache.spark.deploy.PythonRunner"
    assert delivery.application.startswith("file:/") and "/jars/spark-core_" in delivery.application
    assert delivery.leading_args == [os.path.abspath(spark_app.__file__), ""]
    assert delivery.conf == {"spark.master.rest.enabled": "false"}
    env = placement.submit_env(key, delivery)
    assert env["HVD_SIGNING_KEY"] == key.hex() and env["HVD_RANK_ENV_JSON"] == "{}"
    assert env["AWS_REGION"] == "eu-west-1"
    assert not [name for name in env if "AIRFLOW" in name]
    # Paths of the cluster's own hosts, where they differ from this one.
    elsewhere = placement_for(monkeypatch, "spark://m:7077", "cluster", cluster_spark_app="/opt/hvd/spark_app.py",
                              cluster_spark_jar="/opt/spark/jars/x.jar").deliver_key(key, "/unused", {})
    assert elsewhere.application == "file:/opt/spark/jars/x.jar"
    assert elsewhere.leading_args == ["/opt/hvd/spark_app.py", ""]
