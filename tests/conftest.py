"""Shared fixtures: real Spark sessions, and the check that no process of a run survives it."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import psutil
import pytest

# No PYSPARK_PYTHON here: on local[...] and local-cluster[...] masters HorovodRunner runs the
# driver's interpreter by itself, which is what a user's script gets (issue 13). The
# standalone cluster is configured the way a real one is, with spark.pyspark.python.
import rank_functions  # noqa: E402
import tf_rank_functions  # noqa: E402
import early  # noqa: E402
from waiting import gave_up_on, wait_for  # noqa: E402

cloudpickle.register_pickle_by_value(rank_functions)
cloudpickle.register_pickle_by_value(tf_rank_functions)

# This machine's hostname resolves to loopback, so Spark (and the ranks it places) would bind to its
# first real interface; every test keeps its traffic on loopback. A test's own hosts (a standalone
# cluster's workers on 127.0.0.2/3, localcluster's namespaces) set their own.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every JVM the tests start (Spark's local gateways, standalone masters, workers and executors,
# spark-submit) with the quick start the operator already gives its own driver and executors
# (placements/spark_conf.py): they live seconds, and C2's compiler threads took CPU the tests wait on.
# They also share one archive of Spark's classes (tests/jvm_classes.py): most of a short JVM's life is
# loading them. Each JVM says "Picked up JAVA_TOOL_OPTIONS" on its stderr. user_env() drops it: a
# user's shell has none.
if "JAVA_TOOL_OPTIONS" not in os.environ:
    import jvm_classes  # noqa: E402

    _QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    _classes = jvm_classes.archive(_QUICK_JVM)
    os.environ["JAVA_TOOL_OPTIONS"] = _QUICK_JVM + (f" {jvm_classes.SILENT} -XX:SharedArchiveFile={_classes}"
                                                    if _classes else "")

RANK_MARKER = "airflow_provider_hvd.runner.rank.main"
RSH_AGENT_MARKER = "airflow_provider_hvd.runner.barrier.rsh_agent"


def run_processes():
    """Processes that belong to HorovodRunner runs: ranks, mpirun/orted that start them, and
    mpirun's rsh agents."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status", "ppid"]):
        # Exited, and its parent gone too: only init can reap it, and this machine's init does so late.
        # A zombie whose parent lives is still counted: that parent has not waited for it.
        if proc.info.get("status") == psutil.STATUS_ZOMBIE and proc.info.get("ppid") == 1:
            continue
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if RANK_MARKER in cmdline or RSH_AGENT_MARKER in cmdline or proc.info.get("name") in ("orted", "mpirun"):
            found.append(proc)
    return found


def rank_processes():
    return [p for p in run_processes() if p.info.get("name") not in ("orted", "mpirun")
            and RSH_AGENT_MARKER not in " ".join(p.info.get("cmdline") or [])]


def assert_no_run_processes(timeout=10.0):
    def left():  # a zombie (exited, its parent not yet told) is still there: it has a name, no command line
        return [(p.pid, " ".join(p.info.get("cmdline") or []) or p.info.get("name")) for p in run_processes()]

    wait_for("every rank, rsh agent, mpirun and orted of the run to end", lambda: not left(), timeout,
             interval=0.2, seen=left)


# A command a test ran past its timeout fails the test naming it, the seconds and its last output,
# wherever the test (or its fixture) waited for it.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    try:
        return (yield)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(gave_up_on(exc)) from exc


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(gave_up_on(exc)) from exc


