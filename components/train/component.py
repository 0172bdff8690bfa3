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
    architecture: str,  # the pipeline's `model` (this step's output artifact is `model`)
    augment: bool,
    min_workers: int,
    training_backend: str,
    trainer_image: str,  # the check step's choice (defaults.trainer_image)
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
    """Train ONE model with a Horovod job of `workers` processes (local or an MPIJob)."""
    parameters = dict(locals())  # the pipeline parameters by name (TrainConfig's field names)
    from components.train.config import TrainConfig
    from components.train.task import TRAIN_PARAMETERS, artifact_metadata, run_train_task, work_uri

    summary = run_train_task(
        TrainConfig(
            data=dataset.uri,
            output=work_uri(model.uri),
            model_dir=model.uri,
            model=architecture,
            **{name: parameters[name] for name in TRAIN_PARAMETERS},
        ),
        backend=training_backend,
        dataset_path=dataset.path,
        model_path=model.path,
        outputs=(run_summary.path, coordination_report.path),
        pods={  # MPIJob backend only: MPIJobParams' pod fields
            "image": trainer_image,
            "cpu_per_worker": cpu_per_worker,
            "memory_per_worker": memory_per_worker,
            "service_account": trainer_service_account or None,
            "run_name": f"train-{pipeline_run_id}" if pipeline_run_id else "train",
            "pipeline_run_id": pipeline_run_id,
        },
        namespace=namespace,
    )
    model_metadata, summary_metadata = artifact_metadata(summary)
    model.metadata.update(model_metadata)
    run_summary.metadata.update(summary_metadata)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP train component running in `image` (the trainer image)."""
    return dsl.component(base_image=image, install_kfp_package=False)(train)
