"""The TensorFlow flavour: horovod's TF plugin, Keras gradients really averaged, the Keras example DAG.

Runs in the TensorFlow flavour of the environment: ``make test-tensorflow`` (.venv-tf,
``HVD_FLAVOUR=tensorflow``); ``make test`` deselects these (marker ``tensorflow``).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import tf_rank_functions as tfr
from test_airflow_layer import assert_digits_dag_trains

from airflow_provider_hvd import HorovodRunner
from airflow_provider_hvd.runner.errors import RankFailedError
from airflow_provider_hvd.runner.rank.stall import TENSORFLOW_NOT_WATCHED

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from check_env import horovod_build  # noqa: E402

pytestmark = pytest.mark.tensorflow


def test_horovod_has_its_tensorflow_plugin_next_to_pytorchs():
    enabled, out = horovod_build()
    assert {"TensorFlow", "PyTorch", "MPI", "Gloo"} <= enabled, out


def reference_weights(initial, steps):
    """Plain numpy SGD on the linear model with the gradient averaged over both ranks' batches."""
    w, b = np.array(initial[0], dtype=np.float64), np.array(initial[1], dtype=np.float64)
    data = [tfr.rank_data(r) for r in (0, 1)]
    out = []
    for _ in range(steps):
        grads_w, grads_b = [], []
        for x, y in data:
            residual = x @ w + b - y  # d(mean squared error)/d(prediction) = 2 * residual / N
            grads_w.append(2 * x.T @ residual / tfr.N)
            grads_b.append(2 * residual.sum(axis=0) / tfr.N)
        w, b = w - tfr.LR * np.mean(grads_w, axis=0), b - tfr.LR * np.mean(grads_b, axis=0)
        out.append((w.copy(), b.copy()))
    return out


@pytest.mark.parametrize("mode, launcher", [("local", "gloo"), ("local", "mpi"), ("barrier", "gloo"),
                                            ("barrier", "mpi")])
def test_keras_gradients_are_averaged_so_ranks_keep_identical_weights(request, mode, launcher, no_leftovers):
    if mode == "barrier":
        request.getfixturevalue("spark_local2")
    steps = 4
    lines = []
    ranks = HorovodRunner(np=-2 if mode == "local" else 2, launcher=launcher,
                          log_sink=lambda *line: lines.append(line)).run(tfr.keras_weights_per_step, steps=steps)
    by_rank = {r["rank"]: r for r in ranks}
    # stall_timeout cannot watch TF's collectives, and the log says so (once, rank 0).
    assert [line for _, _, line in lines if line == TENSORFLOW_NOT_WATCHED] == [TENSORFLOW_NOT_WATCHED]
    # Keras 2 (tf-keras) without the user asking: the runner set TF_USE_LEGACY_KERAS=1.
    assert [(by_rank[r]["keras"], by_rank[r]["legacy_env"]) for r in (0, 1)] == [("tf_keras", "1")] * 2
    assert len(by_rank[0]["after"]) == steps
    expected = reference_weights(by_rank[0]["initial"], steps)
    for step in range(steps):
        w0, b0 = (np.array(v) for v in by_rank[0]["after"][step])
        w1, b1 = (np.array(v) for v in by_rank[1]["after"][step])
        # Identical on both ranks after every step, though each rank saw different data ...
        assert np.array_equal(w0, w1) and np.array_equal(b0, b1), f"ranks differ after step {step + 1}"
        # ... and equal to SGD on the average of both ranks' gradients.
        np.testing.assert_allclose(w0, expected[step][0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b0, expected[step][1], rtol=1e-4, atol=1e-5)
    # Rank 1's data pulls the bias up (its targets are centred on 3): averaging is visible.
    assert expected[-1][1][0] > 0.5


@pytest.mark.parametrize("how, env", [("import keras", {}), ("tf.keras", {"TF_USE_LEGACY_KERAS": "0"})])
def test_a_keras3_optimizer_is_refused_instead_of_silently_not_averaged(how, env, no_leftovers):
    with pytest.raises(RankFailedError, match="Keras3OptimizerError: hvd.DistributedOptimizer got a Keras 3 "
                                              "optimizer") as info:
        HorovodRunner(np=-2, env=env).run(tfr.keras3_distributed_optimizer, use_tf_keras=how == "tf.keras")
    assert "TF_USE_LEGACY_KERAS=1" in str(info.value)


def test_tensorflow_mnist_dag_trains_end_to_end(airflow, no_leftovers):
    accuracy = assert_digits_dag_trains(airflow, "hvd_mnist_tensorflow")
    print(f"hvd_mnist_tensorflow: test accuracy {accuracy} after 12 epochs")
