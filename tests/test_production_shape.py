"""The production shape on one machine (localcluster/, `make cluster`): Spark master and workers,
PostgreSQL, the S3 server and Airflow each a host of its own (network and mount namespaces, a
private bridge), driven as a user drives a deployment: through Airflow's REST API.

Needs root (namespaces); CI runs as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import psutil
import pytest
from airflow_services import RestClient, free_port
from conftest import RANK_MARKER, RSH_AGENT_MARKER, run_processes
from waiting import wait_for
from test_airflow_layer import SPARK_LOG_LINE

from localcluster.services import Cluster
from localcluster.hosts import SPARK_UI_PORT

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network and mount namespaces need root")


# What `localcluster down` had to kill when Airflow 3.3.2's scheduler hangs in LocalExecutor.end(): the
# scheduler, its log server and LocalExecutor workers, each idle (seen in 2 of about 8 clean-clone runs).
AIRFLOW_SCHEDULER_PROCESSES = re.compile(r"had to SIGKILL hvd-airflow: (\S*/)?(python \S*/)?airflow (scheduler|serve-logs"
                                         r"|worker -- LocalExecutor: <idle>)\s*$")


def airflow_local_executor_hang(down: str) -> bool:
    """Whether `down` killed only the Airflow scheduler's own processes, and their stacks (written on
    SIGABRT) show the scheduler joining a LocalExecutor worker that waits, idle, for its next workload:
    Airflow's bug (end() puts one poison pill per live worker and joins each without a timeout; one
    worker never gets its pill), not ours. Anything else `down` had to kill is a defect here."""
    killed = [line for line in down.splitlines() if line.startswith("had to SIGKILL")]
    return (bool(killed) and all(AIRFLOW_SCHEDULER_PROCESSES.match(line) for line in killed)
            and any("<idle>" in line for line in killed)
            and re.search(r"local_executor\.py\", line \d+ in end\n", down) is not None
            and re.search(r"queues\.py\", line \d+ in get\n\s*File \"[^\"]*local_executor\.py\", line \d+ in "
                          r"_run_worker", down) is not None)


# `localcluster down`'s output when it met that hang (a clean-clone run of 2026-12-05, frames shortened).
HUNG_SCHEDULER_DOWN = """had to SIGKILL hvd-airflow: /ci/.venv/bin/python /ci/.venv/bin/airflow scheduler
had to SIGKILL hvd-airflow: airflow serve-logs
had to SIGKILL hvd-airflow: airflow worker -- LocalExecutor: <idle>
stacks written on SIGABRT, /state/hosts/airflow/logs/scheduler.log:
Current thread 0x00007f1e4ba75b80 (most recent call first):
  File "/py/lib/python3.11/multiprocessing/connection.py", line 395 in _recv
  File "/py/lib/python3.11/multiprocessing/queues.py", line 365 in get
  File "/ci/.venv/lib/python3.11/site-packages/airflow/executors/local_executor.py", line 81 in _run_worker
stacks written on SIGABRT, /state/hosts/airflow/logs/scheduler.log:
Current thread 0x00007f1e4ba75b80 (most recent call first):
  File "/py/lib/python3.11/multiprocessing/process.py", line 149 in join
  File "/ci/.venv/lib/python3.11/site-packages/airflow/executors/local_executor.py", line 268 in end
