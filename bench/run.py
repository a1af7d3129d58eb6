"""Benchmarks against the peers, in one run, on this machine: writes docs/benchmarks.md and PNG plots.

    make bench            (or: .venv/bin/python bench/run.py [--reps 5])

Every figure is a median over repeated runs, interleaved across runners so that
drift on the machine hits them alike, with min-max beside it, and reported as a
ratio to the peer. Nothing here is asserted: timing belongs in this report.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
# Every Spark here (the bench's session, the peers', what they start) binds to loopback, not to
# whatever address the host name resolves to: nothing of a measurement leaves the machine.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import cloudpickle  # noqa: E402
import encryption  # noqa: E402
import operator_task  # noqa: E402
import restarts  # noqa: E402
from measure import PhaseLog, stats  # noqa: E402
import workloads  # noqa: E402

cloudpickle.register_pickle_by_value(workloads)
try:  # pyspark ships its own cloudpickle, which TorchDistributor uses
    from pyspark import cloudpickle as pyspark_cloudpickle

    pyspark_cloudpickle.register_pickle_by_value(workloads)
except (ImportError, AttributeError):
    pass


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def peer_python():
    """What PYSPARK_PYTHON gives the peers: without it their Spark jobs start `python3` from the
    PATH, which lacks torch and horovod. HorovodRunner needs nothing on a local master (it runs
    the driver's interpreter by itself), so our rows run as a user's script does."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    before = sc.pythonExec
    sc.pythonExec = sys.executable
    try:
        yield
    finally:
        sc.pythonExec = before


def as_peer(fn):
    def run():
        with peer_python():
            return fn()
    return run


def launch_overhead(reps, phases):
    import horovod.spark
    from pyspark.ml.torch.distributor import TorchDistributor

    from airflow_provider_hvd import HorovodRunner

    quiet = dict(log_sink=lambda *a: None)
    runners = {
        "ours, barrier, gloo": lambda: HorovodRunner(np=2, launcher="gloo", **quiet).run(workloads.hvd_allreduce),
        "ours, barrier, mpi": lambda: HorovodRunner(np=2, launcher="mpi", **quiet).run(workloads.hvd_allreduce),
        "ours, local np=-2, gloo": lambda: HorovodRunner(np=-2, launcher="gloo", **quiet).run(workloads.hvd_allreduce),
        "horovod.spark.run (gloo)": as_peer(lambda: horovod.spark.run(workloads.hvd_allreduce, num_proc=2,
                                                                       use_gloo=True, verbose=0)),
        "TorchDistributor(local_mode=False)": as_peer(lambda: TorchDistributor(
            num_processes=2, local_mode=False, use_gpu=False).run(workloads.torch_allreduce)),
        "TorchDistributor(local_mode=True)": as_peer(lambda: TorchDistributor(
            num_processes=2, local_mode=True, use_gpu=False).run(workloads.torch_allreduce)),
    }
    times = {name: [] for name in runners}
    ours = [name for name in runners if name.startswith("ours")]
    breakdown = {name: {phase: [] for phase in BREAKDOWN_PHASES} for name in ours}
    for name, run in runners.items():  # warm-up: JVM, imports, page cache
        run()
    for rep in range(reps):
        for name, run in runners.items():
            t0 = time.time()
            value = run()
            t1 = time.time()
            times[name].append(t1 - t0)
            if name in ours:
                for phase, seconds in launch_phases(phases, t0, t1, value).items():
                    breakdown[name][phase].append(seconds)
        print(f"  launch rep {rep + 1}/{reps}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in runners), flush=True)
    return ({n: stats(v) for n, v in times.items()},
            {n: {p: stats(v) for p, v in by_phase.items() if v} for n, by_phase in breakdown.items()})


BREAKDOWN_PHASES = (
    "Spark stage start, tasks join the roster",
    "rank processes start, fetch and verify the payload",
    "import torch and horovod, hvd.init() (rendezvous)",
    "allreduce",
    "result back to the driver",
    "ranks exit (Python/torch teardown), stage ends",
)


def launch_phases(phases, t0, t1, value):
    """Split one run() of ours by the runner's log lines and the times the function recorded."""
    _, t_enter, t_init, t_done = value
    joined = phases.first("barrier tasks joined", t0) or t0  # local mode: no Spark stage
    result = phases.first("returned its result", t0)
    bounds = [t0, joined, t_enter, t_init, t_done, result, t1]
    return {phase: bounds[i + 1] - bounds[i] for i, phase in enumerate(BREAKDOWN_PHASES)}


def import_check_cost(reps):
    """What each barrier run pays for checking that the workers' Python can run a rank (issue 13):
    the driver's scan of the call (also with 1 GiB captured), and each task's find_spec() of the
    required modules, in a fresh interpreter as a Python worker is (pyspark imported)."""
    import numpy

    from airflow_provider_hvd.runner.wire import payload
    from airflow_provider_hvd.runner.driver.dependencies import required_modules

    call = payload.dumps_call(workloads.hvd_allreduce, {})
    modules = required_modules(workloads.hvd_allreduce, call)
    driver = stats([timed(lambda: required_modules(workloads.hvd_allreduce, call)) for _ in range(reps)])
    big = payload.dumps_call(workloads.with_payload, {"blob": numpy.zeros(1 << 27)})  # 1 GiB of float64
    driver_big = stats([timed(lambda: required_modules(workloads.with_payload, big)) for _ in range(reps)])
    del big
    probe = ("import importlib.util, sys, time; import pyspark; t = time.perf_counter(); "
             "[importlib.util.find_spec(m) for m in sys.argv[1:]]; print(time.perf_counter() - t)")
    worker = stats([float(subprocess.run([sys.executable, "-c", probe, *modules], capture_output=True, text=True,
                                         check=True).stdout) for _ in range(reps)])
    return {"modules": modules, "driver scan of the call": driver,
            "driver scan, 1 GiB captured": driver_big, "task: find_spec of each module": worker}


def steady_state(reps, steps):
    from airflow_provider_hvd import HorovodRunner

    script = ("import sys; sys.path.insert(0, %r); import workloads; r = workloads.hvd_train_steps(%d)\n"
              "import horovod.torch as hvd\nif hvd.rank() == 0: print('STEPS_PER_S', r)" % (str(HERE), steps))
    ours, bare = [], []
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    for rep in range(reps):
        ours.append(HorovodRunner(np=2, launcher="gloo", log_sink=lambda *a: None).run(
            workloads.hvd_train_steps, steps=steps))
        # Spark starts our ranks with OMP_NUM_THREADS=spark.task.cpus (1); bare horovodrun gets the
        # same, or its two ranks fight over the two cores (10-12 steps/s here instead of ~60).
        out = subprocess.run([horovodrun, "-np", "2", "--gloo", sys.executable, "-c", script],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
        bare.append(float(out.split("STEPS_PER_S")[1].split()[0]))
        print(f"  steady rep {rep + 1}/{reps}: ours {ours[-1]:.1f}, horovodrun {bare[-1]:.1f} steps/s", flush=True)
    return {"ours": stats(ours), "bare horovodrun -np 2": stats(bare)}


# The timeline's cost, split: "Horovod's writer only" records the timeline with our side idle until
# the end (no reads during training, no live view), so it costs what Horovod's writer thread costs;
# "with our tail and live view" is the default. Their difference is our part.
TIMELINE_MODES = {
    "off": {},
    "Horovod's writer only": {"timeline_interval": 86400.0, "timeline_live_bytes": 0},
    "with our tail and live view (default)": {},
}


def timeline_cost(reps, steps_by_np):
    """Steps/s with the timeline off, with Horovod's writer alone, and with our publishing, for np=1
    (a core left free for the writer thread) and np=2 (every core busy with a rank). The modes'
    order rotates from one repetition to the next, so none always runs first or last."""
    from airflow_provider_hvd import HorovodRunner

    results = {}
    modes = list(TIMELINE_MODES)
    with tempfile.TemporaryDirectory() as tmp:
        for np_, steps in steps_by_np.items():
            runs = {mode: [] for mode in TIMELINE_MODES}
            sizes = []
            for rep in range(reps):
                for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
                    options = TIMELINE_MODES[mode]
                    path = f"{tmp}/tl-{np_}-{rep}.json"
                    runner = HorovodRunner(np=np_, launcher="gloo", log_sink=lambda *a: None,
                                           timeline=path if mode != "off" else None, **options)
                    # allreduce_always: with one rank, DistributedOptimizer would skip the allreduces and
                    # Horovod's timeline would stay empty.
                    runs[mode].append(runner.run(workloads.hvd_train_steps, steps=steps, allreduce_always=True))
                    if mode != "off":
                        sizes.append(os.path.getsize(path))
                        os.unlink(path)
                print(f"  timeline np={np_} rep {rep + 1}/{reps}: " + ", ".join(
                    f"{mode} {v[-1]:.1f}" for mode, v in runs.items()) + " steps/s", flush=True)
            results[str(np_)] = {**{mode: stats(v) for mode, v in runs.items()},
                                 "timeline MB": stats([b / 1e6 for b in sizes])}
    return results


def timeline_publishing_cpu(seconds=20.0, rate_mb_s=1.0, interval=5.0):
    """CPU that our side of the timeline uses, on its own: a writer appends Horovod-format events at
    ``rate_mb_s`` (1 MB/s is a heavy GPU model's timeline) while the real tail, channel, driver service
    and publisher (8 MiB live view to a local file) run in this process. Reported as CPU seconds per
    second of training: the share of one core taken from the ranks when no core is free."""
    import resource
    import threading

    from airflow_provider_hvd.runner import defaults
    from airflow_provider_hvd.runner.driver.service import DriverService
    from airflow_provider_hvd.runner.driver.timeline_publisher import TimelinePublisher
    from airflow_provider_hvd.runner.barrier.driver_link import DriverLink
    from airflow_provider_hvd.runner.wire import payload
    from airflow_provider_hvd.runner.wire.messages import Role

    event = (b'{"ph": "B", "name": "ALLREDUCE", "ts": 1000000, "pid": 7},'
             b'{"ph": "E", "ts": 1000007, "pid": 7, "args": {"dtype": "float32", "shape": "[1024]"}}')
    block = b",".join([event] * max(1, int(rate_mb_s * 1e6 / 10 / len(event))))  # 1/10 s of events
    writer_cpu = {}
    with tempfile.TemporaryDirectory() as tmp:
        source = f"{tmp}/rank0.json"
        stop = threading.Event()

        def write():  # as Horovod does: "]" after every write, overwritten by "," before the next
            t0 = time.thread_time()
            with open(source, "wb") as f:
                f.write(b"[\n" + block + b"]")
                f.flush()
                while not stop.wait(0.1):
                    f.seek(-1, os.SEEK_END)
                    f.write(b"," + block + b"]")
                    f.flush()
            writer_cpu["s"] = time.thread_time() - t0

        secret = payload.new_secret()
        publisher = TimelinePublisher(f"{tmp}/timeline.json", interval, defaults.TIMELINE_LIVE_BYTES)
        service = DriverService(secret, b"", lambda *a: None, host="127.0.0.1", on_timeline=publisher.add)
        link = DriverLink(("127.0.0.1", service.port), secret, {"role": Role.LAUNCHER, "rank": 0, "ranks": [0]})
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        writer = threading.Thread(target=write)
        link.ship_timeline(source, interval)
        writer.start()
        time.sleep(seconds)
        stop.set()
        writer.join()
        link.finish([])
        wall = time.perf_counter() - t0
        service.close()
        publisher.finish()
        after = resource.getrusage(resource.RUSAGE_SELF)
        size = os.path.getsize(f"{tmp}/timeline.json")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) - writer_cpu["s"]
    return {"seconds": wall, "MB written by the writer": size / 1e6, "live publishes": publisher.live_publishes,
            "CPU s per s": cpu / wall}


def init_cycles(reps, cycles=20):
    """hvd.init() + allreduce + shutdown, timed inside rank 0: the first cycle of a fresh process, and
    the median re-initialisation of ``cycles`` (gloo; MPI cannot re-initialise after its shutdown)."""
    from airflow_provider_hvd import HorovodRunner

    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    script = ("import sys; sys.path.insert(0, %r); import workloads; r = workloads.hvd_init_cycles(%%d)\n"
              "import os\nif os.environ.get('HOROVOD_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')) == '0': "
              "import json; print('CYCLES', json.dumps(r))" % str(HERE))
    runs = {"gloo": ({"launcher": "gloo"}, ["--gloo"], cycles), "mpi": ({"launcher": "mpi"}, ["--mpi"], 1)}
    if os.geteuid() == 0:
        runs["mpi"][1].append("--mpi-args=--allow-run-as-root")
    seen: dict[str, list[dict]] = {}
    for rep in range(reps):
        for launcher, (ours_args, bare_args, n) in runs.items():
            seen.setdefault(f"ours, {launcher}", []).append(
                HorovodRunner(np=2, log_sink=lambda *a: None, **ours_args).run(workloads.hvd_init_cycles, cycles=n))
            # Same threads as Spark gives our ranks (spark.task.cpus = 1).
            out = subprocess.run([horovodrun, "-np", "2", *bare_args, sys.executable, "-c", script % n],
                                 capture_output=True, text=True, check=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
            seen.setdefault(f"horovodrun, {launcher}", []).append(
                # rank 0's line only: mpirun may glue another rank's output onto it
                json.JSONDecoder().raw_decode(out.split("CYCLES", 1)[1].lstrip())[0])
        print(f"  init cycles rep {rep + 1}/{reps}: " + ", ".join(
            f"{k} {v[-1]['first_ms']:.0f}/{v[-1]['reinit_ms'] or 0:.0f} ms" for k, v in seen.items()), flush=True)
    return {name: {"first": stats([r["first_ms"] / 1000 for r in rs]),
                   "reinit": stats([r["reinit_ms"] / 1000 for r in rs]) if rs[0]["reinit_ms"] else None}
            for name, rs in seen.items()}


def size_scaling(reps, sizes_mb):
    import numpy

    from airflow_provider_hvd import HorovodRunner

    def run_with(blob):
        return HorovodRunner(np=2, launcher="gloo", log_sink=lambda *a: None).run(workloads.with_payload, blob=blob)

    payload, result = {}, {}
    for mb in sizes_mb:
        blob = numpy.random.default_rng(0).random(mb << 17)  # float64: mb MiB of array
        payload[mb] = stats([timed(lambda: run_with(blob)) for _ in range(reps)])
        result[mb] = stats([timed(lambda: HorovodRunner(np=2, launcher="gloo", log_sink=lambda *a: None).run(
            workloads.make_result, megabytes=mb)) for _ in range(reps)])
        print(f"  size {mb} MB: payload {payload[mb]['median']:.2f}s, result {result[mb]['median']:.2f}s", flush=True)
    return payload, result


def np_scaling_child(reps, nps):
    """Runs in its own process: np up to 8 needs local[8] (oversubscribed: fine for overhead)."""
    from pyspark.sql import SparkSession

    from airflow_provider_hvd import HorovodRunner

    spark = SparkSession.builder.master(f"local[{max(nps)}]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    HorovodRunner(np=2, launcher="gloo", log_sink=lambda *a: None).run(workloads.hvd_allreduce)
    out = {}
    for n in nps:
        out[n] = stats([timed(lambda: HorovodRunner(np=n, launcher="gloo", log_sink=lambda *a: None).run(
            workloads.hvd_allreduce)) for _ in range(reps)])
    spark.stop()
    print("NP_SCALING " + json.dumps(out))


def plot(results, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    launch = results["launch"]
    names = list(launch)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.barh(names, [launch[n]["median"] for n in names],
            xerr=[[launch[n]["median"] - launch[n]["min"] for n in names],
                  [launch[n]["max"] - launch[n]["median"] for n in names]], color="#4c72b0")
    ax.set_xlabel("seconds, whole run() of a 2-rank allreduce on local[2] (median, min-max)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out_dir / "bench-launch.png", dpi=110)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    nps = sorted(results["np_scaling"], key=int)
    a1.plot([int(n) for n in nps], [results["np_scaling"][n]["median"] for n in nps], "o-")
    a1.set_xlabel("np (ranks)")
    a1.set_ylabel("launch overhead, s")
    for key, label in (("payload", "payload captured"), ("result", "rank 0 result")):
        sizes = sorted(results[key], key=int)
        a2.plot([int(s) for s in sizes], [results[key][s]["median"] for s in sizes], "o-", label=label)
    a2.set_xscale("log")
    a2.set_xlabel("MB")
    a2.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "bench-scaling.png", dpi=110)
    plt.close(fig)


def row(name, s, ref=None):
    ratio = f"{s['median'] / ref:.2f}" if ref else ""
    return f"| {name} | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} | {ratio} |"


# Earlier runs' figures, so that a change's effect stays on record: (date, change, measured after, command).
HISTORY = [
    ("before 2026-12-02", "first version: Spark's allGather and a final barrier; horovod's RendezvousServer",
     "launch gloo 3.69 s (0.45), mpi 4.51 s (0.55), local 2.19 s (0.26); horovod.spark.run 8.27 s", "`make bench`"),
    ("2026-12-02", "tasks join the driver's roster over their channel (Spark's barrier calls poll in whole "
     "seconds); our rendezvous store polls every 50 ms (horovod's: 0.5 s)",
     "gloo 2.66 s (0.30), mpi 2.58 s (0.30), local 2.02 s (0.23); horovod.spark.run 8.75 s", "`make bench`"),
    ("2026-12-03", "the workers' import check; the driver's interpreter as the workers' default",
     "ratios 0.25, 0.24, 0.18 (the check: under 1 ms)", "`make bench`"),
    ("2026-12-03", "rendezvous proxy's owner check through netlink sock_diag (was a /proc/net/tcp scan)",
     "a gloo hvd.init() cycle 194 ms against horovodrun's 126 ms (1.54) before; the init table above after",
     "`bench/run.py --only init_cycles`"),
    ("2026-12-03", "runner/ regrouped by process; mpirun with rtc_hwloc_vmhole none",
     "A/B, 9 interleaved launches: gloo 3.03 s -> 2.83 s (0.93), mpi 3.24 s -> 3.10 s (0.96)",
     "`bench/run.py --only launch` on both commits"),
    ("2026-12-05", "a rank whose work is done skips the interpreter's teardown",
     "gloo 2.42 -> 1.61 s (0.19), mpi 2.50 -> 1.65 s (0.20), local 2.09 -> 1.33 s (0.16); last phase 0.5 -> 0.12 s",
     "`bench/run.py --only launch`"),
    ("2026-12-05", "a cluster-mode task ends on its driver's end record; slot wait looks every 0.1 s; "
     "executors no longer fetch the carrier jar", "operator task: cluster 0.52, deferrable 0.53",
     "`bench/run.py --only operator`"),
    ("2026-12-05", "tried, not kept: an AppCDS archive for the application's JVMs",
     "about 1 s per cluster-mode task, but Java 17 ignores it when Spark's conf folder comes first on the "
     "class path, as on every configured deployment", "one cluster-mode task by hand"),
    ("2026-12-06", "the operator no longer imports pyspark; the driver's first heartbeat from the shipper's thread",
     "cluster 0.51, deferrable 0.49; paired 0.47 (client), 0.47, 0.48", "`bench/run.py --only operator --reps 12`"),
    ("2026-12-06", "driver and worker daemon import the installed pyspark, not pyspark.zip; set-up compiles bytecode",
     "cluster 0.50, deferrable 0.54; paired 0.38 (client), 0.47, 0.47", "`bench/run.py --only operator`"),
    ("2026-12-06", "spark-submit's client exits in a thread of the hook's; rank 0's result read through one S3 client",
     "cluster 0.46, deferrable 0.48; paired 0.45, 0.47; client 0.39 (cluster), 0.31 (local[2])",
     "`bench/run.py --only operator --reps 16`"),
    ("2026-12-07", "message records declared (TaskInfo, DaemonDeath); wire/channel and the timeline publisher split",
     "A/B back to back on one machine, ratios gloo/mpi/local: before (fe96194) 0.27/0.25/0.19; after 0.24/0.23/0.19 "
     "and 0.22/0.23/0.16 (the table above is the second)", "`bench/run.py --only launch` on both commits"),
]


def history_lines():
    return ["## Before and after", "",
            "Each change that moved a figure above, with what its run measured (ratios to the table's peer).", "",
            "| date | change | measured after | command |", "| --- | --- | --- | --- |",
            *[f"| {date} | {change} | {after} | {command} |" for date, change, after, command in HISTORY], ""]


def by_hand_lines():
    """bench/by_hand.csv: figures measured outside this script, each with the command that measures it."""
    with open(REPO / "bench" / "by_hand.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return ["## Measured by hand", "",
            "Figures measured outside `make bench` (bench/by_hand.csv), each with its command.", "",
            "| date | measured | figure | command |", "| --- | --- | --- | --- |",
            *[f"| {r['date']} | {r['measured']} | {r['figure']} | {r['command']} |" for r in rows], ""]


def cycle_row(launcher, cycles):
    ours, bare = cycles[f"ours, {launcher}"], cycles[f"horovodrun, {launcher}"]
    cells = [launcher]
    for part in ("first", "reinit"):
        if ours[part] is None:
            cells += ["-", "-", "-"]
            continue
        cells += [f"{1e3 * ours[part]['median']:.0f}", f"{1e3 * bare[part]['median']:.0f}",
                  f"{ours[part]['median'] / bare[part]['median']:.2f}"]
    return "| " + " | ".join(cells) + " |"


def growth(series):
    """Seconds added per unit between the smallest and the largest point of a scaling series."""
    keys = sorted(series, key=int)
    lo, hi = keys[0], keys[-1]
    return (series[hi]["median"] - series[lo]["median"]) / (int(hi) - int(lo))


def timeline_section(timeline, cpu=None):
    if not timeline:
        return ["## The timeline's cost", "", "Not measured in this run (`bench/run.py --only timeline`).", ""]
    lines = [
        "## The timeline's cost",
        "",
        "Steps per second of the workload above with the Horovod Timeline off, recorded by Horovod's writer "
        "alone (our side idle until the end: no reads, no live view), and with our tail and live view as "
        "they run by default (reads and a live-view refresh every 5 s). np=1 leaves one of the two cores "
        "free; np=2 gives each core a rank. Interleaved repetitions.",
        "",
        "| np | timeline | median steps/s | min-max | ratio to off |",
        "| --- | --- | --- | --- | --- |",
    ]
    for np_, modes in timeline.items():
        off = modes["off"]["median"]
        lines += [f"| {np_} | {mode} | {s['median']:.1f} | {s['min']:.1f}-{s['max']:.1f} | {s['median'] / off:.3f} |"
                  for mode, s in modes.items() if mode != "timeline MB"]
    lines += ["", "| np | Horovod's writer: cost | our tail and live view: cost | timeline size MB |",
              "| --- | --- | --- | --- |"]
    for np_, modes in timeline.items():
        off, writer = modes["off"]["median"], modes["Horovod's writer only"]["median"]
        ours = modes["with our tail and live view (default)"]["median"]
        lines.append(f"| {np_} | {100 * (1 - writer / off):.1f}% | {100 * (1 - ours / writer):.1f}% | "
                     f"{modes['timeline MB']['median']:.0f} |")
    if cpu:
        lines += ["", f"Our part alone, measured by CPU time rather than by steps: with a writer appending "
                  f"{cpu['MB written by the writer'] / cpu['seconds']:.1f} MB/s of Horovod-format events "
                  f"(a heavy GPU model's timeline) for {cpu['seconds']:.0f} s, the tail, the channel, the driver "
                  f"service and the publisher ({cpu['live publishes']} live views of up to 8 MiB) used "
                  f"{1e3 * cpu['CPU s per s']:.1f} ms of CPU per second, {100 * cpu['CPU s per s']:.2f}% of one "
                  "core: that is all they can take from the ranks, free core or not."]
    lines += ["", *TIMELINE_EXPLAINED, ""]
    return lines


TIMELINE_EXPLAINED = [
    "What to expect, and why. Horovod's timeline writer (horovod/common/timeline.cc, `WriterLoop`) is a "
    "thread in rank 0 that never sleeps: it drains its queue and calls `std::this_thread::yield()` in a "
    "loop for as long as the timeline is on, so it keeps a core busy even when there is nothing to write. "
    "With a core to spare (np=1 here; on GPU nodes, any core the data loaders leave) that thread runs there "
    "and costs nothing measurable; when every core runs a rank, it takes time slices from rank 0, every step "
    "waits for rank 0 at the allreduce, and the whole job slows by tens of percent (np=2). That explains the "
    "spread measured before this split (2.6% on one day, 26-32% on others: the runs differed in what else "
    "competed for the two cores). Our part (the launcher reading what Horovod appended each interval, the "
    "driver appending it to its staging file, keeping the window and writing it once per interval) costs CPU "
    "in proportion to the rate of events, not to the length of the run: the CPU figure above. Its effect on "
    "steps per second is smaller than the spread between repetitions on this 2-core machine (the min-max "
    "columns), in either direction. So: leave a core free on rank 0's node for Horovod's writer, or record "
    "the timeline for profiling runs only; `timeline_live_bytes=0` removes the live view, not Horovod's "
    "writer, which is nearly all of the cost.",
]


def written_by(args, elapsed):
    today = time.strftime('%Y-%m-%d')
    if not args.only:
        return f"Written by `make bench` (`bench/run.py --reps {args.reps}`) on {today}, in {elapsed / 60:.1f} minutes."
    return (f"Measured again on {today} by `bench/run.py --only {args.only}`: {args.only.replace(',', ', ')} "
            f"({elapsed / 60:.1f} minutes); the others are from the last full `make bench` (docs/benchmarks.json).")


def rewrite_report(stored):
    """The report again from stored results, keeping its first line's account of when they were measured."""
    if not stored.exists():
        raise SystemExit("--report needs docs/benchmarks.json: run make bench first")
    md = REPO / "docs" / "benchmarks.md"
    first = md.read_text().split("\n")[2] if md.exists() else ""
    report(json.loads(stored.read_text()), None, 0.0, measured=first.split(" Medians with")[0] or None)


def report(results, args, elapsed, measured=None):
    import horovod
    import pyspark
    import torch

    launch = results["launch"]
    breakdown = results["breakdown"]
    peer = launch["horovod.spark.run (gloo)"]["median"]
    lines = [
        "# Benchmarks",
        "",
        (measured or written_by(args, elapsed)) + " Medians with min-max over interleaved repetitions; ratios to the peer "
        "named in each table. Numbers from one run on one machine: read the ratios, not the seconds.",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
        f"pyspark {pyspark.__version__}, horovod {horovod.__version__}, torch {torch.__version__}, no GPU.",
        "",
        "## Launch overhead: the whole `run()` of a trivial 2-rank allreduce, Spark `local[2]`, one session",
        "",
        "| runner | median s | min-max s | ratio to horovod.spark.run |",
        "| --- | --- | --- | --- |",
        *[row(n, s, peer) for n, s in launch.items()],
        "",
        f"Target: our barrier-mode launch at most half of horovod.spark.run's. Gloo: "
        f"{launch['ours, barrier, gloo']['median'] / peer:.2f}; mpi: {launch['ours, barrier, mpi']['median'] / peer:.2f}.",
        "",
        "![launch overhead](bench-launch.png)",
        "",
        "Where our time goes, from the runner's own log lines and the times the function itself "
        "recorded (medians, seconds):",
        "",
        "| phase | " + " | ".join(breakdown) + " |",
        "| --- |" + " --- |" * len(breakdown),
        *[f"| {phase} | " + " | ".join(f"{b[phase]['median']:.2f}" if phase in b else "-" for b in breakdown.values())
          + " |" for phase in BREAKDOWN_PHASES],
        "",
        "Importing torch and horovod in each fresh rank dominates; it is the user's own import and "
        "horovodrun pays it too.",
        "",
        "## The workers' import check",
        "",
        "Before a rank starts, every barrier task checks that its Python can import the runner, "
        f"horovod and what the function needs (here: {', '.join(results['import_check']['modules'])}), "
        "so that a worker without them fails the run in a second with the module's name. Its cost:",
        "",
        "| part | median ms | min-max ms |",
        "| --- | --- | --- |",
        *[f"| {name} | {s['median'] * 1e3:.2f} | {s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f} |"
          for name, s in results["import_check"].items() if name != "modules"],
        "",
        f"A run pays the driver scan once and each task's look-up in parallel: "
        f"{1e3 * (results['import_check']['driver scan of the call']['median'] + results['import_check']['task: find_spec of each module']['median']):.1f} ms, "
        "against the 0.2 s allowed (issue 13). The launch rows above include it.",
        "",
        "## Steady state: training steps per second (MLP of about 4 MB, batch 64, 2 ranks)",
        "",
        "Both with OMP_NUM_THREADS=1 (Spark gives our ranks spark.task.cpus threads; bare horovodrun "
        "gets the same by hand).",
        "",
        "| runner | median steps/s | min-max | ratio to bare horovodrun |",
        "| --- | --- | --- | --- |",
        *[row(n, s, results["steady"]["bare horovodrun -np 2"]["median"]) for n, s in results["steady"].items()],
        "",
        *timeline_section(results.get("timeline"), results.get("timeline_cpu")),
        "## Horovod (re-)initialisation: `hvd.init()` + one allreduce + `hvd.shutdown()`, timed in rank 0",
        "",
        "2 ranks, Spark `local[2]` for ours, OMP_NUM_THREADS=1 for all. *One cycle* is the first in a fresh "
        "process; *re-init* the median of the next 19 in the same process (gloo only: under MPI, horovod's "
        "shutdown finalizes MPI and a second init is impossible, for horovodrun too).",
        "",
        "| launcher | ours, one cycle ms | horovodrun, one cycle ms | ratio | ours, re-init ms | horovodrun, re-init ms | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[cycle_row(launcher, results["init_cycles"]) for launcher in ("gloo", "mpi")],
        "",
        "## Scaling of the launch overhead",
        "",
        "| np (local[8], oversubscribed on 2 cores) | median s | min-max s | ratio to np=1 |",
        "| --- | --- | --- | --- |",
        *[row(n, s, results["np_scaling"][min(results["np_scaling"], key=int)]["median"])
          for n, s in sorted(results["np_scaling"].items(), key=lambda kv: int(kv[0]))],
        "",
        "| MB captured by the function (payload) | median s | min-max s | ratio to smallest |",
        "| --- | --- | --- | --- |",
        *[row(n, s, results["payload"][min(results["payload"])]["median"]) for n, s in results["payload"].items()],
        "",
        "| MB returned by rank 0 | median s | min-max s | ratio to smallest |",
        "| --- | --- | --- | --- |",
        *[row(n, s, results["result"][min(results["result"])]["median"]) for n, s in results["result"].items()],
        "",
        f"How they grow: about {growth(results['np_scaling']):.2f} s per extra rank on local[8] (on 2 cores, "
        "so past np=2 the ranks' imports queue for CPU: this is the machine, not the protocol); "
        f"{1024 * growth(results['payload']):.1f} s per GB captured by the function (signed, sent to "
        f"every rank, verified, unpickled there); {1024 * growth(results['result']):.1f} s per GB returned "
        "by rank 0 (one copy, verified on the driver). Both are linear in size, and nothing is "
        "written to disk on the way.",
        "",
        "![scaling](bench-scaling.png)",
        "",
        *restarts.report_lines(results.get("preemption"), results.get("checkpoint")),
        *operator_task.report_lines(results.get("operator")),
        *encryption.report_lines(results.get("encryption"), launch["ours, barrier, gloo"]["median"],
                                 (results["payload"].get("1024") or results["payload"].get(1024) or {}).get("median")),
        *history_lines(),
        *by_hand_lines(),
    ]
    (REPO / "docs" / "benchmarks.md").write_text("\n".join(lines))


SECTIONS = ("launch", "import_check", "steady", "timeline", "init_cycles", "sizes", "np_scaling", "preemption",
            "checkpoint", "encryption", "operator")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", help="comma-separated sections to measure again (of: " + ", ".join(SECTIONS)
                        + "); the others are taken from docs/benchmarks.json and the report rewritten")
    parser.add_argument("--report", action="store_true",
                        help="rewrite docs/benchmarks.md from docs/benchmarks.json and bench/by_hand.csv, measuring nothing")
    parser.add_argument("--np-scaling-child", action="store_true")
    args = parser.parse_args()
    if args.np_scaling_child:
        np_scaling_child(max(2, args.reps // 2), [1, 2, 4, 8])
        return
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    if only - set(SECTIONS):
        parser.error(f"unknown sections {sorted(only - set(SECTIONS))}: choose from {', '.join(SECTIONS)}")
    stored = REPO / "docs" / "benchmarks.json"
    if args.only and not stored.exists():
        parser.error("--only needs the results of a full run in docs/benchmarks.json: run make bench first")
    if args.report:
        rewrite_report(stored)
        return
    results = json.loads(stored.read_text()) if args.only else {}
    t_start = time.perf_counter()
    from pyspark.sql import SparkSession

    phases = PhaseLog()
    logging.getLogger("airflow_provider_hvd.runner").addHandler(phases)
    logging.getLogger("airflow_provider_hvd.runner").setLevel(logging.INFO)
    spark = (SparkSession.builder.master("local[2]").appName("hvd-bench").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    if "launch" in only:
        print("launch overhead ...", flush=True)
        results["launch"], results["breakdown"] = launch_overhead(args.reps, phases)
    if "import_check" in only:
        print("import check ...", flush=True)
        results["import_check"] = import_check_cost(max(5, args.reps))
    if "steady" in only:
        print("steady state ...", flush=True)
        results["steady"] = steady_state(max(3, args.reps // 2), steps=1000)
    if "timeline" in only:
        print("timeline cost ...", flush=True)
        results["timeline"] = timeline_cost(max(3, args.reps // 2), {1: 3000, 2: 1000})
        results["timeline_cpu"] = timeline_publishing_cpu()
    if "init_cycles" in only:
        print("hvd.init() cycles ...", flush=True)
        results["init_cycles"] = init_cycles(max(3, args.reps // 2))
    if "sizes" in only:
        print("payload and result size ...", flush=True)
        results["payload"], results["result"] = size_scaling(max(2, args.reps // 2), [1, 16, 128, 1024])
    spark.stop()
    if "encryption" in only:
        print("channel encryption ...", flush=True)
        results["encryption"] = encryption.encryption_cost(max(3, args.reps // 2))
    if "operator" in only:
        print("the whole Airflow task ...", flush=True)
        results["operator"] = operator_task.operator_task_cost(max(3, args.reps // 2))
    if "preemption" in only:
        print("preemption (max_restarts) ...", flush=True)
        results["preemption"] = restarts.preemption_cost(max(3, args.reps // 2))
    if "checkpoint" in only:
        print("1 GiB checkpoint ...", flush=True)
        results["checkpoint"] = restarts.checkpoint_cost(max(3, args.reps // 2))
    if "np_scaling" in only:
        print("np scaling ...", flush=True)
        out = subprocess.run([sys.executable, __file__, "--np-scaling-child", "--reps", str(args.reps)],
                             capture_output=True, text=True, check=True).stdout
        results["np_scaling"] = json.loads(out.split("NP_SCALING ", 1)[1].splitlines()[0])
    (REPO / "docs").mkdir(exist_ok=True)
    stored.write_text(json.dumps(results, indent=1, default=str))
    plot(results, REPO / "docs")
    report(results, args, time.perf_counter() - t_start)
    print(f"wrote docs/benchmarks.md in {(time.perf_counter() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
