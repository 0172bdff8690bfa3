"""KFP definition of evaluate: the dataset and the model in; metrics, a confusion matrix, a
report, the accuracy and the loss out (``components.evaluate.evaluate.evaluate_step``)."""

from kfp import dsl

from components.common.kfp_function import kfp_function

evaluate = kfp_function(
    "evaluate",
    [
        ("dataset", "Input[Dataset]"),
        ("model", "Input[Model]"),
        ("metrics", "Output[Metrics]"),
        ("confusion_matrix", "Output[ClassificationMetrics]"),
        ("report", "Output[Markdown]"),
    ],
    'NamedTuple("EvalOutputs", [("accuracy", float), ("loss", float)])',
    "components.evaluate.evaluate:evaluate_step",
    "Score the exported model on the test split; log metrics, a confusion matrix and a report.\n\n"
    "The model must hash to the ``saved_model_sha256`` the trainer put in its metadata (if any).",
)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP evaluate component running in `image`."""
    return dsl.component(base_image=image, install_kfp_package=False)(evaluate)
