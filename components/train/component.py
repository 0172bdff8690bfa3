"""KFP definition of train: the dataset in, ONE model, its run summary and its coordination
report out; the trainer's (`TrainConfig`) and the train step's (`TrainStep`) declared
parameters in between, each under its own name (``components.train.task.run_step``).

The output artifact is ``saved_model`` because the parameter ``model`` (which model to train)
holds that name.
"""

from kfp import dsl

from components.common.kfp_function import kfp_function
from components.train.config import PIPELINE_TRAIN_PARAMETERS
from components.train.step import TRAIN_STEP_PARAMETERS

SIGNATURE = [
    ("dataset", "Input[Dataset]"),
    *((p.name, p.type.__name__) for p in (*PIPELINE_TRAIN_PARAMETERS, *TRAIN_STEP_PARAMETERS)),
    ("pipeline_run_id", "str"),
    ("saved_model", "Output[Model]"),
    ("run_summary", "Output[Artifact]"),
    ("coordination_report", "Output[Markdown]"),
]


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP train component running in `image` (the trainer image)."""
    func = kfp_function(
        "train", SIGNATURE, "None",
        "components.train.task:run_step",
        "Train ONE model with a Horovod job of `workers` processes (local or an MPIJob).",
    )  # fmt: skip
    return dsl.component(base_image=image, install_kfp_package=False)(func)
