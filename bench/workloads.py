"""The functions every runner in the benchmark runs (pickled by value: executors do not have bench/)."""

import time


def hvd_allreduce():
    """A trivial 2-rank allreduce; returns (value, wall-clock times when the function was entered,
    when hvd.init() returned, when the allreduce returned) for the launch breakdown."""
    t_enter = time.time()
    import horovod.torch as hvd
    import torch

    hvd.init()
    t_init = time.time()
    value = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    return value, t_enter, t_init, time.time()


def torch_allreduce():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    value = t.item()
    dist.destroy_process_group()
    return value


def hvd_train_steps(steps, warmup=5, width=1024, allreduce_always=False):
    """Steps/s of a fixed MLP (about 4 MB of float32 parameters) on synthetic data.

    ``allreduce_always``: average the gradients with explicit allreduces, which Horovod runs (and its
    timeline records) even with one rank; DistributedOptimizer skips them when hvd.size() == 1.
    """
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    opt = sgd if allreduce_always else hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(64, width), torch.randint(0, 10, (64,))
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if allreduce_always:
            handles = [hvd.allreduce_async_(p.grad, op=hvd.Average, name=f"grad.{n}")
                       for n, p in model.named_parameters()]
            for h in handles:
                hvd.synchronize(h)
        opt.step()
    return steps / (time.perf_counter() - t0)


def with_payload(blob):
    import horovod.torch as hvd

    hvd.init()
    return int(blob.nbytes)


def make_result(megabytes):
    import horovod.torch as hvd

    hvd.init()
    return b"x" * (megabytes << 20) if hvd.rank() == 0 else None


def hvd_init_cycles(cycles):
    """``cycles`` rounds of hvd.init() + one allreduce + hvd.shutdown(), timed inside the rank (ms).
    The first is what one init costs in a fresh process; the rest re-initialise (gloo only: under
    MPI horovod's shutdown finalizes MPI, so pass cycles=1 there)."""
    import statistics

    import horovod.torch as hvd
    import torch

    times = []
    for _ in range(cycles):
        t0 = time.perf_counter()
        hvd.init()
        hvd.allreduce(torch.ones(4), name="cycle")
        hvd.shutdown()
        times.append(1000 * (time.perf_counter() - t0))
    return {"first_ms": times[0], "reinit_ms": statistics.median(times[1:]) if cycles > 1 else None}


def steps_with_checkpoints(steps, step_s, checkpoint_every, marker_dir):
    """A training loop of fixed-time steps that checkpoints on rank 0 and resumes after a restart.
    Rank 0 records, per attempt, when it was ready to train (after hvd.init and the resume) and
    from which step; it keeps its current step in <marker_dir>/progress; rank 1 marks its pid."""
    import json
    import os

    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import checkpoint_dir, load_checkpoint, restart_number, resume_checkpoint, save_checkpoint

    hvd.init()
    resume = resume_checkpoint()
    start = int(load_checkpoint(resume)["step"]) if resume else 0
    hvd.allreduce(torch.ones(1), name="ready")
    attempt = restart_number()
    if hvd.rank() == 0:
        with open(os.path.join(marker_dir, f"attempt-{attempt}.json"), "w") as f:
            json.dump({"t_ready": time.time(), "start_step": start}, f)
    else:
        with open(os.path.join(marker_dir, f"attempt-{attempt}-rank-{hvd.rank()}.pid"), "w") as f:
            f.write(str(os.getpid()))
    for step in range(start, steps):
        time.sleep(step_s)
        hvd.allreduce(torch.ones(16), name="grad")
        if hvd.rank() == 0:
            if (step + 1) % checkpoint_every == 0:
                save_checkpoint({"step": step + 1, "w": torch.zeros(1 << 16)}, checkpoint_dir(), step=step + 1)
            with open(os.path.join(marker_dir, "progress.tmp"), "w") as f:
                f.write(f"{attempt} {step + 1}")
            os.replace(os.path.join(marker_dir, "progress.tmp"), os.path.join(marker_dir, "progress"))
    return {"attempt": attempt, "t_end": time.time()}
