"""The register component, what the KFP register step's pod runs, in the register image: the
trained model, its run summary, the dataset and the evaluation in; the quality gate's and the
champion/challenger decision out (``components.register.register``). Its own parameters are
declared once (`RegisterStep`); tests/test_signatures.py holds this signature to them."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, ClassificationMetrics, Dataset, Input, Markdown, Model, Output


# The decision goes out twice: as the Markdown artifact ``decision`` (for the UI) and as the
# string ``decision_text`` (a NamedTuple field cannot share the artifact's name in KFP: the
# compiler would rename it ``decision_2`` and the executor would then drop its value).
def register_model(
    saved_model: Input[Model],
    run_summary: Input[Artifact],
    dataset: Input[Dataset],
    accuracy: float,
    loss: float,
    confusion_matrix: Input[ClassificationMetrics],  # the evaluation's: its classes
    min_accuracy: float,
    model_name: str,
    registry_root: str,
    pipeline_run_id: str,
    image_refs: dict,
    decision: Output[Markdown],
) -> NamedTuple(  # type: ignore[valid-type]
    "RegisterOutputs",
    [
        ("registered", bool),
        ("promoted", bool),
        ("version", int),
        ("decision_text", str),
        ("version_uri", str),
    ],
):
    """Quality gate + champion/challenger; publish the model as the next numeric version."""
    arguments = dict(locals())  # the parameters, before an import binds a name
    from components.common.failure import one_line_failures, stops_on_signals

    with one_line_failures(), stops_on_signals():
        from components.register.register import register_model_step

        return register_model_step(**arguments)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP register component running in `image`."""
    return dsl.component(base_image=image, install_kfp_package=False)(register_model)
