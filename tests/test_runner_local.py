"""np < 0: ranks as subprocesses of the driver, no Spark."""

import importlib.util
import time

import pytest
import rank_functions as rf

from airflow_provider_hvd import HorovodRunner
from airflow_provider_hvd.runner.errors import RankFailedError, StartTimeoutError


def collecting_sink():
    lines = []
    return lines, lambda rank, stream, line: lines.append((rank, stream, line))


LAUNCHERS = pytest.mark.parametrize("launcher", ["gloo", "mpi"])


@LAUNCHERS
def test_local_mode_runs_two_ranks_and_returns_rank0(launcher, no_leftovers):
    lines, sink = collecting_sink()
    out = HorovodRunner(np=-2, log_sink=sink, launcher=launcher).run(rf.allreduce_info, x="kw")
    assert out["rank0"]["rank"] == 0 and out["rank0"]["x"] == "kw"
    assert [(i["rank"], i["size"], i["local_rank"], i["local_size"], i["sum"]) for i in out["all"]] == [
        (0, 2, 0, 2, 3.0), (1, 2, 1, 2, 3.0)]
    assert {(r, s) for r, s, line in lines if "sum 3.0" in line} == {(0, "log"), (1, "log")}


def test_rank0_value_is_returned_every_time(no_leftovers):
    # TorchDistributor's local mode returns whichever rank ends last; we always return rank 0's.
    for _ in range(3):
        assert HorovodRunner(np=-2).run(rf.chatty) == 0


@LAUNCHERS
def test_a_rank_ends_as_python_would_threads_joined_files_flushed(tmp_path, launcher, no_leftovers):
    """Ranks skip the interpreter's slow teardown (rank/main.py _exit_done), not what a normal exit
    guarantees: the training's non-daemon threads finish and files it left open keep their bytes."""
    assert HorovodRunner(np=-2, launcher=launcher).run(rf.leaves_work_behind, directory=str(tmp_path)) == 0
    for rank in (0, 1):
        assert (tmp_path / f"unclosed-{rank}.txt").read_text() == "written, never flushed or closed\n" * 100
        assert (tmp_path / f"thread-{rank}.txt").read_text() == "written by a thread after the function returned"


@LAUNCHERS
def test_verbosity_all_streams_stdout_callback_only_does_not(launcher, no_leftovers):
    lines, sink = collecting_sink()
    HorovodRunner(np=-2, log_sink=sink, launcher=launcher).run(rf.chatty)
    assert (1, "stdout", "stdout line from rank 1") in lines
    assert (1, "log", "callback line from rank 1") in lines
    lines, sink = collecting_sink()
    HorovodRunner(np=-2, driver_log_verbosity="log_callback_only", log_sink=sink, launcher=launcher).run(rf.chatty)
    assert {s for _, s, _ in lines} == {"log"} and len(lines) == 2


def test_env_reaches_every_rank(no_leftovers):
    assert HorovodRunner(np=-2, env={"MY_SETTING": "42"}).run(rf.echo_env, name="MY_SETTING") == "42"


@LAUNCHERS
def test_exception_names_rank_type_message_and_traceback(launcher, no_leftovers):
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2, launcher=launcher).run(rf.fail_on_rank, bad_rank=1, message="bad batch 7")
    assert time.monotonic() - t0 < 20
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank 1 (host localhost" in str(err) and "ValueError: bad batch 7" in str(err)
    assert "in fail_on_rank" in str(err) and err.remote_traceback.startswith("Traceback")
    # The session is usable again at once.
    assert HorovodRunner(np=-2).run(rf.chatty) == 0


@LAUNCHERS
def test_killed_rank_is_named_with_its_signal_and_last_lines(launcher, no_leftovers):
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2, launcher=launcher).run(rf.kill_rank, bad_rank=1)
    assert info.value.rank == 1 and "signal SIGKILL" in str(info.value)
    assert "last words before SIGKILL" in str(info.value)


def test_module_not_imported_inside_main_gets_the_hint(no_leftovers):
    with pytest.raises(RankFailedError, match="Import modules inside the training function") as info:
        HorovodRunner(np=-2).run(rf.uses_module_it_did_not_import)
    assert "NameError" in str(info.value) and "'torch'" in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None,
                    reason="the TensorFlow flavour is installed here: tensorflow imports")
def test_tensorflow_code_without_the_tensorflow_flavour_says_how_to_get_it(no_leftovers):
    with pytest.raises(RankFailedError, match="HVD_FLAVOUR=tensorflow scripts/setup.sh") as info:
        HorovodRunner(np=-1).run(rf.uses_tensorflow)
    assert "ModuleNotFoundError: No module named 'tensorflow'" in str(info.value)


@LAUNCHERS
@pytest.mark.faults
def test_start_timeout_names_the_rank_that_never_started(tmp_path, launcher, no_leftovers, fault):
    record = fault(f"a rank's interpreter hangs at start ({launcher}, local, start_timeout=3)",
                   "StartTimeoutError naming the rank within seconds")
    # A real stall at interpreter start: rank 1's sitecustomize sleeps before the rank connects.
    (tmp_path / "sitecustomize.py").write_text(
        "import os, time\n"
        "if (os.environ.get('HOROVOD_RANK') or os.environ.get('OMPI_COMM_WORLD_RANK')) == '1':\n"
        "    time.sleep(120)\n")
    t0 = time.monotonic()
    with pytest.raises(StartTimeoutError, match=r"rank\(s\) \[1\] did not start within start_timeout=3s") as info:
        HorovodRunner(np=-2, start_timeout=3, env={"PYTHONPATH": str(tmp_path)}, launcher=launcher).run(rf.chatty)
    assert info.value.missing_ranks == [1]
    # Its launcher was up: the message says the process hung, not that it was never scheduled.
    assert "launchers were running (rank 1 on " in str(info.value)
    if launcher == "mpi":
        # mpirun's launcher said which of its processes were waiting, and on what (not logged).
        snapshot = next(line for line in str(info.value).splitlines() if "mpirun's processes here" in line)
        assert "rank.main" in snapshot and "sleeping" in snapshot and "wchan=" in snapshot, snapshot
    assert time.monotonic() - t0 < 15
    record.observe(str(info.value).split(" Their launchers")[0], time.monotonic() - t0)


@pytest.mark.parametrize("kwargs, error, text", [
    ({"np": 0}, ValueError, "np=-N"),
    ({"np": 2.0}, TypeError, "takes an int"),
    ({"np": 2, "launcher": "ssh"}, ValueError, "launcher='ssh' is not known"),
    ({"np": 2, "mpi_args": "-v"}, TypeError, "mpi_args must be a list"),
    ({"np": 2, "driver_log_verbosity": "loud"}, ValueError, "log_callback_only"),
    ({"np": 2, "env": {"A": 1}}, TypeError, "env must map str to str"),
    ({"np": 2, "start_timeout": 0}, ValueError, "start_timeout"),
])
@pytest.mark.faults
def test_bad_arguments_are_refused_at_construction(kwargs, error, text, request):
    with pytest.raises(error, match=text) as info:
        HorovodRunner(**kwargs)
    if kwargs in ({"np": 0}, {"np": 2, "launcher": "ssh"}):  # the two the reliability report lists
        record = request.getfixturevalue("fault")(f"HorovodRunner({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})",
                                                  "refused at construction, before anything starts")
        record.observe(f"{type(info.value).__name__}: {info.value}", 0.0)
