"""Restarts and checkpoints (issue 20), measured for bench/run.py.

preemption_cost: on Spark local-cluster[2,1,1024] (two real executor JVMs, which Spark's worker
replaces when one dies), the same training run uninterrupted and with the executor holding rank 1
SIGKILLed mid-way under max_restarts=1, split into: detection (kill -> the attempt's failure),
the wait for slots (the replacement executor), the relaunch (-> the ranks ready to train again)
and the work lost since the last checkpoint. Runs in a child process: one SparkContext per process.

checkpoint_cost: a 1 GiB state saved by torch.save to a local file (the reference), by
save_checkpoint to a local folder and to S3 (moto's standalone server, the stand-in for a bucket),
and the old way (torch.save into memory, then the bytes written). Each in a fresh process: peak
extra RSS over the state itself, and seconds.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from measure import PhaseLog, stats

HERE = Path(__file__).resolve().parent


def _executor_of(pid: int):
    import psutil

    for parent in psutil.Process(pid).parents():
        if "CoarseGrainedExecutorBackend" in " ".join(parent.cmdline()):
            return parent
    raise RuntimeError(f"no executor JVM above pid {pid}")


def _one_run(steps, step_s, every, kill_at):
    import workloads

    from airflow_provider_hvd import HorovodRunner

    with tempfile.TemporaryDirectory() as tmp:
        markers = Path(tmp) / "markers"
        markers.mkdir()
        killed = {}

        def kill():
            progress = markers / "progress"
            while True:
                try:
                    attempt, step = progress.read_text().split()
                    if int(step) >= kill_at:
                        break
                except (FileNotFoundError, ValueError):
                    pass
                time.sleep(0.01)
            executor = _executor_of(int((markers / "attempt-0-rank-1.pid").read_text()))
            killed["t"] = time.time()
            killed["step"] = int(step)
            executor.kill()

        if kill_at:
            threading.Thread(target=kill, daemon=True).start()
        t0 = time.time()
        out = HorovodRunner(np=2, launcher="gloo", log_sink=lambda *a: None, max_restarts=1 if kill_at else 0,
                            checkpoint_dir=f"{tmp}/checkpoints", slot_wait_timeout=120).run(
            workloads.steps_with_checkpoints, steps=steps, step_s=step_s, checkpoint_every=every,
            marker_dir=str(markers))
        t1 = time.time()
        attempts = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in markers.glob("attempt-?.json")}
        return {"t0": t0, "t1": t1, "out": out, "attempts": attempts, "killed": killed}


def preemption_child(reps, steps=100, step_s=0.1, every=10, kill_at=45):
    """Each repetition in a fresh Spark application: its first run() is a launch on cold executors
    (what a relaunch on a replacement executor resembles), then the run uninterrupted and preempted."""
    from pyspark.sql import SparkSession

    sys.path.insert(0, str(HERE))
    import cloudpickle
    import workloads

    cloudpickle.register_pickle_by_value(workloads)
    marks = PhaseLog()
    logger = logging.getLogger("airflow_provider_hvd.runner")
    logger.addHandler(marks)
    logger.setLevel(logging.INFO)
    rows = {k: [] for k in ("uninterrupted s", "preempted s", "cost of the preemption s", "first launch (cold) s",
                            "normal launch (warm) s", "detection s", "wait for slots s", "relaunch s",
                            "work lost s", "steps lost")}
    for rep in range(reps):
        spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("hvd-bench-preemption")
                 .config("spark.executor.memory", "768m").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        # The executors register after getOrCreate() returns; a launch is timed once they are there
        # (what run() would otherwise wait for is the cluster's start, not the launch).
        from airflow_provider_hvd.runner.driver.pyspark_internals import max_concurrent_tasks

        while max_concurrent_tasks(spark.sparkContext) < 2:
            time.sleep(0.1)
        first = _one_run(10, step_s, every, 0)  # also warms the executors' Python workers up
        clean = _one_run(steps, step_s, every, 0)
        since = time.time()
        hit = _one_run(steps, step_s, every, kill_at)
        spark.stop()
        step_time = (clean["t1"] - clean["attempts"][0]["t_ready"]) / steps
        t_fail = marks.first("attempt 1 of 2 failed", since)
        t_slots = marks.first("task slots free after", t_fail) or t_fail
        lost_steps = hit["killed"]["step"] - hit["attempts"][1]["start_step"]
        rows["uninterrupted s"].append(clean["t1"] - clean["t0"])
        rows["preempted s"].append(hit["t1"] - hit["t0"])
        rows["cost of the preemption s"].append((hit["t1"] - hit["t0"]) - (clean["t1"] - clean["t0"]))
        rows["first launch (cold) s"].append(first["attempts"][0]["t_ready"] - first["t0"])
        rows["normal launch (warm) s"].append(clean["attempts"][0]["t_ready"] - clean["t0"])
        rows["detection s"].append(t_fail - hit["killed"]["t"])
        rows["wait for slots s"].append(t_slots - t_fail)
        rows["relaunch s"].append(hit["attempts"][1]["t_ready"] - t_slots)
        rows["work lost s"].append(lost_steps * step_time)
        rows["steps lost"].append(lost_steps)
        print(f"  preemption rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rows.items()),
              file=sys.stderr, flush=True)
    rows.update(_spark_first_task(reps))
    result = {k: stats(v) for k, v in rows.items()}
    result["setup"] = {"steps": steps, "step_s": step_s, "checkpoint_every": every, "kill_at_step": kill_at}
    print("PREEMPTION " + json.dumps(result))


def _spark_first_task(reps):
    """Spark's own cost of a new executor's first task: a trivial one-task job, first and then
    again, on a fresh application's single executor. None of our code runs in it."""
    from pyspark.sql import SparkSession

    from airflow_provider_hvd.runner.driver.pyspark_internals import max_concurrent_tasks

    first, again = [], []
    for _ in range(reps):
        spark = (SparkSession.builder.master("local-cluster[1,1,1024]").appName("hvd-bench-first-task")
                 .config("spark.executor.memory", "768m").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        sc = spark.sparkContext
        while max_concurrent_tasks(sc) < 1:
            time.sleep(0.05)
        for times in (first, again):
            t0 = time.perf_counter()
            sc.parallelize([1], 1).map(lambda x: x).collect()
            times.append(time.perf_counter() - t0)
        spark.stop()
    return {"Spark: a trivial job, first on a new executor s": first, "Spark: the same job again s": again}


def preemption_cost(reps):
    # local-cluster would bind to this machine's first real interface; keep it on loopback.
    out = subprocess.run([sys.executable, str(HERE / "restarts.py"), "preemption", str(reps)],
                         env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}, stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    return json.loads(out.split("PREEMPTION ", 1)[1].splitlines()[0])


# ---- checkpoints of a 1 GiB state -----------------------------------------------------------------------

_SAVE_CHILD = r"""
import io, json, os, resource, sys, time
import torch
mode, target, gib = sys.argv[1], sys.argv[2], float(sys.argv[3])
n = int(gib * (1 << 30)) // 4 // 16
state = {f"layer{i}": torch.full((n,), float(i)) for i in range(16)}
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
base = rss()
t0 = time.perf_counter()
if mode == "torch.save to a local file":
    torch.save(state, target)
elif mode == "in memory first (the old save_checkpoint)":
    from airflow_provider_hvd.runner.common.storage import atomic_write
    buffer = io.BytesIO(); torch.save(state, buffer); atomic_write(target, buffer.getvalue())
else:
    from airflow_provider_hvd import save_checkpoint
    target = save_checkpoint(state, target, step=1)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("SAVE " + json.dumps({"seconds": seconds, "extra_bytes": max(0, peak - base), "state_bytes": 16 * n * 4}))
"""

CHECKPOINT_MODES = ("torch.save to a local file", "save_checkpoint to a local folder", "save_checkpoint to S3 (moto)",
                    "in memory first (the old save_checkpoint)")


def _moto():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's server did not start")
            time.sleep(0.2)


def checkpoint_cost(reps, gib=1.0):
    import fsspec

    server, endpoint = _moto()
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    runs = {mode: [] for mode in CHECKPOINT_MODES}
    try:
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir("hvd-bench")
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(reps):
                for mode in CHECKPOINT_MODES[rep % 4:] + CHECKPOINT_MODES[:rep % 4]:
                    target = {"torch.save to a local file": f"{tmp}/state.pt",
                              "save_checkpoint to a local folder": f"{tmp}/checkpoints",
                              "save_checkpoint to S3 (moto)": f"s3://hvd-bench/rep{rep}",
                              "in memory first (the old save_checkpoint)": f"{tmp}/old/ckpt-0000000001.pt"}[mode]
                    out = subprocess.run([sys.executable, "-c", _SAVE_CHILD, mode, target, str(gib)], env=env,
                                         stdout=subprocess.PIPE, text=True, check=True).stdout
                    runs[mode].append(json.loads(out.split("SAVE ", 1)[1]))
                    subprocess.run(["rm", "-rf", f"{tmp}/state.pt", f"{tmp}/checkpoints", f"{tmp}/old"], check=True)
                print("  checkpoint rep %d/%d: " % (rep + 1, reps) + ", ".join(
                    f"{m} {v[-1]['seconds']:.2f}s +{v[-1]['extra_bytes'] / 2**20:.0f} MiB" for m, v in runs.items()),
                    flush=True)
    finally:
        server.kill()
        server.wait()
    state = runs[CHECKPOINT_MODES[0]][0]["state_bytes"]
    return {"state MiB": state / 2**20,
            **{mode: {"seconds": stats([r["seconds"] for r in v]),
                      "extra MiB": stats([r["extra_bytes"] / 2**20 for r in v])} for mode, v in runs.items()}}


def report_lines(preemption, checkpoint):
    lines = ["## Restarts: the cost of one preemption (`max_restarts`)", ""]
    if not preemption:
        lines += ["Not measured in this run (`bench/run.py --only preemption`).", ""]
    else:
        setup = preemption["setup"]
        lines += [
            f"Spark `local-cluster[2,1,1024]` (two executor JVMs), 2 ranks (gloo), {setup['steps']} steps of "
            f"{setup['step_s']} s, a checkpoint every {setup['checkpoint_every']} steps. The same run uninterrupted, "
            f"and with the executor holding rank 1 SIGKILLed at step {setup['kill_at_step']} (`max_restarts=1`). "
            "Interleaved repetitions, medians with min-max, seconds.",
            "",
            "| part | median s | min-max s |",
            "| --- | --- | --- |",
            *[f"| {name.removesuffix(' s')} | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} |"
              for name, s in preemption.items() if name not in ("setup", "steps lost")],
            "",
            f"Relaunch against one normal launch (goal: at most 1.5): "
            f"{preemption['relaunch s']['median'] / preemption['first launch (cold) s']['median']:.2f} against "
            "the first launch of an application (its executors cold, as the replacement executor is), "
            f"{preemption['relaunch s']['median'] / preemption['normal launch (warm) s']['median']:.2f} against a "
            "launch on executors that have run tasks before. "
            "*Detection* is from the kill to the attempt's failure; *wait for slots* until Spark's worker has "
            "replaced the executor and the cluster again has 2 free slots; *relaunch* from there until both "
            "ranks are ready to train (barrier stage, rank processes, imports, hvd.init(), checkpoint loaded); "
            f"*work lost* the {preemption['steps lost']['median']:.0f} steps done since the last checkpoint "
            "(median), done again. The launches are the same span (from `run()` to both ranks ready) in a run "
            "without a fault: the first of a fresh application, and a later one. What a relaunch adds to a warm "
            "launch is the replacement executor's first task (a new JVM's class loading, Spark's Python daemon "
            "and worker starting there): the ranks' own start (imports, hvd.init(), the checkpoint) costs the "
            "same as in any launch. Spark's part of that, measured alone (a trivial one-task job on a new "
            f"executor: {preemption['Spark: a trivial job, first on a new executor s']['median']:.2f} s, "
            f"then {preemption['Spark: the same job again s']['median']:.2f} s), is nearly all of the difference. "
            "Peers: TorchDistributor and HorovodRunner fail the job (an Airflow retry then pays a new "
            "spark-submit and application); Ray Train restores from its last checkpoint in the same way.",
            "",
        ]
    lines += ["## Checkpoints of a 1 GiB state", ""]
    if not checkpoint:
        return lines + ["Not measured in this run (`bench/run.py --only checkpoint`).", ""]
    ref = checkpoint["torch.save to a local file"]["seconds"]["median"]
    state = checkpoint["state MiB"]
    lines += [
        f"A state of {state:.0f} MiB (16 float32 tensors), saved in a fresh process each time; *extra memory* is "
        "the process's peak resident memory over what it held before saving (the state itself). Medians "
        "with min-max over interleaved repetitions.",
        "",
        "| how | median s | min-max s | ratio to torch.save | extra memory MiB | % of the state |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode in CHECKPOINT_MODES:
        s, m = checkpoint[mode]["seconds"], checkpoint[mode]["extra MiB"]
        lines.append(f"| {mode} | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} | {s['median'] / ref:.2f} | "
                     f"{m['median']:.0f} | {100 * m['median'] / state:.1f}% |")
    lines += ["", "Goals: extra memory at most 10% of the state, time at most 1.5 times torch.save to a local "
              "file. save_checkpoint streams torch.save's output into a temporary sibling renamed when "
              "complete (a folder) or into one multipart upload (S3, 8 MiB parts), so what it holds is one "
              "upload part, not the state; S3's time is moto's on this machine, over loopback. Local "
              "times swing with the kernel flushing earlier writes (the min-max columns); fastest against "
              f"fastest, save_checkpoint to a folder takes "
              f"{checkpoint['save_checkpoint to a local folder']['seconds']['min'] / checkpoint['torch.save to a local file']['seconds']['min']:.2f} "
              "of torch.save's time.", ""]
    return lines


if __name__ == "__main__":
    if sys.argv[1] == "preemption":
        preemption_child(int(sys.argv[2]))