cluster down: no process, namespace or mount left
"""


def test_only_airflows_own_shutdown_hang_is_let_through_and_anything_else_killed_fails():
    assert airflow_local_executor_hang(HUNG_SCHEDULER_DOWN)
    rank_too = HUNG_SCHEDULER_DOWN.replace("had to SIGKILL hvd-airflow: airflow serve-logs",
                                           "had to SIGKILL hvd-spark-worker-1: python -m airflow_provider_hvd rank")
    busy = HUNG_SCHEDULER_DOWN.replace("LocalExecutor: <idle>", "LocalExecutor: train")
    no_evidence = "\n".join(line for line in HUNG_SCHEDULER_DOWN.splitlines() if line.startswith("had to"))
    elsewhere = HUNG_SCHEDULER_DOWN.replace("in end\n", "in heartbeat\n")
    assert not any(map(airflow_local_executor_hang, (rank_too, busy, no_evidence, elsewhere, "cluster down: ok")))


def localcluster(state: Path, *args: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, "-m", "localcluster", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HVD_CLUSTER_STATE": str(state)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done.stdout


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from localcluster import namespaces

    state = tmp_path_factory.mktemp("cluster")
    port = free_port()
    t0 = time.monotonic()
    try:
        out = localcluster(state, "up", "--api-port", str(port))
        started = time.monotonic() - t0
        print(out, f"cluster up in {started:.0f} s", flush=True)
        login = Cluster(state).login()
        client = RestClient(f"http://127.0.0.1:{port}", login)
        # Up is not ready: the dag-processor parses the DAG files after it starts, and a DAG is not
        # in the API until then (a test that triggered at once failed with 404 on a loaded machine).
        wait_for_dags(client, {"hvd_mnist_pytorch", "hvd_scheduled_retraining", "hvd_digits_ingest", "team_smoke"})
        print(f"DAGs parsed {time.monotonic() - t0:.0f} s after up began", flush=True)
        yield {"state": state, "api": client, "api_port": port, "started_s": started, "login": login}
    finally:
        down = localcluster(state, "down")
        if airflow_local_executor_hang(down):
            warnings.warn("Airflow's scheduler hung at shutdown in LocalExecutor.end(), joining an idle worker "
                          "that never got its poison pill (apache/airflow#45683; docs/deploy.md): `localcluster "
                          "down` killed it, as a service manager's stop timeout would. Its evidence:\n" + down)
        else:
            assert "had to SIGKILL" not in down, down
        # Nothing left: no namespace, no process of any host, no port, no mount.
        assert namespaces.namespaces() == []
        assert not [p for p in psutil.process_iter(["cmdline"]) if str(state) in " ".join(p.info["cmdline"] or [])]
        assert "hvd-host" not in Path("/proc/self/mountinfo").read_text()


def wait_for_dags(api: RestClient, dag_ids: set[str], timeout: float = 180) -> None:
    def unlisted():
        return sorted(dag_ids - {d["dag_id"] for d in api.api("GET", "/dags?limit=100")["dags"]})

    wait_for(f"the dag-processor to parse {sorted(dag_ids)}", lambda: not unlisted(), timeout, interval=1,
             seen=lambda: f"not in the API yet: {unlisted()}")


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


def trigger(api: RestClient, dag_id: str, conf: dict | None = None) -> str:
    api.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})
    return api.api("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})["dag_run_id"]


def task_states(api: RestClient, dag_id: str, run_id: str) -> dict[str, str]:
    tis = api.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in tis}


def follow_run(api: RestClient, dag_id: str, run_id: str, timeout: float) -> tuple[str, list[dict[str, str]]]:
    """Polls the run until it ends; its final state and every change of its tasks' states seen meanwhile."""
    seen: list[dict[str, str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = task_states(api, dag_id, run_id)
        if not seen or states != seen[-1]:
            seen.append(states)
        state = api.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
        if state in ("success", "failed"):
            return state, seen
        time.sleep(0.5)
    raise AssertionError(f"{dag_id} {run_id} did not end within {timeout:.0f} s: {seen[-1:]}")


def log_events(path: Path) -> list[str]:
    """A task log file as Airflow's UI shows it: the events, in order."""
    return [json.loads(line).get("event", "") for line in path.read_text().splitlines() if line.startswith("{")]


def xcom(api: RestClient, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
    value = api.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}")["value"]
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


def test_mnist_trains_on_the_cluster_driven_through_the_rest_api(deployment):
    """hvd_mnist_pytorch as a user runs it: triggered through the REST API, its storage on s3://, the
    Spark driver on the Airflow host, the ranks on the two workers, the artifact sensor deferred to the
    triggerer beside training and ended there."""
    api, state = deployment["api"], deployment["state"]
    t0 = time.monotonic()
    run_id = trigger(api, "hvd_mnist_pytorch")
    final, seen = follow_run(api, "hvd_mnist_pytorch", run_id, timeout=540)
    print(f"hvd_mnist_pytorch on the cluster: {time.monotonic() - t0:.0f} s", flush=True)
    logs = airflow_logs(state) / "dag_id=hvd_mnist_pytorch" / f"run_id={run_id}"
    train_log = logs / "task_id=train" / "attempt=1.log"
    assert final == "success", (seen[-1], train_log.read_text()[-5000:])
    assert set(seen[-1].values()) == {"success"}, seen[-1]

    metrics = xcom(api, "hvd_mnist_pytorch", run_id, "evaluate")
    assert metrics["test_accuracy"] >= 0.9, metrics
    trained = xcom(api, "hvd_mnist_pytorch", run_id, "train")
    assert trained["epoch"] == metrics["epoch"] and trained["train_accuracy"] > 0.5, trained  # rank 0's metrics
    timeline = xcom(api, "hvd_mnist_pytorch", run_id, "train", "timeline")
    checkpoints = xcom(api, "hvd_mnist_pytorch", run_id, "train", "checkpoint_dir")
    assert timeline.startswith("s3://hvd-artifacts/") and checkpoints.startswith("s3://hvd-artifacts/")
    # Objects in the bucket, as another host of the cluster sees them (this machine reaches none).
    listing = json.loads(on_host(state, "airflow", f"""
import json, s3fs
fs = s3fs.S3FileSystem()
print(json.dumps({{"timeline": fs.size({timeline!r}), "checkpoints": fs.ls({checkpoints!r})}}))"""))
    assert listing["timeline"] > 0 and any(p.endswith(".pt") for p in listing["checkpoints"]), listing
    # The ranks ran on the workers, over the data network, and their lines reached the task log.
    log = train_log.read_text()
    assert any("all 2 barrier tasks joined" in line and hosts in line for line in log.splitlines()
               for hosts in ("on 10.77.0.3, 10.77.0.4", "on 10.77.0.4, 10.77.0.3")), log[-5000:]
    assert "[0]<log>: epoch 1:" in log and "[1]<log>: epoch 1:" in log

    # The sensor waited beside training in the triggerer, not in a worker slot ...
    assert any(s.get("wait_for_artifacts") == "deferred" and s.get("train") == "running" for s in seen), seen
    # ... and the triggerer ended it: its worker part ran once, up to the deferral, and never resumed;
    # the trigger's own log (the triggerer's, beside the task's) says it ended the task there.
    sensor_log = log_events(logs / "task_id=wait_for_artifacts" / "attempt=1.log")
    assert sensor_log.count("::group::Pre Execute") == 1 and "Pausing task as DEFERRED. " in sensor_log, sensor_log
    trigger_logs = list((logs / "task_id=wait_for_artifacts").glob("attempt=1.log.trigger.*.log"))
    assert len(trigger_logs) == 1, trigger_logs
    assert any("the task ends here, in the triggerer" in e for e in log_events(trigger_logs[0])), \
        log_events(trigger_logs[0])
    # What it found is its XCom, pushed by the triggerer: this run's timeline and final checkpoint.
    found = xcom(api, "hvd_mnist_pytorch", run_id, "wait_for_artifacts")
    assert found["timeline"] == timeline and found["checkpoint"].startswith(f"{checkpoints}/ckpt-"), found


# Debian's Chromium, headless, as root, and quiet: no call home (this machine reaches no other address).
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-quic", "--window-size=1600,1000"]


@contextlib.contextmanager
def chromium(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        yield browser
    finally:
        browser.quit()


def test_the_ui_shows_the_training_tasks_rank_logs_to_a_user_who_logs_in(deployment, tmp_path):
    """A user opens the training task's page in Airflow's UI, logs in, and reads the ranks' lines in
    its log. HVD_UI_SCREENSHOT=docs/airflow-ui-train-log.png keeps the screenshot for the docs."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    api, port = deployment["api"], deployment["api_port"]
    base = f"http://127.0.0.1:{port}"
    runs = api.api("GET", "/dags/hvd_mnist_pytorch/dagRuns?state=success&order_by=-run_after&limit=1")["dag_runs"]
    assert runs, "no successful hvd_mnist_pytorch run to look at (test_mnist_trains_on_the_cluster... failed?)"
    page = f"{base}/dags/hvd_mnist_pytorch/runs/{runs[0]['dag_run_id']}/tasks/train"
    # Nobody gets in without a password: no token for the asking, no API call without one.
    for url in (f"{base}/auth/token", f"{base}/api/v2/dags"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code in (401, 403), (url, refused.value.code)
    user, password = deployment["login"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        RestClient(base, (user, password + "x")).token()
    assert refused.value.code == 401, refused.value.code
    with chromium(tmp_path / "profile") as browser:
        browser.get(page)
        WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.NAME, "username"))  # the login form first
        browser.find_element(By.NAME, "username").send_keys(user)
        browser.find_element(By.NAME, "password").send_keys(password)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        # Back on the task's page, its log (the UI shows it scrolled to the end, and renders only the
        # lines in view): the ranks' own lines, as the task log has them.
        ranks = [re.compile(rf"\[{rank}\]<log>: epoch \d+: loss") for rank in (0, 1)]

        def rank_lines_shown(b) -> bool:
            text = b.find_element(By.TAG_NAME, "body").text
            return all(r.search(text) for r in ranks) and "rank 0 returned its result" in text

        # The submit navigates: a poll can find the login page's <body> just before the task page
        # replaces it, and reading its text then raises StaleElementReferenceException (it failed a
        # clean-clone run so); a stale element only means "look again".
        WebDriverWait(browser, 90, ignored_exceptions=(StaleElementReferenceException,)).until(rank_lines_shown)
        assert browser.current_url.startswith(page), browser.current_url
        shot = tmp_path / "train-log.png"
        assert browser.save_screenshot(str(shot)), shot
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("HVD_UI_SCREENSHOT"):
        shutil.copyfile(shot, REPO / os.environ["HVD_UI_SCREENSHOT"])


def processes_of_runs(state: Path) -> list[str]:
    """Every process of a training on any host of the cluster: ranks, mpirun/orted and their rsh agents,
    the Spark driver (spark-submit's JVM and spark_app.py) and executors; each named with the host it
    runs on. Only the cluster's hosts (network namespaces) count: this test process has a Spark JVM of
    its own when an earlier test module started a SparkSession in it (pyspark keeps its gateway)."""
    holders = json.loads((state / "cluster.json").read_text())["holders"]
    host_of = {}
    for host, pid in holders.items():
        try:
            host_of[os.readlink(f"/proc/{pid}/ns/net")] = host
        except OSError:
            pass
    markers = (RANK_MARKER, RSH_AGENT_MARKER, "spark_app.py", "org.apache.spark.deploy.SparkSubmit",
               "CoarseGrainedExecutorBackend", "org.apache.spark.deploy.worker.DriverWrapper")
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] in ("orted", "mpirun") or any(m in cmdline for m in markers):
            try:
                host = host_of.get(os.readlink(f"/proc/{proc.pid}/ns/net"))
            except OSError:
                continue  # gone meanwhile
            if host is not None:
                found.append(f"{host}: {proc.pid} {cmdline[:150]}")
    return found


def test_marking_the_training_failed_mid_run_ends_it_on_every_host_within_10_s(deployment):
    """A user marks the running training task failed in the UI (here through the REST API): every
    process of that training, on the Airflow host and both workers, is gone within 10 s, and the
    Spark master runs no application any more."""
    api, state = deployment["api"], deployment["state"]
    run_id = trigger(api, "hvd_mnist_pytorch", {"epochs": 2000})
    train_log = wait_until_training(api, state, run_id)
    running = processes_of_runs(state)
    # Mid-training: a rank on each worker, the driver on the Airflow host.
    for host in ("spark-worker-1", "spark-worker-2"):
        assert any(line.startswith(f"{host}: ") and RANK_MARKER in line for line in running), running
    assert any(line.startswith("airflow: ") and "spark_app.py" in line for line in running), running
    # Each Spark host has a management interface (eth0) that no other host reaches: Open MPI was told
    # to use the data network's (eth1), for its daemons and for the ranks' traffic.
    mpirun = [p.info["cmdline"] for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "mpirun"]
    assert len(mpirun) == 1, mpirun
    options = " ".join(mpirun[0])
    assert "btl_tcp_if_include eth1" in options and "oob_tcp_if_include eth1" in options, options
    # The task's links are in the UI while it runs, not only once it ends.
    links = {key: xcom(api, "hvd_mnist_pytorch", run_id, "train", key)
             for key in ("_link_SparkUILink", "_link_CheckpointsLink", "_link_HorovodTimelineLink")}
    assert links["_link_SparkUILink"].startswith("http://airflow:"), links
    assert links["_link_CheckpointsLink"].startswith("s3://hvd-artifacts/"), links

    marked = time.monotonic()
    api.api("PATCH", f"/dags/hvd_mnist_pytorch/dagRuns/{run_id}/taskInstances/train", {"new_state": "failed"})
    while processes_of_runs(state) and time.monotonic() - marked < 10:
        time.sleep(0.2)
    left = processes_of_runs(state)
    assert not left, f"{time.monotonic() - marked:.1f} s after train was marked failed: {left}"
    print(f"every process of the training gone {time.monotonic() - marked:.1f} s after the mark", flush=True)
    apps = json.loads(on_host(state, "spark-master", f"""
import urllib.request
print(urllib.request.urlopen("http://spark-master:{SPARK_UI_PORT}/json/", timeout=5).read().decode())"""))
    assert apps["activeapps"] == [], apps["activeapps"]
    # The sensor beside it would wait for artifacts that never come: the user ends the run too.
    # evaluate turns upstream_failed at the scheduler's next look at the run, not with the PATCH: read
    # at once (0.3 s after the mark, once the processes went that fast) it was still None.
    states = wait_for("the scheduler to mark evaluate after train failed",
                      lambda: (s := task_states(api, "hvd_mnist_pytorch", run_id))["evaluate"] is not None and s,
                      30, seen=lambda: task_states(api, "hvd_mnist_pytorch", run_id))
    assert states["train"] == "failed" and states["evaluate"] == "upstream_failed", states
    api.api("PATCH", f"/dags/hvd_mnist_pytorch/dagRuns/{run_id}", {"state": "failed"})
    # The task's log says why it ended (written once its supervisor has seen the task process go).
    wait_for("the task's log to say 'Task killed!'", lambda: "Task killed!" in log_events(train_log), 30,
             seen=lambda: log_events(train_log)[-20:])
    assert "Sending kill signal to spark-submit" in log_events(train_log)  # on_kill ran


def on_host_run(state: Path, host: str, *command: str) -> None:
    done = subprocess.run([sys.executable, "-m", "localcluster", "exec", host, *command], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "HVD_CLUSTER_STATE": str(state)})
    assert done.returncode == 0, done.stdout + done.stderr


def wait_until_training(api: RestClient, state: Path, run_id: str, epoch: int = 3) -> Path:
    """The train task's log file, once both ranks logged ``epoch``."""
    train_log = airflow_logs(state) / "dag_id=hvd_mnist_pytorch" / f"run_id={run_id}" / "task_id=train" / \
        "attempt=1.log"
    wait_for(f"rank 1's epoch {epoch} line in the train task's log",
             lambda: train_log.exists() and f"[1]<log>: epoch {epoch}:" in train_log.read_text(), 300,
             interval=0.3, seen=lambda: task_states(api, "hvd_mnist_pytorch", run_id))
    return train_log


def wait_until_train_ends(api: RestClient, run_id: str, timeout: float) -> None:
    wait_for(f"the train task of {run_id} to end",
             lambda: task_states(api, "hvd_mnist_pytorch", run_id)["train"] in ("failed", "success"), timeout,
             interval=0.25, seen=lambda: task_states(api, "hvd_mnist_pytorch", run_id))


@pytest.mark.faults
def test_a_worker_host_cut_from_the_network_fails_the_run_within_10_s_naming_it(deployment, fault):
    record = fault("a worker host's network cut mid-training (make cluster: `ip link set eth1 down` on "
                   "spark-worker-2, client mode)",
                   "the training task fails within 10 s naming spark-worker-2, not restarted; the ranks end "
                   "while the host is still cut off; once the link is back nothing of the run is left")
    api, state = deployment["api"], deployment["state"]
    run_id = trigger(api, "hvd_mnist_pytorch", {"epochs": 2000})
    train_log = wait_until_training(api, state, run_id)
    on_host_run(state, "spark-worker-2", "ip", "link", "set", "eth1", "down")
    record.start()
    try:
        wait_until_train_ends(api, run_id, timeout=60)
        failed_after = record.failed_after()
        # Still cut off, the host's ranks end by themselves: their task hears nothing from the driver.
        deadline = time.monotonic() + 20
        while run_processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        cut_off_left = [" ".join(p.cmdline()) for p in run_processes()]
    finally:
        on_host_run(state, "spark-worker-2", "ip", "link", "set", "eth1", "up")
    events = log_events(train_log)
    assert task_states(api, "hvd_mnist_pytorch", run_id)["train"] == "failed", events[-30:]
    assert failed_after <= 10, f"train failed {failed_after:.1f} s after the cut: {events[-30:]}"
    named = [e for e in events if "host spark-worker-2 (10.77.0.4)" in e and "stopped answering" in e]
    assert named, events[-30:]
    assert not cut_off_left, cut_off_left
    # The sensor beside it waits for artifacts that never come: end the run, once the scheduler has
    # marked evaluate (marking it meanwhile can deadlock in PostgreSQL against the scheduler's update).
    wait_for("the scheduler to mark evaluate upstream_failed",
             lambda: task_states(api, "hvd_mnist_pytorch", run_id)["evaluate"] == "upstream_failed", 30,
             seen=lambda: task_states(api, "hvd_mnist_pytorch", run_id))
    api.api("PATCH", f"/dags/hvd_mnist_pytorch/dagRuns/{run_id}", {"state": "failed"})
    # With the link back, Spark's executor there finds its driver gone, and ends.
    wait_for("every process of the run to end on every host", lambda: not processes_of_runs(state), 90, interval=1,
             seen=lambda: processes_of_runs(state))
    record.observe(f"train failed {failed_after:.1f} s after the cut: {named[0][:160]}")
    # Both workers serve again (for what comes next, as for a user's next run).
    Cluster(state).wait_workers(2, timeout=120)


@pytest.mark.faults
def test_the_triggerer_restarted_while_the_sensor_is_deferred_still_completes_it(deployment, fault):
    record = fault("Airflow's triggerer killed (SIGKILL) and started again while hvd_mnist_pytorch's sensor is "
                   "deferred (make cluster)",
                   "the new triggerer takes the trigger over: the sensor, ended there, and the run succeed")
    api, state = deployment["api"], deployment["state"]
    run_id = trigger(api, "hvd_mnist_pytorch")
    sensor_dir = airflow_logs(state) / "dag_id=hvd_mnist_pytorch" / f"run_id={run_id}" / "task_id=wait_for_artifacts"

    def trigger_log() -> list[str]:
        return [e for path in sensor_dir.glob("attempt=1.log.trigger.*.log") for e in log_events(path)]

    # Deferred, and its trigger running in the triggerer (which logged that it started it).
    wait_for("the triggerer to log that it started the sensor's trigger",
             lambda: any(e.endswith(" starting") for e in trigger_log()), 180,
             seen=lambda: task_states(api, "hvd_mnist_pytorch", run_id))
    assert task_states(api, "hvd_mnist_pytorch", run_id)["wait_for_artifacts"] == "deferred"
    done = subprocess.run([sys.executable, "-m", "localcluster", "restart", "airflow", "triggerer", "--crash"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HVD_CLUSTER_STATE": str(state)})
    assert done.returncode == 0, done.stdout + done.stderr
    record.start()
    final, seen = follow_run(api, "hvd_mnist_pytorch", run_id, timeout=300)
    assert final == "success", seen[-3:]
    took = record.failed_after()
    # Started by the killed triggerer, then again by the new one, which ended the task.
    events = trigger_log()
    assert sum(e.endswith(" starting") for e in events) >= 2, events
    assert any("the task ends here, in the triggerer" in e for e in events), events
    assert xcom(api, "hvd_mnist_pytorch", run_id, "wait_for_artifacts")["checkpoint"].endswith(".pt")
    record.observe(f"the run succeeded {took:.0f} s after the restart; the new triggerer ran the trigger again "
                   "and ended the sensor", seconds=None)


def test_landing_data_starts_the_retraining_which_resumes_from_its_checkpoint_in_s3(deployment):
    """hvd_scheduled_retraining runs when data lands (its Asset): once from the ingest DAG, once from a
    data pipeline announcing new data through the REST API; the second run resumes from the first
    one's checkpoint in the bucket."""
    api, state = deployment["api"], deployment["state"]
    api.api("PATCH", "/dags/hvd_scheduled_retraining", {"is_paused": False})
    # Scheduled on its data asset alone: nothing runs until data lands.
    assert api.api("GET", "/dags/hvd_scheduled_retraining/dagRuns")["total_entries"] == 0
    # The ingest DAG lands data on its own schedule (daily: unpausing it runs the latest day).
    api.api("PATCH", "/dags/hvd_digits_ingest", {"is_paused": False})
    ingest = api.wait_for_runs("hvd_digits_ingest", 1, timeout=120)
    assert ingest[0]["state"] == "success" and ingest[0]["run_type"] == "scheduled"
    first = api.wait_for_runs("hvd_scheduled_retraining", 1, timeout=300)[0]
    assert first["run_type"] == "asset_triggered" and first["state"] == "success", first
    events = api.api("GET", f"/dags/hvd_scheduled_retraining/dagRuns/{first['dag_run_id']}"
                            "/upstreamAssetEvents")["asset_events"]
    assert [(e["name"], e["source_dag_id"]) for e in events] == [("hvd_digits_data", "hvd_digits_ingest")]

    # New data announced from outside Airflow (a data pipeline calling the REST API) starts another
    # run, which continues from the first one's checkpoint.
    asset = api.api("GET", "/assets?name_pattern=hvd_digits_data")["assets"][0]
    assert asset["uri"].startswith("s3://hvd-artifacts/"), asset
    api.api("POST", "/assets/events", {"asset_id": asset["id"], "extra": {"from": "test"}})
    runs = api.wait_for_runs("hvd_scheduled_retraining", 2, timeout=300)
    second = runs[-1]
    assert second["run_type"] == "asset_triggered" and second["state"] == "success", runs

    def retrain_log(run: dict) -> list[str]:
        return log_events(airflow_logs(state) / "dag_id=hvd_scheduled_retraining" / f"run_id={run['dag_run_id']}"
                          / "task_id=retrain" / "attempt=1.log")

    first_log, second_log = retrain_log(first), retrain_log(second)
    assert any("training starts fresh" in line for line in first_log), first_log[-40:]
    resumed = [line for line in second_log if line.startswith("Resuming from checkpoint")]
    assert resumed and "s3://hvd-artifacts/" in resumed[0] and "/models/digits/checkpoints/ckpt-" in resumed[0], \
        second_log[-40:]
    # The checkpoint it resumed from is an object in the bucket, written by the first run.
    checkpoint = resumed[0].split()[3]
    assert on_host(state, "airflow", f"import s3fs; print(s3fs.S3FileSystem().size({checkpoint!r}))").strip() != "0"
    # Each run published its model, the second one trained further.
    published = [xcom(api, "hvd_scheduled_retraining", run["dag_run_id"], "publish") for run in (first, second)]
    assert published[1]["epoch"] > published[0]["epoch"], published
    assert published[1]["model"] == published[0]["model"] and published[1]["model"].startswith("s3://hvd-artifacts/")
    assert on_host(state, "airflow", f"import s3fs; print(s3fs.S3FileSystem().exists({published[1]['model']!r}))"
                   ).strip() == "True"
    # The task log reads as a training log: the ranks' lines, and of Spark's INFO lines only the one
    # that says where its UI is (the JVM starts with our log4j2 configuration, under the scheduler too).
    assert any(re.match(r"\[0\]<log>: epoch \d+:", line) for line in first_log), first_log[-40:]
    spark_info = [line for line in first_log if SPARK_LOG_LINE.fullmatch(line) and " INFO " in line]
    assert spark_info and all(" INFO SparkUI:" in line for line in spark_info), spark_info
    for name in ("scheduler", "triggerer", "dag-processor", "api-server"):
        assert "Traceback" not in host_log(state, "airflow", name), name


def test_a_users_own_dag_folder_is_served_beside_the_platforms(deployment):
    """dags/ and localcluster/user_dags/ are two DAG bundles of one Airflow, as a team's repository
    would be mounted beside the platform's DAGs."""
    dags = {d["dag_id"]: d for d in deployment["api"].api("GET", "/dags?limit=100")["dags"]}
    assert {"hvd_mnist_pytorch", "team_smoke"} <= set(dags), sorted(dags)
    assert dags["team_smoke"]["bundle_name"] == "user-dags" and dags["hvd_mnist_pytorch"]["bundle_name"] == \
        "dags-folder", {k: dags[k]["bundle_name"] for k in ("team_smoke", "hvd_mnist_pytorch")}


@pytest.mark.faults
def test_the_s3_server_stopped_mid_training_fails_the_run_naming_the_url_and_the_operation(deployment, fault):
    """Last in this module: moto keeps its objects in memory, so the bucket comes back empty."""
    record = fault("the S3 server (moto) killed mid-training (make cluster, storage on s3://)",
                   "the training task fails naming the operation (writing checkpoint N) and its s3:// URL; "
                   "nothing of the run left")
    api, state = deployment["api"], deployment["state"]
    run_id = trigger(api, "hvd_mnist_pytorch", {"epochs": 2000})
    train_log = wait_until_training(api, state, run_id)
    cluster = Cluster(state)
    cluster.stop("s3", "moto", crash=True)
    record.start()
    try:
        wait_until_train_ends(api, run_id, timeout=240)
        took = record.failed_after()
    finally:
        cluster.restart("s3", "moto")
        cluster.wait_port("s3", 9000, "moto")
        on_host(state, "airflow", "import s3fs; s3fs.S3FileSystem().mkdir('hvd-artifacts')")
    events = log_events(train_log)
    assert task_states(api, "hvd_mnist_pytorch", run_id)["train"] == "failed", events[-30:]
    named = [e for e in events if re.search(r"save_checkpoint: writing checkpoint \d+ to s3://hvd-artifacts/\S+/"
                                            r"checkpoints/ckpt-\d+\.pt failed", e)]
    assert named, [e for e in events if "rror" in e][-20:]
    wait_for("every process of the run to end on every host", lambda: not processes_of_runs(state), 30,
             seen=lambda: processes_of_runs(state))
    record.observe(f"train failed {took:.0f} s after S3 went: {named[-1][named[-1].index('save_checkpoint'):][:200]}")
    if api.api("GET", f"/dags/hvd_mnist_pytorch/dagRuns/{run_id}")["state"] == "running":
        api.api("PATCH", f"/dags/hvd_mnist_pytorch/dagRuns/{run_id}", {"state": "failed"})
