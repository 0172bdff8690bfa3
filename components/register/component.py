"""KFP definition of register: the model, its run summary, the dataset and the evaluation in;
the quality gate and champion/challenger decision out (``components.register.register``).
Its own parameters are declared once (`RegisterStep`)."""

from kfp import dsl

from components.common.kfp_function import kfp_function
from components.register.step_parameters import REGISTER_PARAMETERS

SIGNATURE = [
    ("model", "Input[Model]"),
    ("run_summary", "Input[Artifact]"),
    ("dataset", "Input[Dataset]"),
    ("accuracy", "float"),
    ("loss", "float"),
    ("confusion_matrix", "Input[ClassificationMetrics]"),  # the evaluation's: its classes
    *((p.name, p.type.__name__) for p in REGISTER_PARAMETERS),
    ("pipeline_run_id", "str"),
    ("image_refs", "dict"),
    ("decision", "Output[Markdown]"),
]
# The decision goes out twice: as the Markdown artifact ``decision`` (for the UI) and as the
# string ``decision_text`` (a NamedTuple field cannot share the artifact's name in KFP: the
# compiler would rename it ``decision_2`` and the executor would then drop its value).
RETURNS = (
    'NamedTuple("RegisterOutputs", [("registered", bool), ("promoted", bool), '
    '("version", int), ("decision_text", str), ("version_uri", str)])'
)


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP register component running in `image`."""
    func = kfp_function(
        "register_model",
        SIGNATURE,
        RETURNS,
        "components.register.register:register_step",
        "Quality gate + champion/challenger; publish the model as the next numeric version.",
    )
    return dsl.component(base_image=image, install_kfp_package=False)(func)
