"""Keras 3's Adam, its step done by TensorFlow's fused ``ResourceApplyAdam`` kernel (`FusedAdam`,
`fused_adam`). Runs in each rank, wrapped in Horovod's ``DistributedOptimizer``.
"""

from __future__ import annotations

import functools
from typing import Any

from components.common import keras_env


# Keras 3 writes Adam's step in backend-neutral ``keras.ops``: on TensorFlow that is about ten
# element-wise ops per variable, each a full pass over the weights (and their moments), where
# tf-keras's legacy Adam ran TensorFlow's one fused kernel. On the default model (1.2 M weights,
# batch 64, 2 CPU threads, one process, 3 interleaved runs, median of 8 epochs each) a step took
# 46.6 ms with Keras's Adam, 41.9 ms with this one and 42.9 ms on tf-keras (bench/README.md).
#
# `FusedAdam` is ``keras.optimizers.Adam`` in everything but `update_step`, whose arithmetic is the
# same (``ResourceApplyAdam``'s documented update is Keras's: epsilon added to the square root, the
# bias correction folded into the step size). Where the kernel does not apply it leaves the step to
# Keras: AMSGrad, and sparse gradients (an ``Embedding``'s ``IndexedSlices``). Its variables are
# Adam's, so a checkpoint restores into either; the exported model carries no optimizer.
@functools.cache
def fused_adam_class() -> type:
    """The `FusedAdam` class, made once Keras is imported (nothing is imported at import)."""
    tf, keras = keras_env.tensorflow(), keras_env.keras()

    class FusedAdam(keras.optimizers.Adam):  # type: ignore[misc, name-defined]
        """Keras 3's Adam, each variable's step one ``ResourceApplyAdam`` (module docstring)."""

        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
                return super().update_step(gradient, variable, learning_rate)
            dtype = variable.dtype
            momentum, velocity = adam_moments(self, variable)
            step = tf.cast(self.iterations + 1, dtype)
            beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
            tf.raw_ops.ResourceApplyAdam(
                var=_handle(keras, variable),
                m=_handle(keras, momentum),
                v=_handle(keras, velocity),
                beta1_power=tf.pow(beta_1, step),
                beta2_power=tf.pow(beta_2, step),
                lr=tf.cast(learning_rate, dtype),
                beta1=beta_1,
                beta2=beta_2,
                epsilon=tf.cast(self.epsilon, dtype),
                grad=tf.cast(gradient, dtype),
            )
            return None

    FusedAdam.__module__ = __name__
    return FusedAdam


def adam_moments(optimizer: Any, variable: Any) -> tuple[Any, Any]:
    """Keras 3 Adam's first and second moment of `variable` (its "momentum" and "velocity"
    slots). Keras has no public way to them: this is the project's one read of a Keras private
    attribute (its Adam's ``_momentums``, ``_velocities`` and ``_get_variable_index``, Keras
    3.15), and components/train/tests/test_adam.py fails the day Keras changes them."""
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def _handle(keras: Any, variable: Any) -> Any:
    """The resource handle of a Keras 3 variable (its ``value`` is the ``tf.Variable``) or of a
    ``tf.Variable`` (what Keras's TensorFlow optimizer passes to `update_step`)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


def fused_adam(**settings: Any) -> Any:
    """A `FusedAdam` with Adam's keyword arguments (`components.train.config.adam_settings`)."""
    return fused_adam_class()(**settings)
