# Translated to Keras 3 from Horovod v0.28.1's test/parallel/test_tensorflow.py (Copyright 2016
# The TensorFlow Authors, modifications copyright (C) 2019 Uber Technologies, Inc. and
# Microsoft; Apache License, Version 2.0): the three tests that fail on Keras 3 as written.
# Each keeps upstream's name, intent and value assertions; README.md beside this file lists
# what changed and why.
"""Tests of horovod.tensorflow's Keras-facing pieces on Keras 3 variables and layers, run on
every rank of a 2-rank job (tests/horovod/upstream/run.py)."""

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf


class TensorFlowKeras3Tests(tf.test.TestCase):
    """
    Tests for ops in horovod.tensorflow.
    """

    def test_horovod_syncbn_cpu(self):
        """Test that the SyncBatchNormalization implementation is correct on CPU."""

        hvd.init()
        with tf.device("/cpu:0"):
            x_list = [
                tf.convert_to_tensor(
                    np.stack(
                        [
                            np.array(
                                [
                                    [r, r + 1],
                                    [r * 2, r * 2 + 1],
                                    [r * 3, r * 3 + 1],
                                    [r * 4, r * 4 + 1],
                                ],
                                dtype=np.float32,
                            )
                            for r in range(hvd.size())
                        ]
                    ),
                    np.float32,
                ),
                tf.convert_to_tensor(
                    np.stack(
                        [
                            np.array(
                                [[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]], dtype=np.float32
                            )
                            for r in range(hvd.size())
                        ]
                    ),
                    np.float32,
                ),
            ]

            for x in x_list:
                bn = keras.layers.BatchNormalization(axis=1)
                sync_bn = hvd.SyncBatchNormalization(axis=1)
                bn_out = bn(x, training=True)
                sync_bn_out = sync_bn(tf.expand_dims(x[hvd.rank()], 0), training=True)

                self.assertAllClose(sync_bn_out, np.expand_dims(bn_out[hvd.rank()], 0))
                self.assertAllClose(sync_bn.moving_mean, bn.moving_mean)
                self.assertAllClose(sync_bn.moving_variance, bn.moving_variance)

    def test_partial_distributed_gradient_tape(self):
        """Note: test makes most sense with more than 1 nodes."""
        hvd.init()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")

        # the keras model has 3 layers, we test cases with 0, 1, and 2 local layers.
        for num_local_layers in range(3):
            model = keras.models.Sequential()
            initializer = keras.initializers.Constant(hvd.rank())
            model.add(keras.Input(shape=(3,)))
            model.add(
                keras.layers.Dense(2, kernel_initializer=initializer, bias_initializer=initializer)
            )
            model.add(keras.layers.RepeatVector(3))
            model.add(
                keras.layers.TimeDistributed(
                    keras.layers.Dense(
                        3, kernel_initializer=initializer, bias_initializer=initializer
                    )
                )
            )
            model.compile(
                loss=keras.losses.mean_squared_error,
                metrics=[keras.metrics.categorical_accuracy],
            )

            X = np.random.random((1, 3))
            Y = np.random.random((1, 3, 3))

            with tf.GradientTape(persistent=True) as tape:
                p = model(X, training=True)
                l = model.loss(Y, p)  # noqa: E741 (upstream's name)

            gradients = tape.gradient(l, model.trainable_weights)

            # deem local layers
            local_layers = model.layers[:num_local_layers]
            weights = model.trainable_weights
            var_grad = {id(var): grad for var, grad in zip(weights, gradients, strict=True)}
            local_vars = [id(var) for layer in local_layers for var in layer.trainable_weights]

            local_rank = hvd.local_rank()
            if tf.config.list_physical_devices("GPU"):
                with tf.device(f"/gpu:{local_rank}"):
                    tape = hvd.PartialDistributedGradientTape(tape, local_layers=local_layers)
                    allreduced_gradients = tape.gradient(l, model.trainable_weights)
                    local_vars_grads, global_vars_grads = tape.get_local_and_global_gradients(
                        l, model.trainable_weights
                    )
            else:
                tape = hvd.PartialDistributedGradientTape(tape, local_layers=local_layers)
                allreduced_gradients = tape.gradient(l, model.trainable_weights)
                local_vars_grads, global_vars_grads = tape.get_local_and_global_gradients(
                    l, model.trainable_weights
                )

            for var, grad in zip(model.trainable_weights, allreduced_gradients, strict=True):
                if id(var) in local_vars:
                    # scale the gradients of local variable by size
                    avg_local_grad = var_grad[id(var)] / hvd.size()
                    # local gradients should not change.
                    self.assertAllClose(grad, avg_local_grad)
                else:
                    # non-local gradients shouldn't be equal given that the initial weights are
                    # set to ranks
                    self.assertNotAllClose(grad, var_grad[id(var)])

            for var, grad in local_vars_grads:
                # scale the gradients of local variable by size
                avg_local_grad = var_grad[id(var)] / hvd.size()
                # local gradient from both decoupled_gradient() and gradient() calls.
                self.assertAllClose(grad, avg_local_grad)

            for var, grad in global_vars_grads:
                # non-local gradients from both decoupled_gradient() and gradient() calls.
                self.assertNotAllClose(grad, var_grad[id(var)])

    def test_model_parallel_model(self):
        class DummyMPModel2Devices(keras.Model):
            def __init__(self):
                # For demonstation purpose, only supports 2 way parallel
                super().__init__()
                if hvd.rank() == 0:
                    self.embedding = keras.layers.Embedding(
                        7, 3, embeddings_initializer=keras.initializers.Constant(1.0)
                    )
                else:
                    self.embedding = keras.layers.Embedding(
                        9, 3, embeddings_initializer=keras.initializers.Constant(2.0)
                    )
                self.concat = keras.layers.Concatenate()
                self.dense = keras.layers.Dense(
                    1, use_bias=False, kernel_initializer=keras.initializers.Constant(1.0)
                )

            def call(self, inputs):
                x = self.embedding(inputs)
                y = hvd.alltoall(x)
                out = self.dense(tf.reshape(y, [1, 6]))
                return out

        tf.config.set_soft_device_placement(True)

        hvd.init()
        if hvd.size() != 2:
            self.skipTest("Test requires 2 workers.")

        rank = hvd.rank()
        local_rank = hvd.local_rank()

        def build():
            mp_model = DummyMPModel2Devices()
            optimizer = keras.optimizers.SGD(learning_rate=1.0)
            bce = keras.losses.BinaryCrossentropy(from_logits=True)
            labels = tf.constant(1.0, shape=[1, 1])
            if rank == 0:
                dp_inputs = tf.constant([rank + 1, rank], dtype=tf.int64)
            else:
                dp_inputs = tf.constant([rank + 2, rank + 3], dtype=tf.int64)
            return mp_model, optimizer, bce, labels, dp_inputs

        if tf.config.list_physical_devices("GPU"):
            with tf.device(f"/gpu:{local_rank}"):
                mp_model, optimizer, bce, labels, dp_inputs = build()
        else:
            mp_model, optimizer, bce, labels, dp_inputs = build()

        @tf.function
        def mp_train_step(inputs):
            with tf.GradientTape() as tape:
                predictions = mp_model(inputs)
                loss = tf.math.reduce_mean(bce(labels, predictions))
            tape = hvd.DistributedGradientTape(tape)
            tape.register_local_source(mp_model.embedding.weights[0])
            gradients = tape.gradient(loss, mp_model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, mp_model.trainable_variables, strict=True))
            return loss

        if tf.config.list_physical_devices("GPU"):
            with tf.device(f"/gpu:{local_rank}"):
                # "Transpose" input from data parallel to model parallel
                mp_inputs = hvd.alltoall(dp_inputs)
                mp_train_step(mp_inputs)
        else:
            # "Transpose" input from data parallel to model parallel
            mp_inputs = hvd.alltoall(dp_inputs)
            mp_train_step(mp_inputs)
