"""KFP definition of train: the dataset in, ONE model, its run summary and its coordination
report out; the trainer's (`TrainConfig`) and the train step's (`TrainStep`) declared
parameters in between, each under its own name (``components.train.step.program.run_step``).

The output artifact is ``saved_model`` because the parameter ``model`` (which model to train)
holds that name.

KFP's task-config passthroughs (kfp >= 2.15, `PASSTHROUGHS`): what is set on the train task with
kfp-kubernetes (the pipeline's ``node_selector`` and ``tolerations``, and a pipeline author's own
settings) reaches ``task_config``, which the step checks and forwards to the job's pods
(`components.train.launcher.cluster.job.PodConfig`): the one way placement reaches them. The
environment and the resources apply to the task's own pod too (the ``local`` backend trains there,
on the task's GPUs); placement and volumes go to the job's pods only: the task that launches a
cluster job needs no GPU node.
"""

from kfp import dsl

from components.common.kfp_function import kfp_function
from components.train.config import PIPELINE_TRAIN_PARAMETERS
from components.train.launcher.parameters import TRAIN_STEP_PARAMETERS

SIGNATURE = [
    ("dataset", "Input[Dataset]"),
    *((p.name, p.type.__name__) for p in (*PIPELINE_TRAIN_PARAMETERS, *TRAIN_STEP_PARAMETERS)),
    ("pipeline_run_id", "str"),
    ("task_config", "TaskConfig"),
    ("saved_model", "Output[Model]"),
    ("run_summary", "Output[Artifact]"),
    ("coordination_report", "Output[Markdown]"),
]


PASSTHROUGHS = [
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.RESOURCES, apply_to_task=True),
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.ENV, apply_to_task=True),
    dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR,
    dsl.TaskConfigField.KUBERNETES_TOLERATIONS,
    dsl.TaskConfigField.KUBERNETES_AFFINITY,
    dsl.TaskConfigField.KUBERNETES_VOLUMES,
]


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP train component running in `image` (the trainer image)."""
    func = kfp_function(
        "train",
        SIGNATURE,
        "None",
        "components.train.step.program:run_step",
        "Train ONE model with a Horovod job of `workers` processes (local, an MPIJob or a "
        "TrainJob).",
    )
    return dsl.component(
        base_image=image, install_kfp_package=False, task_config_passthroughs=PASSTHROUGHS
    )(func)
