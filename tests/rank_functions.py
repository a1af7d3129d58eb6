"""Training functions the tests send to ranks.

conftest.py registers this module for pickling by value, as a notebook's
functions are: the ranks' interpreters cannot import the tests folder.
"""

import os
import signal
import time

from airflow_provider_hvd import log_to_driver


def allreduce_info(x=None):
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    log_to_driver(f"rank {hvd.rank()} of {hvd.size()} sum {total}")
    info = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
            "host": os.environ.get("HOROVOD_HOSTNAME"), "sum": total, "x": x,
            "parent": __import__("psutil").Process().parent().name()}
    # Every rank's view, so the driver can check all of them, not only rank 0's.
    return {"rank0": info, "all": hvd.allgather_object(info)}


def checkpoint_on_every_rank(directory):
    """Every rank asks for checkpoint 1; what each rank was told (its rank, the URL or None)."""
    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import save_checkpoint
    from airflow_provider_hvd.runner.rank.context import current_rank

    hvd.init()
    saved = save_checkpoint({"w": torch.ones(2)}, directory, step=1)
    return hvd.allgather_object({"rank": hvd.rank(), "current_rank": current_rank(), "saved": saved})


def fail_on_rank(bad_rank, message="boom"):
    import horovod.torch as hvd
    import torch

    hvd.init()
    print(f"rank {hvd.rank()} is about to {'fail' if hvd.rank() == bad_rank else 'wait'}", flush=True)
    if hvd.rank() == bad_rank:
        raise ValueError(message)
    # The others block in a collective that the failed rank never joins.
    hvd.allreduce(torch.ones(1), name="never-completes")
    time.sleep(600)


def kill_rank(bad_rank):
    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == bad_rank:
        print("last words before SIGKILL", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(torch.ones(1), name="never-completes")
    time.sleep(600)


def big_result(megabytes):
    import hashlib

    import horovod.torch as hvd

    hvd.init()
    data = (bytes(range(256)) * (megabytes * 4096))[: megabytes << 20]
    return {"sha256": hashlib.sha256(data).hexdigest(), "data": data} if hvd.rank() == 0 else None


def uses_module_it_did_not_import():
    return torch.ones(1)  # noqa: F821 - the mistake under test: torch imported outside the function


def uses_tensorflow():
    import tensorflow as tf

    return tf.__version__


def echo_env(name):
    return os.environ.get(name)


def chatty():
    import horovod.torch as hvd

    hvd.init()
    print(f"stdout line from rank {hvd.rank()}", flush=True)
    log_to_driver(f"callback line from rank {hvd.rank()}")
    return hvd.rank()


def train_linear(steps=40, lr=0.1):
    """A real 2-rank data-parallel training: each rank sees its own shard of y = 3x - 2."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # different init per rank: broadcast must fix it
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    gen = torch.Generator().manual_seed(100 + hvd.rank())
    x = torch.randn(256, 4, generator=gen)
    y = x @ torch.tensor([[3.0], [-2.0], [0.5], [1.0]]) - 2.0
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
        if step % 10 == 0:
            log_to_driver(f"step {step} loss {losses[-1]:.4f}")
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    return {"losses": losses, "weights_by_rank": hvd.allgather_object(weights)}


def allreduce_steps(steps, pause=0.05, fail_at=None):
    import horovod.torch as hvd
    import torch

    hvd.init()
    for step in range(steps):
        hvd.allreduce(torch.ones(256), name="grad")
        if fail_at is not None and step == fail_at and hvd.rank() == 0:
            raise RuntimeError(f"diverged at step {step}")
        time.sleep(pause)
    return steps


def train_until_killed(marker_dir, steps=100000):
    """A training loop that says where it is: each rank writes its pid and host to
    <marker_dir>/rank-<r>.pid once training runs, and prints one line per step, so a test can
    kill it (or its executor) mid-training. The host is the executor's address (SPARK_LOCAL_IP,
    inherited through the barrier task, also by mpi ranks under a daemonized orted)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    for step in range(steps):
        hvd.allreduce(torch.ones(4), name="grad")
        print(f"rank {hvd.rank()} step {step}", flush=True)
        if step == 3:
            with open(os.path.join(marker_dir, f"rank-{hvd.rank()}.pid.tmp"), "w") as f:
                host = os.environ.get("SPARK_LOCAL_IP") or os.environ.get("HOROVOD_HOSTNAME") or ""
                f.write(f"{os.getpid()}\n{host}\n")
            os.replace(os.path.join(marker_dir, f"rank-{hvd.rank()}.pid.tmp"),
                       os.path.join(marker_dir, f"rank-{hvd.rank()}.pid"))
        time.sleep(0.05)
    return hvd.rank()


