"""Horovod's own tests, translated to Keras 3 (README.md beside this file)."""

# Every test the translated files hold, "<file stem>::<class>::<test>": the conformance suite
# runs them on 2 ranks and checks that each passed on each.
TESTS = (
    *(
        f"tensorflow2_keras::Tf2KerasTests::{name}"
        for name in (
            "test_train_model_lr_schedule",
            "test_sparse_as_dense",
            "test_legacy_optimizer",
            "test_sparse_as_dense_with_grad_aggregation",
            "test_grad_aggregation_with_inf_grad",
            "test_from_config",
            "test_elastic_state",
            "test_gradient_aggregation_0_True",
            "test_gradient_aggregation_1_False",
            "test_gradient_aggregation_with_local_vars_0_True",
            "test_gradient_aggregation_with_local_vars_1_False",
            "test_partial_distributed_optimizer",
            "test_broadcast_global_variables_callback_with_local_vars",
        )
    ),
    *(
        f"tensorflow_keras3::TensorFlowKeras3Tests::{name}"
        for name in (
            "test_horovod_syncbn_cpu",
            "test_partial_distributed_gradient_tape",
            "test_model_parallel_model",
        )
    ),
)