def user_env(**extra):
    """The environment a user's shell has: none of the Spark/Python settings a test run may carry."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON", "AIRFLOW", "HVD_", "VIRTUAL_ENV", "JAVA_TOOL_OPTIONS"))}
    return {**env, **extra}


@pytest.fixture
def no_leftovers():
    assert_no_run_processes()
    yield
    assert_no_run_processes()


def new_session(master, app_name, **conf):
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.fixture(scope="module")
def spark_local2():
    spark = new_session("local[2]", "hvd-tests-local2")
    yield spark
    spark.stop()


# An Airflow home of its own per test module: SQLite metadata DB, dags/ as the DAGs folder,
# file storage for the example DAGs.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AIRFLOW = os.path.join(os.path.dirname(sys.executable), "airflow")


def source_tree_copy(dest) -> str:
    """The repository's files (tracked, and new ones git does not ignore) copied to ``dest``, for
    `python -m build`: building in the checkout writes its egg-info and build/ there, where another
    build (CI sets the TensorFlow environment up while these tests run) may be writing them too."""
    import shutil

    listed = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = os.path.join(REPO, name)
        if os.path.isfile(source):  # a tracked file deleted in the working tree is not there to copy
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(dest, name))
    return str(dest)


def readme_block(marker: str) -> str:
    """The fenced block that follows ``<!-- README <marker>`` in README.md: what a user copies."""
    text = (Path(REPO) / "README.md").read_text()
    after = text[text.index(f"<!-- README {marker}"):]
    body = after[after.index("```"):].split("\n", 1)[1]
    return body[:body.index("```")]


@early.step("built_distributions")
def distributions() -> dict:
    """dist/ as README.md's install makes it (its first command, `make dist`), in a copy of the source
    tree with this .venv, built once for the tests that install it (test_packaging,
    test_provider_install). .venv's editable install must still point at the checkout afterwards."""
    source = Path(source_tree_copy(early.folder("build") / "source"))
    (source / ".venv").symlink_to(Path(REPO) / ".venv")
    make = readme_block("install").splitlines()[0].split("#")[0].strip()
    assert make == "make dist", f"README's install no longer starts with make dist: {make!r}"
    done = subprocess.run([*early.NICE, "bash", "-c", make], cwd=source, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"{make} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert "[setup]" not in done.stdout, f"{make} ran the set-up in the copy:\n{done.stdout[-3000:]}"
    found = subprocess.run([sys.executable, "-c", "import airflow_provider_hvd; print(airflow_provider_hvd.__file__)"],
                           cwd="/", capture_output=True, text=True, timeout=60).stdout.strip()
    assert found.startswith(str(REPO)), f"the package now imports from {found}, not the checkout {REPO}"
    dist = source / "dist"
    (wheel,), (sdist,) = list(dist.glob("airflow_provider_hvd-*.whl")), list(dist.glob("*.tar.gz"))
    return {"wheel": wheel, "sdist": sdist, "source": source}


@pytest.fixture(scope="session")
def built_distributions():
    return early.result("distributions")


@early.step("sdist_wheels")
def pyspark_wheels() -> str:
    """The folder of scripts/build_sdist_wheels.sh (pyspark's wheel, which PyPI does not ship): the
    fresh environments' installs take it as --find-links, or each builds pyspark again (25-30 s
    and 2.3 GB of uv cache each behind CI's registry mirror). Set-up built it; this reuses it."""
    done = subprocess.run([os.path.join(REPO, "scripts", "build_sdist_wheels.sh")],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.fixture(scope="session")
def sdist_wheels():
    return early.result("pyspark_wheels")


def pytest_collection_finish(session):
    early.start_for({name for item in session.items for name in getattr(item, "fixturenames", ())})


# The embedded default's spark_default, as scripts/demo.sh sets it: Spark local[*] on this machine.
LOCAL_SPARK_CONNECTION = '{"conn_type": "spark", "host": "local[*]"}'


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory) -> Path:
    """An empty Airflow metadata database (SQLite), migrated once a session: each module's Airflow
    home starts from a copy, as `airflow db migrate` would leave it."""
    home = tmp_path_factory.mktemp("airflow_db_template")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return home / "airflow.db"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, migrated_airflow_db):
    home = tmp_path_factory.mktemp("airflow_home")
    storage = tmp_path_factory.mktemp("storage")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(REPO, "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "HVD_EXAMPLE_STORAGE": f"file://{storage}",
           "AIRFLOW_CONN_SPARK_DEFAULT": LOCAL_SPARK_CONNECTION}
    shutil.copyfile(migrated_airflow_db, home / "airflow.db")
    return {"env": env, "home": home, "storage": storage}


# ---- The reliability report (docs/reliability.md) -------------------------------------
# A test that injects a fault records, through the ``fault`` fixture, the scenario, what a
# user should see, what was observed and how long failing took; pytest's own verdict is
# added. ``make faults`` sets HVD_RELIABILITY_REPORT so that the session writes the table.

_FAULT_RECORDS: list[dict] = []


_VERDICT = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when == "call":
        item.stash[_VERDICT] = report.outcome
    elif report.when == "setup" and not report.passed:
        item.stash[_VERDICT] = "skipped" if report.skipped else "error"


class FaultRecord:
    def __init__(self, scenario: str, expected: str):
        self.scenario = scenario
        self.expected = expected
        self.observed = ""
        self.seconds: float | None = None
        self._t0 = time.monotonic()

    def start(self) -> None:
        """The moment the fault is injected; time to fail counts from here."""
        self._t0 = time.monotonic()

    def failed_after(self) -> float:
        self.seconds = time.monotonic() - self._t0
        return self.seconds

    def observe(self, text: str, seconds: float | None = None) -> None:
        self.observed = " ".join(str(text).split())[:400]
        if seconds is not None:
            self.seconds = seconds


