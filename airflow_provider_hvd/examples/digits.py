"""Digits (8x8 MNIST stand-in bundled with scikit-learn): data preparation, model, training, evaluation.

The training function follows Horovod's migration steps: hvd.init(); pin a GPU by
local rank when there is one; read this rank's shard; scale the learning rate by
hvd.size(); wrap the optimizer in DistributedOptimizer; broadcast the initial
state from rank 0; checkpoint on rank 0 only.
"""

from __future__ import annotations

import io
from typing import Callable

N_FEATURES = 64
N_CLASSES = 10


def prepare_digits(data_dir: str, np: int, mnist_path: str | None = None, seed: int = 0) -> dict:
    """Write ``test.npz`` and one ``train-shard-<r>-of-<np>.npz`` per rank under ``data_dir``.

    ``mnist_path``: an .npz with x_train/y_train/x_test/y_test (e.g. a real MNIST
    downloaded beforehand); images are flattened and scaled, any size works.
    """
    import fsspec
    import numpy

    if mnist_path:
        with fsspec.open(mnist_path, "rb") as f:
            data = numpy.load(io.BytesIO(f.read()))
            x_train, y_train, x_test, y_test = (data[k] for k in ("x_train", "y_train", "x_test", "y_test"))
        x_train = x_train.reshape(len(x_train), -1).astype("float32") / 255.0
        x_test = x_test.reshape(len(x_test), -1).astype("float32") / 255.0
    else:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x = (digits.data / 16.0).astype("float32")
        x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=seed,
                                                            stratify=digits.target)
    fs, base = fsspec.core.url_to_fs(data_dir)
    fs.makedirs(base, exist_ok=True)

    def write(name, **arrays):
        buffer = io.BytesIO()
        numpy.savez(buffer, **arrays)
        with fs.open(f"{base}/{name}", "wb") as f:
            f.write(buffer.getvalue())

    order = numpy.random.default_rng(seed).permutation(len(x_train))
    for rank in range(np):
        rows = order[rank::np]
        write(f"train-shard-{rank}-of-{np}.npz", x=x_train[rows], y=y_train[rows].astype("int64"))
    write("test.npz", x=x_test, y=y_test.astype("int64"))
    return {"data_dir": data_dir, "n_train": int(len(x_train)), "n_test": int(len(x_test)),
            "n_features": int(x_train.shape[1])}


def build_model(n_features: int = N_FEATURES):
    import torch

    return torch.nn.Sequential(torch.nn.Linear(n_features, 128), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(128, N_CLASSES))


def load_npz(url: str):
    import fsspec
    import numpy

    with fsspec.open(url, "rb") as f:
        data = numpy.load(io.BytesIO(f.read()))
        return data["x"], data["y"]


def train_digits(data_dir: str, epochs: int = 20, lr: float = 0.05, batch_size: int = 32,
                 checkpoint_every: int = 5) -> dict:
    """Runs on every rank. Returns rank 0's final metrics."""
    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import (checkpoint_dir, load_checkpoint, log_to_driver, restart_number,
                                      resume_checkpoint, resume_is_restart, save_checkpoint)

    hvd.init()
    device = torch.device("cpu")
    if torch.cuda.is_available():
        # One GPU per rank. When the runner pins each rank to its own GPU
        # (CUDA_VISIBLE_DEVICES), that GPU is device 0 of what the rank sees.
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(42)

    x, y = load_npz(f"{data_dir}/train-shard-{hvd.rank()}-of-{hvd.size()}.npz")
    x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    model = build_model(x.shape[1]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)

    start_epoch = 0
    end_epoch = epochs
    resume = resume_checkpoint()
    if resume:  # every rank reads it; broadcast below makes sure they agree
        state = load_checkpoint(resume)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = int(state["epoch"])
        # After a restart (max_restarts) the run carries on to the epoch it aimed at; a new run
        # resuming an earlier one's checkpoint (retraining) trains `epochs` more.
        end_epoch = int(state.get("end_epoch", start_epoch + epochs)) if resume_is_restart() else start_epoch + epochs
        log_to_driver(f"resumed from {resume} at epoch {start_epoch}"
                      + (f" (restart {restart_number()}, training to epoch {end_epoch})" if resume_is_restart() else ""))
    elif restart_number():
        log_to_driver(f"restart {restart_number()}: no checkpoint yet, training from epoch 0")

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    generator = torch.Generator().manual_seed(hvd.rank())
    loss_fn = torch.nn.CrossEntropyLoss()
    metrics = {}
    for epoch in range(start_epoch, end_epoch):
        model.train()
        order = torch.randperm(len(x), generator=generator)
        total, correct, loss_sum = 0, 0, 0.0
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            optimizer.zero_grad()
            out = model(x[idx])
            loss = loss_fn(out, y[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(idx)
            correct += (out.argmax(1) == y[idx]).sum().item()
            total += len(idx)
        # Metric averaging across ranks (what Keras' MetricAverageCallback does).
        avg = hvd.allreduce(torch.tensor([loss_sum / total, correct / total]), name="epoch_metrics")
        metrics = {"epoch": epoch + 1, "train_loss": round(avg[0].item(), 4), "train_accuracy": round(avg[1].item(), 4)}
        log_to_driver(f"epoch {epoch + 1}: loss {metrics['train_loss']:.4f} accuracy {metrics['train_accuracy']:.3f}")
        if (epoch + 1) % checkpoint_every == 0 or epoch + 1 == end_epoch:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                     "end_epoch": end_epoch}
            saved = save_checkpoint(state, checkpoint_dir(), step=epoch + 1)  # writes on rank 0 only
            if saved:
                log_to_driver(f"checkpoint {saved}")
    return metrics


def evaluate_and_check(evaluate: Callable[[str, str], dict], data_dir: str, checkpoint: str,
                       min_accuracy: float) -> dict:
    """The example DAGs' evaluate step, run by HorovodRunnerOperator(np=-1): on the training side,
    where torch (or TensorFlow) is, not on the Airflow worker. Fails below ``min_accuracy``.

    ``checkpoint``: a checkpoint, or a folder of them (its newest is evaluated)."""
    from airflow_provider_hvd.runner.checkpoint import checkpoint_step, latest_checkpoint

    try:
        checkpoint_step(checkpoint)
    except ValueError:
        newest = latest_checkpoint(checkpoint)
        if newest is None:
            raise ValueError(f"no checkpoint under {checkpoint}: did training write one (save_checkpoint)?")
        checkpoint = newest
    result = evaluate(data_dir, checkpoint)
    print(f"test accuracy {result['test_accuracy']:.4f} after {result['epoch']} epochs "
          f"({result['n_test']} test images) of {checkpoint}", flush=True)
    if result["test_accuracy"] < float(min_accuracy):
        raise ValueError(f"test accuracy {result['test_accuracy']} is below {min_accuracy}")
    return result


def evaluate_digits(data_dir: str, checkpoint: str) -> dict:
    import torch

    from airflow_provider_hvd import load_checkpoint

    x, y = load_npz(f"{data_dir}/test.npz")
    model = build_model(x.shape[1])
    state = load_checkpoint(checkpoint)
    model.load_state_dict(state["model"])
    model.eval()
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).float().mean().item()
    return {"test_accuracy": round(accuracy, 4), "epoch": int(state["epoch"]), "n_test": int(len(y))}
