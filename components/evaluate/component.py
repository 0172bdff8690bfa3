"""The evaluate component, what the KFP evaluate step's pod runs, in the evaluate image: the
dataset and the trained model in; metrics, a confusion matrix, a report, the accuracy and the
loss out (``components.evaluate.evaluate.evaluate_step``)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output


def evaluate(
    dataset: Input[Dataset],
    saved_model: Input[Model],
    metrics: Output[Metrics],
    confusion_matrix: Output[ClassificationMetrics],
    report: Output[Markdown],
) -> NamedTuple("EvalOutputs", [("accuracy", float), ("loss", float)]):  # type: ignore[valid-type]
    """Score the exported model on the test split; log metrics, a confusion matrix and a report.

    The model must hash to the ``saved_model_sha256`` the trainer put in its metadata (if any).
    """
    arguments = dict(locals())  # the parameters, before an import binds a name
    from components.common.failure import one_line_failures, stops_on_signals

    with one_line_failures(), stops_on_signals():
        from components.evaluate.evaluate import evaluate_step

        return evaluate_step(**arguments)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP evaluate component running in `image`."""
    return dsl.component(base_image=image, install_kfp_package=False)(evaluate)
