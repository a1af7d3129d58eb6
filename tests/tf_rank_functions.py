"""Training functions for tests/test_tensorflow.py (the TensorFlow flavour); shipped by value like rank_functions."""

import os

N, FEATURES, LR = 16, 4, 0.1


def rank_data(rank):
    """Each rank's own batch: different data, so un-averaged training would drift apart."""
    import numpy as np

    rng = np.random.default_rng(100 + rank)
    return (rng.normal(size=(N, FEATURES)).astype("float32"),
            rng.normal(loc=rank * 3.0, size=(N, 1)).astype("float32"))


def keras_weights_per_step(steps=4):
    """tf.keras linear model, SGD, one full batch per step; every rank's weights after each step."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    x, y = rank_data(hvd.rank())
    tf.keras.utils.set_random_seed(7)  # same start everywhere, so each step has one exact reference
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1)])
    initial = [w.tolist() for w in model.get_weights()]
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LR)), loss="mse")
    after = []

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            after.append([w.tolist() for w in self.model.get_weights()])

    model.fit(x, y, batch_size=N, epochs=steps, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Record()])
    mine = {"rank": hvd.rank(), "keras": type(model).__module__.split(".")[0], "initial": initial, "after": after,
            "legacy_env": os.environ.get("TF_USE_LEGACY_KERAS")}
    return hvd_tf.allgather_object(mine)


def keras3_distributed_optimizer(use_tf_keras):
    """A Keras 3 optimizer handed to hvd.DistributedOptimizer: `import keras`, or tf.keras
    when the user's env sets TF_USE_LEGACY_KERAS=0."""
    import horovod.tensorflow.keras as hvd

    if use_tf_keras:
        import tensorflow as tf
        keras = tf.keras
    else:
        import keras
    hvd.init()
    return hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
