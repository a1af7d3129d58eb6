"""Entry point of one rank process: ``python -m airflow_provider_hvd.runner.rank.main``.

A fresh interpreter per rank gives clean Horovod state and crash isolation. The
launcher writes one JSON line on stdin (driver address, run secret, rank,
launcher pid): the secret never sits in the environment, where the user's own
subprocesses would inherit it. The rank then
  1. dies with its launcher (PR_SET_PDEATHSIG) and with the driver (end of its channel),
  2. fetches the payload from the driver and verifies its signature,
  3. only then unpickles it and calls ``main(**kwargs)``,
  4. sends its exception, or (rank 0) its signed result, back to the driver.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback

from airflow_provider_hvd.runner.wire.messages import Bye, GetPayload, RankException, Result, Returned
from airflow_provider_hvd.runner.wire.hellos import RankHello
from airflow_provider_hvd.runner.wire.launch import LaunchEnv

EXIT_EXCEPTION = 1
EXIT_DRIVER_GONE = 75


def _die_with_parent(parent_pid: int) -> None:
    from airflow_provider_hvd.runner.common.lifetime import die_with_parent

    if die_with_parent(signal.SIGKILL) and os.getppid() != parent_pid:
        os._exit(EXIT_DRIVER_GONE)  # the launcher died before the kernel could be told


_finishing = threading.Event()


def _watch_driver(channel) -> None:
    """The driver closes our channel when the run ends or fails: stop at once, whatever main is doing."""
    channel.read_until(None)
    if not _finishing.is_set():  # not our own close at the end of main()
        os._exit(EXIT_DRIVER_GONE)


def _say_bye(channel) -> None:
    _finishing.set()
    channel.send_message(Bye())
    channel.close()


def _hint(exc: BaseException, while_loading: bool) -> str:
    if isinstance(exc, NameError):
        return ("A name used by the training function is not defined in the rank. Import modules "
                "inside the training function (e.g. `import torch` as its first line): imports at the "
                "top of a notebook are not sent to the ranks.")
    tensorflow_missing = (isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in (
        "tensorflow", "tf_keras")) or "horovod.tensorflow has not been built" in str(exc)
    if tensorflow_missing:
        return ("TensorFlow training needs the TensorFlow flavour of the environment (TensorFlow, tf-keras, and "
                "horovod built with its TensorFlow plugin) on the driver and every worker: run "
                "`HVD_FLAVOUR=tensorflow scripts/setup.sh` (docs/tensorflow.md).")
    if isinstance(exc, ModuleNotFoundError):
        where = "while loading the training function" if while_loading else "in the training function"
        return (f"Module {exc.name!r} could not be imported {where} on this rank's host. Install it on "
                "every worker (the same environment as the driver), and import it inside the training function.")
    return ""


def _bootstrap() -> dict:
    """From the launcher's stdin line (gloo), or from mpirun's environment (``--mpi``), whose
    secrets are removed from os.environ at once so that user code and its children never see them."""
    if "--mpi" not in sys.argv[1:]:
        return json.loads(sys.stdin.readline())
    host, port = os.environ.pop(LaunchEnv.DRIVER).rsplit(":", 1)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    boot = {"driver": [host, int(port)], "secret": os.environ.pop(LaunchEnv.SECRET), "rank": rank,
            "host": os.environ.get("HOSTNAME") or os.uname().nodename, "parent_pid": os.getppid()}
    for name in (LaunchEnv.RSH_SECRET, LaunchEnv.RSH_MAP):
        os.environ.pop(name, None)
    gpus = json.loads(os.environ.pop(LaunchEnv.GPUS_BY_RANK, "null"))
    if gpus and gpus[rank] is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[rank]
    return boot


def main() -> int:
    boot = _bootstrap()
    _die_with_parent(boot["parent_pid"])
    rank = int(boot["rank"])

    from airflow_provider_hvd.runner.rank import context as rank_context, keras_guard, stall
    from airflow_provider_hvd.runner.wire import channel as channel_mod, payload

    keras_guard.install()  # before the payload is unpickled: that may import TensorFlow

    secret = bytes.fromhex(boot["secret"])
    channel = channel_mod.connect((boot["driver"][0], int(boot["driver"][1])), secret,
                                  RankHello(rank=rank, host=boot.get("host"), pid=os.getpid()))
    channel.send_message(GetPayload())
    blob = channel.recv_bytes()
    threading.Thread(target=_watch_driver, args=(channel,), name="hvd-watch-driver", daemon=True).start()
    rank_context._install(channel, rank)

    loading = True
    try:
        body = payload.open_sealed(blob, secret, payload.KIND_CALL)
        del blob
        import cloudpickle
        fn, kwargs = cloudpickle.loads(body)
        del body
        loading = False
        if os.environ.get(LaunchEnv.STALL_TIMEOUT):
            stall.watch(channel.send_message, float(os.environ[LaunchEnv.STALL_TIMEOUT]), announce=rank == 0)
        value = fn(**kwargs)
        channel.send_message(Returned())
        if rank == 0:
            result = payload.seal(payload.dumps_result(value), secret, payload.KIND_RESULT)
            channel.send_message(Result(size=len(result)), result)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are failures of the rank too
        sys.stdout.flush()
        sys.stderr.flush()
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        channel.send_message(RankException(type=type(exc).__name__, message=str(exc), traceback=tb,
                                           hint=_hint(exc, loading), while_loading=loading))
        _say_bye(channel)
        return EXIT_EXCEPTION
    sys.stdout.flush()
    sys.stderr.flush()
    _say_bye(channel)
    return 0


def _exit_done() -> None:
    """End a rank whose work is done, without the interpreter's teardown of its modules: with torch
    loaded that teardown is slow, and every run would wait for it (docs/benchmarks.md). What a normal exit
    does that matters, in its order: wait for the non-daemon threads the training started, run the
    atexit handlers (Horovod's shutdown, which finalizes MPI; logging's flush), then flush every
    file still open for writing (an unclosed file's last bytes would otherwise be lost)."""
    import atexit
    import gc
    import io

    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    buffered = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads obj.__class__, which some objects answer with a
        # warning (torch's deprecated torch.distributed.reduce_op does).
        if issubclass(type(obj), buffered):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass
    os._exit(0)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)  # after a failure, no teardown racing Horovod's background thread
    _exit_done()
