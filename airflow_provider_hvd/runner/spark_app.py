"""The Spark application HorovodRunnerOperator submits: payload in, HorovodRunner, result out.

    spark-submit .../spark_app.py --payload URL --result URL --np N [--timeline URL] [--options JSON]

``--options``: HorovodRunner's options (defaults.OPTIONS) as a JSON object; each is checked
here as it is in the operator, and one left out takes its default.

No Airflow import: it runs wherever spark-submit puts the driver. The signing key
never arrives on the command line: a file named by HVD_SIGNING_KEY_FILE (read, then
deleted) or HVD_SIGNING_KEY (hex: from a Kubernetes Secret, or from spark-submit's
environment on a standalone cluster); placements/signing_key.py
says which mode uses which. Both names leave the environment before any user code
runs, as does the ranks' extra environment (HVD_RANK_ENV_JSON). The payload is
verified with the key before it is unpickled; rank 0's value is sealed with it and
written atomically to --result (as JSON when it is JSON, else as a pickle: results.py).
A failure is written to ``<result>.error.json`` so the operator can raise the
runner's own message, not spark-submit's exit code.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import signal
import sys
import traceback

from airflow_provider_hvd.runner import defaults
from airflow_provider_hvd.runner.errors import PayloadError

SIGNING_KEY_ENV = "HVD_SIGNING_KEY"
SIGNING_KEY_FILE_ENV = "HVD_SIGNING_KEY_FILE"
# Spark's log4j2 configuration for this application: WARN from the JVM's first line (the file says why).
LOG4J2_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_log4j2.properties")
RANK_ENV_ENV = "HVD_RANK_ENV_JSON"
KEY_FOLDER_PREFIX = "hvd-key-"  # placements/signing_key.key_file's folders
# Client mode: the pid of the Airflow task that ran spark-submit on this host (see _end_with_owner).
OWNER_PID_ENV = "HVD_OWNER_PID"
# The line announce_application prints once the SparkContext exists, read by HorovodSparkSubmitHook.
APPLICATION_MARKER = "HVD-SPARK-APPLICATION "
# Standalone cluster mode: the jar spark-submit was handed only to carry PythonRunner (spark-core's,
# placements/standalone.py). Spark lists it in spark.jars, so every executor would fetch and copy it
# before its first task, though every Spark host has it on its classpath: left out here.
CARRIER_JAR_ENV = "HVD_CARRIER_JAR"
# The executors' Python worker daemon: pyspark's own, but importing pyspark from its compiled
# installation rather than Spark's zip (runner/barrier/worker_daemon.py); a user's own setting wins.
DAEMON_MODULE_CONF = "spark.python.daemon.module"
WORKER_DAEMON = "airflow_provider_hvd.runner.barrier.worker_daemon"


def _die_with_parent() -> None:
    # The driver's JVM is our parent (spark-submit's in client mode, the worker's DriverWrapper in
    # standalone cluster mode); when on_kill kills it (or the driver), we go too,
    # and closing our driver service then stops every rank.
    from airflow_provider_hvd.runner.common.lifetime import die_with_parent

    die_with_parent(signal.SIGTERM)


def _end_with_owner() -> None:
    # Client mode: the Airflow task that started spark-submit may die without its on_kill (an OOM
    # kill, a SIGKILLed worker). Its spark-submit would train on, orphaned, while the task's retry
    # starts a second training. So the driver ends the application when that task ends: as on_kill
    # does, by killing spark-submit's JVM (our parent), whose death ends us (parent-death signal),
    # our driver service and with it every rank.
    owner = os.environ.pop(OWNER_PID_ENV, None)
    if not owner:
        return
    from airflow_provider_hvd.runner.common.lifetime import when_process_ends

    def owner_gone() -> None:
        print(f"HorovodRunner application: the Airflow task (pid {owner}) that submitted it is gone; "
              f"ending the application (a retry resumes from its newest checkpoint)", file=sys.stderr, flush=True)
        parent = os.getppid()
        try:
            with open(f"/proc/{parent}/comm") as f:
                is_jvm = f.read().strip() == "java"
        except OSError:
            is_jvm = False
        if is_jvm:
            os.kill(parent, signal.SIGKILL)
        os._exit(1)

    when_process_ends(int(owner), owner_gone)


def spark_conf():
    """The application's SparkConf (spark-submit's properties), less the carrier jar (CARRIER_JAR_ENV),
    with our worker daemon (WORKER_DAEMON) unless the user named one.

    Read through the JVM (pyspark_internals.submitted_conf): the user's own ``spark.jars`` stay."""
    from airflow_provider_hvd.runner.driver import pyspark_internals

    conf = pyspark_internals.submitted_conf()
    conf.setIfMissing(DAEMON_MODULE_CONF, WORKER_DAEMON)
    carrier = os.environ.pop(CARRIER_JAR_ENV, None)
    if carrier:
        jars = [jar for jar in conf.get("spark.jars", "").split(",") if jar and jar != carrier]
        conf.set("spark.jars", ",".join(jars))
    return conf


def announce_application(sc) -> None:
    """One line on stdout with the application's id and where its UI is, for the operator's links."""
    print(APPLICATION_MARKER + json.dumps({"application_id": sc.applicationId, "spark_ui": sc.uiWebUrl}),
          flush=True)


