"""The train component, what the KFP train step's pod runs in the trainer image: the dataset in;
ONE model (``saved_model``: ``model`` names the architecture), its run summary and its
coordination report out.
"""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Model, Output, TaskConfig

# KFP's task-config passthroughs (kfp >= 2.15): what is set on the train task with
# kfp-kubernetes (the pipeline's ``node_selector`` and ``tolerations``, and a pipeline author's
# own settings) reaches ``task_config``, which the step checks and forwards to the job's pods
# (`components.train.launcher.cluster.job.PodConfig`): the one way placement reaches them. The
# environment and the resources apply to the task's own pod too (the ``local`` backend trains
# there, on the task's GPUs); placement and volumes go to the job's pods only: the task that
# launches a cluster job needs no GPU node.
PASSTHROUGHS = [
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.RESOURCES, apply_to_task=True),
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.ENV, apply_to_task=True),
    dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR,
    dsl.TaskConfigField.KUBERNETES_TOLERATIONS,
    dsl.TaskConfigField.KUBERNETES_AFFINITY,
    dsl.TaskConfigField.KUBERNETES_VOLUMES,
]


def train(
    dataset: Input[Dataset],
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
    pipeline_run_id: str,
    task_config: TaskConfig,
    saved_model: Output[Model],
    run_summary: Output[Artifact],
    coordination_report: Output[Markdown],
) -> None:
    """Train ONE model with a Horovod job of `workers` processes (local, an MPIJob or a
    TrainJob). Its parameters are the trainer's (`TrainConfig`) and the train step's
    (`TrainStep`) that the pipeline exposes; tests/test_signatures.py holds them to those."""
    arguments = dict(locals())  # the parameters, before an import binds a name
    from components.common.failure import one_line_failures, stops_on_signals

    with one_line_failures(), stops_on_signals():
        from components.train.step.program import train_step

        return train_step(**arguments)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP train component running in `image` (the trainer image)."""
    return dsl.component(
        base_image=image, install_kfp_package=False, task_config_passthroughs=PASSTHROUGHS
    )(train)