@pytest.fixture
def fault(request):
    """``record = fault(scenario, expected)``; then ``record.start()``, ``record.failed_after()``,
    ``record.observe(text)``. Every record lands in the reliability report with pytest's verdict."""
    records: list[FaultRecord] = []

    def new(scenario: str, expected: str) -> FaultRecord:
        records.append(FaultRecord(scenario, expected))
        return records[-1]

    yield new
    verdict = request.node.stash.get(_VERDICT, "error")
    for r in records:
        _FAULT_RECORDS.append({"test": request.node.nodeid, "scenario": r.scenario, "expected": r.expected,
                               "observed": r.observed, "seconds": r.seconds, "verdict": verdict})


def pytest_sessionfinish(session, exitstatus):
    early.finish()
    target = os.environ.get("HVD_RELIABILITY_REPORT")
    if not target or not _FAULT_RECORDS:
        return
    import platform

    lines = ["# Reliability", "",
             f"Written by `make faults` on {time.strftime('%Y-%m-%d %H:%M')} ({os.cpu_count()} cores, "
             f"{platform.machine()}, Python {platform.python_version()}): every row is a test in `tests/` that "
             "injects the fault for real (real Spark, real horovod, real OpenMPI, real Airflow) and asserts "
             "the expected outcome; *observed* is what that run saw. Time to fail counts from the injection "
             "to the error reaching the caller.", "",
             "| scenario | expected | observed | time to fail | result |", "| --- | --- | --- | --- | --- |"]
    for r in _FAULT_RECORDS:
        seconds = f"{r['seconds']:.2f} s" if r["seconds"] is not None else "-"
        cells = [r["scenario"], r["expected"], r["observed"] or "-", seconds, r["verdict"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "Regenerate with `make faults`; the same tests run in `make test` (CI)."]
    with open(target, "w") as f:
        f.write("\n".join(lines) + "\n")


def python_in_venv(*args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, **kwargs)


# py4j logs at INFO from its atexit hook, after pytest has closed the captured streams.
import logging  # noqa: E402

logging.getLogger("py4j").setLevel(logging.WARNING)


# ---- moto's standalone S3 server: the stand-in for a cloud bucket, which cannot be reached from here ----

@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's standalone S3 server on loopback (the stand-in for a cloud bucket)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        # moto.server turns SIGTERM into sys.exit() inside a signal handler, which a request in progress
        # can swallow: one dev run left a server behind. SIGKILL whatever is still there after 10 s.
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    import fsspec
    import s3fs

    for name, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = fsspec.filesystem("s3")
    bucket = f"hvd-{time.monotonic_ns()}"
    fs.mkdir(bucket)
    yield bucket
    fs.rm(bucket, recursive=True)
    s3fs.S3FileSystem.clear_instance_cache()


# Each test module's seconds (set-up, call and tear-down of its tests) and how busy the machine's
# CPUs were meanwhile, printed after pytest's slowest tests: the next slow module is seen when it
# lands, and whether it computes or waits. HVD_TEST_TIMES=<file> also writes every test's figures.
_MODULE_SECONDS: dict[str, list[float]] = {}
_TEST_TIMES: list[dict] = []


def _busy_cpu_seconds() -> float:
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, busy = time.monotonic(), _busy_cpu_seconds()
    yield
    wall, busy = time.monotonic() - wall, _busy_cpu_seconds() - busy
    totals = _MODULE_SECONDS.setdefault(item.nodeid.split("::")[0], [0.0, 0.0])
    totals[0] += wall
    totals[1] += busy
    _TEST_TIMES.append({"test": item.nodeid, "seconds": round(wall, 1), "busy_cpu_seconds": round(busy, 1)})


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    if not _MODULE_SECONDS:
        return
    cores = os.cpu_count() or 1
    terminalreporter.section("seconds per test module (CPU busy: share of this machine's cores in use)")
    for module, (seconds, busy) in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1][0]):
        terminalreporter.write_line(f"{seconds:8.1f}s  {busy / max(seconds * cores, 1e-9):4.0%}  {module}")
    seconds, busy = (sum(column) for column in zip(*_MODULE_SECONDS.values()))
    terminalreporter.write_line(f"{seconds:8.1f}s  {busy / max(seconds * cores, 1e-9):4.0%}  in all")
    if os.environ.get("HVD_TEST_TIMES"):
        import json

        Path(os.environ["HVD_TEST_TIMES"]).write_text(json.dumps(_TEST_TIMES, indent=1))