def take_signing_key() -> bytes:
    """The signing key, taken out of the environment (and its file deleted) so no user code finds it."""
    path = os.environ.pop(SIGNING_KEY_FILE_ENV, None)
    key_hex = os.environ.pop(SIGNING_KEY_ENV, None)
    if path:
        try:
            with open(path) as f:
                key_hex = f.read()
        except OSError as exc:
            raise PayloadError(f"cannot read the signing key from {path} ({SIGNING_KEY_FILE_ENV}): {exc}") from None
        try:
            os.unlink(path)  # one use; on YARN this is the container's link to the localised copy
            folder = os.path.dirname(path)
            if os.path.basename(folder).startswith(KEY_FOLDER_PREFIX):
                # Client mode: the operator's own folder for it (placements/signing_key.key_file), which a task
                # killed without its cleanup (SIGKILL) would leave behind.
                os.rmdir(folder)
        except OSError:
            pass
    if not key_hex:
        raise PayloadError(f"neither {SIGNING_KEY_FILE_ENV} nor {SIGNING_KEY_ENV} is set: this application only "
                           "runs payloads signed by HorovodRunnerOperator, which hands it the key")
    try:
        return bytes.fromhex(key_hex.strip())
    except ValueError:
        raise PayloadError("the signing key handed to this application is not hex") from None


def read_payload(url: str) -> bytes:
    """The sealed payload's bytes, from any fsspec URL (verified by the caller)."""
    from airflow_provider_hvd.runner.common.storage import fs_and_path

    fs, path = fs_and_path(url)
    with fs.open(path, "rb") as f:
        return f.read()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payload", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--np", type=int, required=True)
    parser.add_argument("--timeline")
    parser.add_argument("--log-dir", help="also ship this driver's output to numbered chunks under this URL "
                        "(cluster deploy mode: no one reads the driver's stdout; runner/driver/log_shipper.py)")
    parser.add_argument("--options", type=runner_options, default={},
                        help="HorovodRunner's options as a JSON object: " + ", ".join(defaults.OPTIONS))
    return parser.parse_args(argv)


def runner_options(text: str) -> dict:
    """``--options``: every key a known option, every value checked (argparse reports the error)."""
    options = json.loads(text)
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"--options takes a JSON object, got {text!r}")
    unknown = sorted(set(options) - set(defaults.OPTIONS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown option(s) {unknown}: known are {', '.join(defaults.OPTIONS)}")
    try:
        return {name: defaults.parse_option(name, value) for name, value in options.items()}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    # Before anything imports pyspark: from its installation, not compiled anew from Spark's zip.
    from airflow_provider_hvd.runner.common.installed_pyspark import prefer_installed

    prefer_installed()
    _die_with_parent()
    _end_with_owner()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    shipper = None
    if args.log_dir:
        from airflow_provider_hvd.runner.driver.log_shipper import LogShipper

        shipper = LogShipper(args.log_dir).start()  # before logging binds to sys.stdout
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stdout)
    application = _Application(args)
    try:
        return application.run()
    finally:
        if shipper is not None:
            # The heartbeat's exit code tells a follower that the result (or error) is there and the
            # output complete: said before the SparkContext stops (executors released), which the
            # follower need not wait for, and long before the master sees this driver end.
            shipper.close(exit_code=application.code)
        application.stop()


class _Application:
    """One run of the application: payload in, HorovodRunner, result (or error report) out."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sc = None
        self.code = 1

    def run(self) -> int:
        try:
            self._train()
            self.code = 0
        except BaseException as exc:
            self._report(exc)
        return self.code

    def _train(self) -> None:
        import cloudpickle

        from airflow_provider_hvd.runner.common.storage import atomic_write
        from airflow_provider_hvd.runner.results import seal_result
        from airflow_provider_hvd.runner.run import HorovodRunner
        from airflow_provider_hvd.runner.wire import payload

        key = take_signing_key()
        rank_env = json.loads(os.environ.pop(RANK_ENV_ENV, "{}"))
        # The payload is fetched while the SparkContext starts (and, on a cluster, while the executors
        # are launched), which the fetch from object storage would otherwise delay. It is verified
        # before it is unpickled, as ever; only the bytes arrive early.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hvd-payload") as fetcher:
            fetched = fetcher.submit(read_payload, self.args.payload)
            from pyspark import SparkContext

            # A SparkContext, not a SparkSession: the barrier stage is an RDD job, and a session would
            # load Spark SQL's classes on every task's launch for nothing.
            self.sc = SparkContext.getOrCreate(spark_conf())
            announce_application(self.sc)
            sealed = fetched.result()
        fn, kwargs = cloudpickle.loads(payload.open_sealed(sealed, key, payload.KIND_CALL))
        del sealed
        runner = HorovodRunner(np=self.args.np, env=rank_env, timeline=self.args.timeline, spark=self.sc,
                               **self.args.options)
        value = runner.run(fn, **kwargs)
        atomic_write(self.args.result, seal_result(value, key))

    def _report(self, exc: BaseException) -> None:
        from airflow_provider_hvd.runner.common.storage import atomic_write

        report = {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
        try:
            atomic_write(self.args.result + ".error.json", json.dumps(report).encode())
        except Exception:
            pass
        print(f"HorovodRunner application failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self.sc is not None:
            from airflow_provider_hvd.runner.driver import pyspark_internals

            # The JVM's context only: pyspark's stop() then waits for its accumulator server,
            # a thread that os._exit (this process's last step) ends anyway.
            pyspark_internals.stop_jvm_context(self.sc)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # do not wait on Spark's non-daemon threads