def stall_on_rank(stalled_rank, seconds=600):
    """One rank never joins the collective the others wait in (a hang, for the stall check)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == stalled_rank:
        print(f"rank {hvd.rank()} hangs", flush=True)
        time.sleep(seconds)
    hvd.allreduce(torch.ones(1), name="grad.w")
    return hvd.rank()


def never_returns_on_rank(stuck_rank):
    """One rank keeps working without collectives after the others returned."""
    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == stuck_rank:
        time.sleep(600)
    return hvd.rank()


def checkpoint_then_big_checkpoint(directory, marker_dir, megabytes):
    """Rank 0 saves a small checkpoint 1, then a large checkpoint 2 (slow to write); the other
    ranks keep training. Marks when checkpoint 2's write begins."""
    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import save_checkpoint

    hvd.init()
    if hvd.rank() == 0:
        save_checkpoint({"step": 1, "w": torch.full((4,), 1.0)}, directory, step=1)
        state = {"step": 2, "w": torch.full((megabytes << 18,), 2.0)}  # float32: megabytes MiB
        open(os.path.join(marker_dir, "writing"), "w").close()
        save_checkpoint(state, directory, step=2)
    else:
        with open(os.path.join(marker_dir, f"rank-{hvd.rank()}.pid"), "w") as f:
            f.write(str(os.getpid()))
    hvd.allreduce(torch.ones(1), name="after-checkpoint")
    time.sleep(600)


def handle_map_while_pending():
    """What horovod.torch.mpi_ops._handle_map shows around one collective (tests/test_private_apis.py)."""
    import horovod.torch as hvd
    import torch
    from horovod.torch import mpi_ops

    hvd.init()
    handle = hvd.allreduce_async(torch.ones(3), name="pending")
    seen = {"is_dict": isinstance(getattr(mpi_ops, "_handle_map", None), dict),
            "pending_listed": handle in getattr(mpi_ops, "_handle_map", {})}
    hvd.synchronize(handle)
    seen["done_removed"] = handle not in getattr(mpi_ops, "_handle_map", {handle: None})
    hvd.shutdown()
    return seen


def rank_environment():
    """Every rank's environment names and PYTHONPATH (tests/test_runner_barrier.py)."""
    import horovod.torch as hvd

    hvd.init()
    mine = {"names": sorted(os.environ), "pythonpath": os.environ.get("PYTHONPATH", "")}
    return hvd.allgather_object(mine)


def reinit_with_process_sets(cycles=3, reinit=True):
    """Horovod re-initialised ``cycles`` times, each time with a process set per rank, checking a
    global and a per-set allreduce every time. ``reinit=False`` (MPI, whose shutdown finalizes MPI):
    one init, process sets added and removed ``cycles`` times instead. Rank 0's view is returned."""
    import horovod.torch as hvd
    import torch

    seen = []
    if not reinit:
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        hvd.init()
    for cycle in range(cycles):
        if reinit:
            sets = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
            hvd.init(process_sets=sets)
        else:
            sets = [hvd.add_process_set([0]), hvd.add_process_set([1])]
        mine = sets[hvd.rank()]
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1 + cycle)]), op=hvd.Sum).item()
        alone = hvd.allreduce(torch.tensor([float(hvd.rank() + 10)]), op=hvd.Sum, process_set=mine).item()
        expected = (3.0 + 2 * cycle, float(hvd.rank() + 10), 1)
        if (total, alone, mine.size()) != expected:
            raise AssertionError(f"cycle {cycle}: got {(total, alone, mine.size())}, expected {expected}")
        seen.append([hvd.size(), total, alone])
        # Every rank done with its own set before any shuts down: shutdown reaches all ranks, and
        # would cut short a peer's set collective (horovodrun shows the same race).
        hvd.allreduce(torch.zeros(1), name=f"cycle-{cycle}-done")
        if reinit:
            hvd.shutdown()
        else:
            for s in sets:
                hvd.remove_process_set(s)
    if not reinit:
        hvd.shutdown()
    return seen


