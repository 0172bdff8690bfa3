"""The check step's component, first in every run, in the data-prep image: every pipeline
parameter in (`pipeline.checks.PIPELINE_PARAMETERS`, in their order; tests/test_signatures.py
holds this signature to them) and the compiled images; the trainer's image and the train step's
GPUs out (`pipeline.checks.check_parameters_step`)."""

from typing import NamedTuple

from kfp import dsl


def check_parameters(
    workers: int,
    slots_per_worker: int,
    epochs: int,
    batch_size_per_worker: int,
    learning_rate: float,
    warmup_epochs: int,
    lr_scaling: str,
    threads_per_worker: int,
    model: str,
    augment: bool,
    min_workers: int,
    mixed_precision: bool,
    gpus_per_worker: int,
    training_backend: str,
    trainer_image: str,
    cpu_per_worker: str,
    memory_per_worker: str,
    namespace: str,
    trainer_service_account: str,
    node_selector: dict,
    tolerations: list,
    data_source: str,
    data_format: str,
    data_sha256: str,
    data_limit: int,
    image_size: int,
    color_mode: str,
    test_fraction: float,
    skip_bad_images: bool,
    image_feature: str,
    label_feature: str,
    shard_size: int,
    prep_parallelism: int,
    min_accuracy: float,
    model_name: str,
    registry_root: str,
    ###
    images: dict,
) -> NamedTuple("Checked", [("trainer_image", str), ("train_step_gpus", int)]):  # type: ignore[valid-type]
    """Fail the run before any work if a parameter is bad or its storage cannot be used; choose
    the trainer's image."""
    arguments = dict(locals())  # the parameters, before an import binds a name
    from components.common.failure import one_line_failures, stops_on_signals

    with one_line_failures(), stops_on_signals():
        from pipeline.checks import check_parameters_step

        return check_parameters_step(**arguments)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The check step as a KFP component running in `image`."""
    return dsl.component(base_image=image, install_kfp_package=False)(check_parameters)
