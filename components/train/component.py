"""KFP definition of train: a thin wrapper over ``components.train.task``."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Model, Output


def train(
    dataset: Input[Dataset],
    workers: int,
    epochs: int,
    batch_size_per_worker: int,
    learning_rate: float,
    warmup_epochs: int,
    threads_per_worker: int,
    architecture: str,
    augment: bool,
    training_backend: str,
    trainer_image: str,
    slots_per_worker: int,
    cpu_per_worker: str,
    memory_per_worker: str,
    gpus_per_worker: int,
    namespace: str,
    trainer_service_account: str,
    pipeline_run_id: str,
    model: Output[Model],
    run_summary: Output[Artifact],
    coordination_report: Output[Markdown],
) -> None:
    """Train ONE model with a Horovod job of `workers` processes (local or an MPIJob).

    `architecture` is the pipeline's ``model`` parameter (a built-in model or a
    ``package.module:function`` entry point); it cannot share the name of the output `model`.
    """
    from components.train.config import TrainConfig
    from components.train.task import run_train_task, work_uri

    summary = run_train_task(
        TrainConfig(
            data=dataset.uri,
            output=work_uri(model.uri),
            model_dir=model.uri,
            workers=workers,
            slots_per_worker=slots_per_worker,
            epochs=epochs,
            batch_size_per_worker=batch_size_per_worker,
            learning_rate=learning_rate,
            warmup_epochs=warmup_epochs,
            threads_per_worker=threads_per_worker,
            model=architecture,
            augment=augment,
        ),
        backend=training_backend,
        dataset_path=dataset.path,
        model_path=model.path,
        outputs=(run_summary.path, coordination_report.path),
        pods={  # MPIJob backend only: MPIJobParams' pod fields
            "image": trainer_image,
            "cpu_per_worker": cpu_per_worker,
            "memory_per_worker": memory_per_worker,
            "gpus_per_worker": gpus_per_worker,
            "service_account": trainer_service_account or None,
            "run_name": f"train-{pipeline_run_id}" if pipeline_run_id else "train",
            "pipeline_run_id": pipeline_run_id,
        },
        namespace=namespace,
    )
    model.metadata.update(
        framework="tensorflow-savedmodel",
        model=architecture,
        augment=augment,
        **{k: summary[k] for k in ("world_size", "saved_model_sha256", "final_metrics")},
    )
    run_summary.metadata.update(
        {k: summary[k] for k in ("world_size", "weights_identical_across_ranks")}
    )


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP train component running in `image` (the trainer image)."""
    return dsl.component(base_image=image, install_kfp_package=False)(train)
