"""Keep horovod.tensorflow.keras on Keras 2, and make Keras 3 fail loudly instead of silently.

horovod 0.28.1's ``hvd.DistributedOptimizer`` averages gradients by overriding the
Keras 2 optimizer methods that ``fit()`` calls. Keras 3 (the ``keras`` TensorFlow
2.16+ installs) applies gradients through ``optimizer.apply()``, which the wrapper
does not override: every rank then trains on its own gradients, the models drift
apart, and nothing raises (docs/tensorflow.md). What the ranks do about it:

* ``prefer_legacy_keras``: where tf-keras (Keras 2) is installed, ``tf.keras`` is made
  to mean it (``TF_USE_LEGACY_KERAS=1``) unless the user's env already says otherwise.
  It must happen before TensorFlow is imported, so before the payload is unpickled.
* once ``horovod._keras`` is imported (by horovod.tensorflow.keras), its
  ``create_distributed_optimizer`` refuses a Keras 3 optimizer with the fix in the message;
* once ``horovod.tensorflow.keras`` (and its callbacks) are imported, their backend ``K``
  is ``tf.keras.backend``: horovod takes ``keras.backend``, which is Keras 3's even when
  tf.keras is tf-keras, and MetricAverageCallback then fails on ``K.constant``.

Import hooks rather than imports: importing horovod's Keras modules imports TensorFlow,
seconds that PyTorch ranks should not pay.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
_HOROVOD_KERAS = "horovod._keras"


class Keras3OptimizerError(TypeError):
    pass


def prefer_legacy_keras() -> None:
    if LEGACY_KERAS_ENV not in os.environ and importlib.util.find_spec("tf_keras") is not None:
        os.environ[LEGACY_KERAS_ENV] = "1"


def _is_keras3(optimizer) -> bool:
    if type(optimizer).__module__.split(".")[0] != "keras":
        return False  # tf_keras.* (Keras 2) or a plain TensorFlow optimizer
    keras = sys.modules.get("keras")
    return int(str(getattr(keras, "__version__", "3")).split(".")[0]) >= 3


def _guarded(create):
    @functools.wraps(create)
    def create_distributed_optimizer(keras, optimizer, *args, **kwargs):
        if _is_keras3(optimizer):
            raise Keras3OptimizerError(
                f"hvd.DistributedOptimizer got a Keras 3 optimizer ({type(optimizer).__module__}."
                f"{type(optimizer).__name__}); horovod 0.28.1 cannot average its gradients (Keras 3's fit() "
                "bypasses the wrapper and every rank would silently train on its own gradients). Build the "
                "model and optimizer with tf.keras (Keras 2 from the tf-keras package, which the runner "
                f"selects with {LEGACY_KERAS_ENV}=1) instead of `import keras`; the TensorFlow flavour of "
                "scripts/setup.sh installs tf-keras.")
        return create(keras, optimizer, *args, **kwargs)

    return create_distributed_optimizer


def _guard_optimizer(module) -> None:
    if not hasattr(module.create_distributed_optimizer, "__wrapped__"):
        module.create_distributed_optimizer = _guarded(module.create_distributed_optimizer)


def _use_tf_keras_backend(module) -> None:
    module.K = module.keras.backend  # `keras` there is `from tensorflow import keras`


_PATCHES = {
    _HOROVOD_KERAS: _guard_optimizer,
    "horovod.tensorflow.keras": _use_tf_keras_backend,
    "horovod.tensorflow.keras.callbacks": _use_tf_keras_backend,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of each module in _PATCHES to patch it once executed."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                real_exec = spec.loader.exec_module

                def exec_module(module, real_exec=real_exec, patch=_PATCHES[name]):
                    real_exec(module)
                    patch(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def install() -> None:
    """Call in a rank before user code runs (rank_main does)."""
    prefer_legacy_keras()
    for name, patch in _PATCHES.items():
        if name in sys.modules:  # already imported: patch in place
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
