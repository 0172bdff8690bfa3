"""KFP definition of evaluate: a thin wrapper over ``components.evaluate.evaluate``."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output


def evaluate(
    dataset: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    confusion_matrix: Output[ClassificationMetrics],
    report: Output[Markdown],
) -> NamedTuple("EvalOutputs", [("accuracy", float), ("loss", float)]):  # type: ignore[valid-type]  # noqa: F821
    """Score the exported model on the test split; log metrics, a confusion matrix and a report.

    The model must hash to the ``saved_model_sha256`` the trainer put in its metadata (if any).
    """
    from components.common.failure import one_line_failures

    with one_line_failures():  # bad input: one FAILED line, no traceback
        from collections import namedtuple

        from components.evaluate.evaluate import evaluate as run_evaluation

        result = run_evaluation(
            model.path, dataset.path, saved_model_sha256=model.metadata.get("saved_model_sha256")
        )
        board = model.metadata.get("tensorboard_uri", "")
        if board:  # the trainer's TensorBoard gets the test metrics too
            from components.evaluate.evaluate import write_tensorboard

            write_tensorboard(result, board, int(model.metadata.get("epochs", 0)))
        metrics.log_metric("accuracy", result.accuracy)
        metrics.log_metric("loss", result.loss)
        metrics.log_metric("samples", result.samples)
        confusion_matrix.log_confusion_matrix(result.categories, result.confusion_matrix)
        with open(report.path, "w", encoding="utf-8") as fh:
            fh.write(result.to_markdown(model.uri, dataset.uri, board))
        report.metadata["saved_model_sha256"] = result.saved_model_sha256
        EvalOutputs = namedtuple("EvalOutputs", ["accuracy", "loss"])
        return EvalOutputs(result.accuracy, result.loss)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP evaluate component running in `image`."""
    return dsl.component(base_image=image, install_kfp_package=False)(evaluate)
