"""Digits with TensorFlow/Keras: the Keras twin of digits.py (same data, same shards).

HorovodRunner's best-known example is TensorFlow on MNIST; this follows Horovod's
Keras migration steps: hvd.init(); pin a GPU by local rank; read this rank's shard;
scale the learning rate by hvd.size(); wrap the optimizer in DistributedOptimizer;
broadcast the initial variables from rank 0; average metrics across ranks;
checkpoint on rank 0 only.

Keras here is ``tf.keras`` with tf-keras (Keras 2), which every rank gets through
TF_USE_LEGACY_KERAS=1 (runner/rank/keras_guard.py): horovod's DistributedOptimizer does
not average gradients under Keras 3. Needs the TensorFlow flavour of the set-up
(``HVD_FLAVOUR=tensorflow scripts/setup.sh``).
"""

from __future__ import annotations

from airflow_provider_hvd.examples.digits import N_CLASSES, load_npz


def build_model(n_features: int):
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input(shape=(n_features,)),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.1),
        tf.keras.layers.Dense(N_CLASSES),
    ])


def _to_checkpoint(model, epoch: int, end_epoch: int) -> dict:
    # save_checkpoint's format is torch's weights-only pickle (safe to load, one reader for
    # both examples and the sensor), so the Keras weights travel as tensors.
    import torch

    return {"weights": [torch.from_numpy(w.copy()) for w in model.get_weights()], "epoch": epoch,
            "end_epoch": end_epoch}


def train_digits_keras(data_dir: str, epochs: int = 20, lr: float = 0.05, batch_size: int = 32,
                       checkpoint_every: int = 5) -> dict:
    """Runs on every rank. Returns rank 0's final metrics (averaged over ranks)."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from airflow_provider_hvd import (checkpoint_dir, load_checkpoint, log_to_driver, resume_checkpoint,
                                      resume_is_restart, save_checkpoint)

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        # One GPU per rank. When the runner pins each rank to its own GPU
        # (CUDA_VISIBLE_DEVICES), that GPU is the only one the rank sees.
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    tf.keras.utils.set_random_seed(42)

    x, y = load_npz(f"{data_dir}/train-shard-{hvd.rank()}-of-{hvd.size()}.npz")
    # Every rank must run the same number of steps (each step is an allreduce): train on
    # as many rows as the smallest shard has.
    rows = int(hvd_tf.allreduce(tf.constant(len(x)), op=hvd_tf.Min, name="min_shard_rows"))
    x, y = x[:rows], y[:rows]

    model = build_model(x.shape[1])
    start_epoch = 0
    end_epoch = epochs
    resume = resume_checkpoint()
    if resume:  # rank 0's copy wins through the broadcast below
        state = load_checkpoint(resume)
        model.set_weights([w.numpy() for w in state["weights"]])
        start_epoch = int(state["epoch"])
        # A restart (max_restarts) carries on to the run's goal; a new run trains `epochs` more.
        end_epoch = int(state.get("end_epoch", start_epoch + epochs)) if resume_is_restart() else start_epoch + epochs
        log_to_driver(f"resumed from {resume} at epoch {start_epoch}, training to epoch {end_epoch}")

    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    class Progress(tf.keras.callbacks.Callback):
        """After MetricAverageCallback: logs hold the averages over all ranks."""

        def __init__(self):
            super().__init__()
            self.metrics: dict = {}

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            self.metrics = {"epoch": epoch + 1, "train_loss": round(float(logs["loss"]), 4),
                            "train_accuracy": round(float(logs["accuracy"]), 4)}
            log_to_driver(f"epoch {epoch + 1}: loss {self.metrics['train_loss']:.4f} "
                          f"accuracy {self.metrics['train_accuracy']:.3f}")
            if (epoch + 1) % checkpoint_every == 0 or epoch + 1 == end_epoch:
                saved = save_checkpoint(_to_checkpoint(self.model, epoch + 1, end_epoch), checkpoint_dir(),
                                        step=epoch + 1)  # writes on rank 0 only
                if saved:
                    log_to_driver(f"checkpoint {saved}")

    progress = Progress()
    model.fit(x, y, batch_size=batch_size, initial_epoch=start_epoch, epochs=end_epoch, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(), progress])
    return progress.metrics


def evaluate_digits_keras(data_dir: str, checkpoint: str) -> dict:
    import numpy

    from airflow_provider_hvd import load_checkpoint

    x, y = load_npz(f"{data_dir}/test.npz")
    state = load_checkpoint(checkpoint)
    model = build_model(x.shape[1])
    model.set_weights([w.numpy() for w in state["weights"]])
    predicted = numpy.argmax(model.predict(x, verbose=0), axis=1)
    return {"test_accuracy": round(float((predicted == y).mean()), 4), "epoch": int(state["epoch"]),
            "n_test": int(len(y))}
