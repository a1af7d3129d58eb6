"""The production shape on one machine (localcluster/, `make cluster`): Spark master and workers,
PostgreSQL, the S3 server and Airflow each a host of its own (network and mount namespaces, a
private bridge), driven as a user drives a deployment: through Airflow's REST API.

Needs root (namespaces); CI runs as root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from airflow_services import RestClient, free_port

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network and mount namespaces need root")


def localcluster(state: Path, *args: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, "-m", "localcluster", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HVD_CLUSTER_STATE": str(state)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done.stdout


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from localcluster import network

    state = tmp_path_factory.mktemp("cluster")
    port = free_port()
    t0 = time.monotonic()
    try:
        out = localcluster(state, "up", "--api-port", str(port))
        started = time.monotonic() - t0
        print(out, f"cluster up in {started:.0f} s", flush=True)
        client = RestClient(f"http://127.0.0.1:{port}")
        yield {"state": state, "api": client, "api_port": port, "started_s": started}
    finally:
        down = localcluster(state, "down")
        assert "had to SIGKILL" not in down, down
        # Nothing left: no namespace, no process of any host, no port, no mount.
        assert network.namespaces() == []
        assert not [p for p in psutil.process_iter(["cmdline"]) if str(state) in " ".join(p.info["cmdline"] or [])]
        assert "hvd-host" not in Path("/proc/self/mountinfo").read_text()


def host_log(state: Path, host: str, service: str) -> str:
    return (state / "hosts" / host / "logs" / f"{service}.log").read_text(errors="replace")


def airflow_logs(state: Path) -> Path:
    return state / "hosts" / "airflow" / "airflow" / "logs"


def on_host(state: Path, host: str, code: str) -> str:
    """Python ``code`` run on ``host`` (as `docker compose exec` would); its stdout."""
    done = subprocess.run([sys.executable, "-m", "localcluster", "exec", host, sys.executable, "-c", code],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HVD_CLUSTER_STATE": str(state)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


REACH = """
import socket
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return type(exc).__name__
print(*[reach(h, p) for h, p in {targets}])
"""


def test_hosts_reach_each_other_over_the_data_network_only(deployment):
    """Each host reaches the others by name over the bridge; no host reaches this machine (its own
    interfaces, its loopback services) or another host's management address."""
    state = deployment["state"]
    targets = [("spark-master", 7077), ("s3", 9000), ("postgres", 5432), ("airflow", 8080),
               ("10.88.0.2", 7077),    # the master's management address
               ("192.0.2.2", 22),      # this machine's real interface
               ("127.0.0.1", deployment["api_port"])]  # this machine's loopback: the forwarder
    reached = on_host(state, "spark-worker-1", REACH.format(targets=targets)).split()
    assert reached[:4] == ["open"] * 4, list(zip(targets, reached))
    assert all(r != "open" for r in reached[4:]), list(zip(targets, reached))
    # A host's loopback is its own: on the Airflow host, 127.0.0.1 has the api-server (it listens on
    # every address of its host), not this machine's forwarder.
    assert on_host(state, "airflow", REACH.format(
        targets=[("127.0.0.1", 8080), ("127.0.0.1", deployment["api_port"])])).split() == ["open", "refused"]


def test_mnist_trains_on_the_cluster_driven_through_the_rest_api(deployment):
    """hvd_mnist_pytorch as a user runs it: triggered through the REST API, its storage on s3://, the
    Spark driver on the Airflow host, the ranks on the two workers."""
    api, state = deployment["api"], deployment["state"]
    t0 = time.monotonic()
    api.api("PATCH", "/dags/hvd_mnist_pytorch", {"is_paused": False})
    run_id = api.api("POST", "/dags/hvd_mnist_pytorch/dagRuns", {"logical_date": None})["dag_run_id"]
    runs = api.wait_for_runs("hvd_mnist_pytorch", 1, timeout=540)
    print(f"hvd_mnist_pytorch on the cluster: {time.monotonic() - t0:.0f} s", flush=True)
    tasks = f"/dags/hvd_mnist_pytorch/dagRuns/{run_id}/taskInstances"
    states = {ti["task_id"]: ti["state"] for ti in api.api("GET", tasks)["task_instances"]}
    train_log = airflow_logs(state) / "dag_id=hvd_mnist_pytorch" / f"run_id={run_id}" / "task_id=train"
    assert runs[0]["state"] == "success", (states, (train_log / "attempt=1.log").read_text()[-5000:])
    assert set(states.values()) == {"success"}, states

    metrics = api.api("GET", f"{tasks}/evaluate/xcomEntries/return_value")["value"]
    metrics = metrics if isinstance(metrics, dict) else json.loads(metrics)
    assert metrics["test_accuracy"] >= 0.9, metrics
    trained = api.api("GET", f"{tasks}/train/xcomEntries/return_value")["value"]
    trained = trained if isinstance(trained, dict) else json.loads(trained)
    assert trained["epoch"] == metrics["epoch"] and trained["train_accuracy"] > 0.5, trained  # rank 0's metrics
    timeline = api.api("GET", f"{tasks}/train/xcomEntries/timeline")["value"]
    checkpoints = api.api("GET", f"{tasks}/train/xcomEntries/checkpoint_dir")["value"]
    assert timeline.startswith("s3://hvd-artifacts/") and checkpoints.startswith("s3://hvd-artifacts/")
    # Objects in the bucket, as another host of the cluster sees them (this machine reaches none).
    listing = json.loads(on_host(state, "airflow", f"""
import json, s3fs
fs = s3fs.S3FileSystem()
print(json.dumps({{"timeline": fs.size({timeline!r}), "checkpoints": fs.ls({checkpoints!r})}}))"""))
    assert listing["timeline"] > 0 and any(p.endswith(".pt") for p in listing["checkpoints"]), listing
    # The ranks ran on the workers, over the data network, and their lines reached the task log.
    log = (train_log / "attempt=1.log").read_text()
    assert any("all 2 barrier tasks joined" in line and hosts in line for line in log.splitlines()
               for hosts in ("on 10.77.0.3, 10.77.0.4", "on 10.77.0.4, 10.77.0.3")), log[-5000:]
    assert "[0]<log>: epoch 1:" in log and "[1]<log>: epoch 1:" in log


def test_a_users_own_dag_folder_is_served_beside_the_platforms(deployment):
    """dags/ and localcluster/user_dags/ are two DAG bundles of one Airflow, as a team's repository
    would be mounted beside the platform's DAGs."""
    dags = {d["dag_id"]: d for d in deployment["api"].api("GET", "/dags?limit=100")["dags"]}
    assert {"hvd_mnist_pytorch", "team_smoke"} <= set(dags), sorted(dags)
    assert dags["team_smoke"]["bundle_name"] == "user-dags" and dags["hvd_mnist_pytorch"]["bundle_name"] == \
        "dags-folder", {k: dags[k]["bundle_name"] for k in ("team_smoke", "hvd_mnist_pytorch")}