def steps_with_restarts(steps, kill_on_attempts=(0,), kill_rank=1, kill_at=None, how="signal",
                        partial_write=False):
    """Count `steps` allreduce steps, saving a checkpoint of the step counter on rank 0 after each,
    resuming from `resume_checkpoint()`. On the attempts in `kill_on_attempts`, rank `kill_rank`
    fails at step `kill_at` (default: halfway): `how="signal"` SIGKILLs itself (a preemption),
    `"raise"` raises, `"exit"` exits with code 3. `partial_write`: rank 0 first leaves a torn
    temporary checkpoint file (what a rank killed mid-write leaves). Returns what rank 0 saw."""
    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import (checkpoint_dir, load_checkpoint, restart_number, resume_checkpoint,
                                      resume_is_restart, save_checkpoint)
    from airflow_provider_hvd.runner.common.storage import tmp_name

    hvd.init()
    attempt = restart_number()
    resume = resume_checkpoint()
    start = int(load_checkpoint(resume)["step"]) if resume else 0
    kill_at = steps // 2 if kill_at is None else kill_at
    if attempt in kill_on_attempts and hvd.rank() == kill_rank and kill_at == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # before this attempt wrote anything
    for step in range(start, steps):
        hvd.allreduce(torch.ones(2), name="grad")
        if hvd.rank() == 0:
            save_checkpoint({"step": step + 1}, checkpoint_dir(), step=step + 1)
        hvd.allreduce(torch.ones(1), name="saved")  # every rank knows the checkpoint is there
        if attempt in kill_on_attempts and hvd.rank() == kill_rank and step + 1 == kill_at:
            if partial_write:
                with open(os.path.join(checkpoint_dir(), tmp_name("ckpt-torn.pt", os.environ["HVD_RUN_ID"])),
                          "wb") as f:
                    f.write(b"torn")
            print(f"rank {hvd.rank()} fails at step {step + 1} of attempt {attempt} ({how})", flush=True)
            if how == "signal":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "exit":
                os._exit(3)
            raise RuntimeError(f"user code failed at step {step + 1}")
    return {"attempt": attempt, "resumed_from": resume, "resume_is_restart": resume_is_restart(),
            "started_at": start, "steps": steps}


def digits_marking_attempts(marker_dir, **train_kwargs):
    """The digits example's training, each rank first writing <marker_dir>/attempt-<n>-rank-<r>.pid
    (pid, host) so that a test can find the executor holding a rank in each attempt."""
    import horovod.torch as hvd

    from airflow_provider_hvd import restart_number
    from airflow_provider_hvd.examples.digits import train_digits

    hvd.init()  # train_digits' own hvd.init() is then a no-op
    name = os.path.join(marker_dir, f"attempt-{restart_number()}-rank-{hvd.rank()}.pid")
    with open(name + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n{os.environ.get('SPARK_LOCAL_IP') or os.environ.get('HOROVOD_HOSTNAME') or ''}\n")
    os.replace(name + ".tmp", name)
    return train_digits(**train_kwargs)


def tqdm_bar(steps=60, step_s=0.05):
    """A real tqdm bar redrawn at every step (mininterval=0), on stderr as tqdm draws it."""
    import time

    from tqdm import tqdm

    for _ in tqdm(range(steps), desc="train", mininterval=0, ascii=True):
        time.sleep(step_s)
    print("bar done", flush=True)
    return steps


def leaves_work_behind(directory):
    """Returns with a file it never closed (kept alive by a module, as a leaked handle is) and a
    non-daemon thread that writes a file after the function returned: both must be complete once
    run() has returned, as at a normal interpreter exit."""
    import os
    import sys
    import threading
    import time

    import horovod.torch as hvd

    hvd.init()
    rank = hvd.rank()
    leaked = open(os.path.join(directory, f"unclosed-{rank}.txt"), "w")
    leaked.write("written, never flushed or closed\n" * 100)
    sys.modules["os"].__dict__.setdefault("_hvd_test_leaked_files", []).append(leaked)

    def later():
        time.sleep(0.5)
        with open(os.path.join(directory, f"thread-{rank}.txt"), "w") as f:
            f.write("written by a thread after the function returned")

    threading.Thread(target=later, name="uploader").start()
    return rank
