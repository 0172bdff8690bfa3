"""The KFP v2 pipeline: data prep -> Horovod training -> evaluation -> registration."""

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from kfp import dsl

from components.common import defaults
from components.data_prep.component import make_component as make_data_prep
from components.evaluate.component import make_component as make_evaluate
from components.register.component import make_component as make_register
from components.train.component import make_component as make_train

PIPELINE_DESCRIPTION = (
    "MNIST data prep to GCS, Horovod training as ONE job (local horovodrun or a Kubeflow "
    "MPIJob), evaluation of the single exported model, and registration."
)


def check_parameters(
    workers: int,
    epochs: int,
    batch_size_per_worker: int,
    learning_rate: float,
    warmup_epochs: int,
    threads_per_worker: int,
    model: str,
    augment: bool,
    min_workers: int,
    data_source: str,
    data_sha256: str,
    data_limit: int,
    shard_size: int,
    min_accuracy: float,
    model_name: str,
    registry_root: str,
    training_backend: str,
    slots_per_worker: int,
    cpu_per_worker: str,
    memory_per_worker: str,
    gpus_per_worker: int,
    trainer_image: str,
    images: str,
) -> NamedTuple("Checked", [("trainer_image", str), ("train_step_gpus", int)]):  # type: ignore[valid-type]  # noqa: F821, UP014
    """Fail the run before any work if a parameter is bad; the error names every bad one.

    Then choose the image the trainer runs in (`defaults.trainer_image`: `trainer_image` if
    given, else the GPU trainer image when the job asks for GPUs, from the compiled `images`),
    and the GPUs of the train step's own pod: the local backend trains there, one GPU set per
    worker; the MPIJob backend only launches the job from it.
    """
    import collections
    import json

    from components.common import defaults
    from components.common.params import check_parameters as check

    parameters = dict(locals())
    refs = json.loads(parameters.pop("images"))
    check(parameters)
    local = training_backend == "local"
    Checked = collections.namedtuple("Checked", ["trainer_image", "train_step_gpus"])  # noqa: N806
    return Checked(
        defaults.trainer_image(gpus_per_worker, refs, trainer_image),
        workers * gpus_per_worker if local else 0,
    )


def build_pipeline(images: dict[str, str], image_at_run_time: bool = True) -> Callable[..., Any]:
    """The pipeline function with each component running in its image from `images`.

    The train step runs in the trainer image the check step chooses (`image_at_run_time`: KFP
    resolves a task's image from an upstream output when the task starts). kfp.local runs each
    task in its compiled image and cannot do that, so a local run passes False and builds the
    pipeline with ``images["trainer"]`` already chosen (`pipeline.local_run`).
    """
    check_op = dsl.component(base_image=images["data_prep"], install_kfp_package=False)(
        check_parameters
    )
    prep_op = make_data_prep(images["data_prep"])
    train_op = make_train(images["trainer"])
    evaluate_op = make_evaluate(images["evaluate"])
    register_op = make_register(images["register"])
    images_json = json.dumps(images, sort_keys=True)

    @dsl.pipeline(name=defaults.PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
    def mnist_horovod(
        workers: int = defaults.WORKERS,
        epochs: int = defaults.EPOCHS,
        batch_size_per_worker: int = defaults.BATCH_SIZE_PER_WORKER,
        learning_rate: float = defaults.BASE_LEARNING_RATE,
        warmup_epochs: int = defaults.WARMUP_EPOCHS,
        threads_per_worker: int = 0,
        model: str = defaults.MODEL,
        augment: bool = defaults.AUGMENT,
        min_workers: int = 0,
        data_source: str = "bundled",
        data_sha256: str = defaults.MNIST_SHA256,
        data_limit: int = 0,
        shard_size: int = defaults.SHARD_SIZE,
        min_accuracy: float = defaults.MIN_ACCURACY,
        model_name: str = defaults.MODEL_NAME,
        registry_root: str = "",
        training_backend: str = "mpijob",
        trainer_image: str = "",
        slots_per_worker: int = defaults.SLOTS_PER_WORKER,
        cpu_per_worker: str = defaults.WORKER_CPU,
        memory_per_worker: str = defaults.WORKER_MEMORY,
        gpus_per_worker: int = 0,
        namespace: str = "",
        trainer_service_account: str = defaults.TRAINER_SERVICE_ACCOUNT,
    ) -> None:
        # What the check step and the train step both take, under the same names.
        job = dict(
            workers=workers, epochs=epochs, batch_size_per_worker=batch_size_per_worker,
            learning_rate=learning_rate, warmup_epochs=warmup_epochs,
            threads_per_worker=threads_per_worker, augment=augment, min_workers=min_workers,
            training_backend=training_backend, slots_per_worker=slots_per_worker,
            cpu_per_worker=cpu_per_worker, memory_per_worker=memory_per_worker,
            gpus_per_worker=gpus_per_worker,
        )  # fmt: skip
        check = check_op(
            **job,
            trainer_image=trainer_image,
            images=images_json,
            model=model,
            data_source=data_source,
            data_sha256=data_sha256,
            data_limit=data_limit,
            shard_size=shard_size,
            min_accuracy=min_accuracy,
            model_name=model_name,
            registry_root=registry_root,
        ).set_display_name("check parameters, choose the trainer image")
        check.set_caching_options(False)
        prep = prep_op(
            source=data_source, sha256=data_sha256, shard_size=shard_size, limit=data_limit
        ).after(check)
        prep.set_display_name("data prep")
        train = train_op(
            dataset=prep.outputs["dataset"],
            **job,
            architecture=model,
            trainer_image=check.outputs["trainer_image"],
            namespace=namespace,
            trainer_service_account=trainer_service_account,
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        ).set_display_name("Horovod training (one job)")
        if image_at_run_time:
            train.set_container_image(check.outputs["trainer_image"])
            train.set_accelerator_type("nvidia.com/gpu")
            train.set_accelerator_limit(check.outputs["train_step_gpus"])
        evaluate = evaluate_op(
            dataset=prep.outputs["dataset"], model=train.outputs["model"]
        ).set_display_name("evaluate the exported model")
        register_op(
            model=train.outputs["model"],
            run_summary=train.outputs["run_summary"],
            dataset=prep.outputs["dataset"],
            accuracy=evaluate.outputs["accuracy"],
            loss=evaluate.outputs["loss"],
            model_name=model_name,
            registry_root=registry_root,
            min_accuracy=min_accuracy,
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            image_refs=images_json,
        ).set_display_name("register")

    return mnist_horovod
