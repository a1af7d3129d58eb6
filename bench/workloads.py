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
