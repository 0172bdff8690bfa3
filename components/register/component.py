"""KFP definition of register: a thin wrapper over ``components.register.register``."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Model, Output


def register_model(
    model: Input[Model],
    run_summary: Input[Artifact],
    dataset: Input[Dataset],
    accuracy: float,
    loss: float,
    model_name: str,
    registry_root: str,
    min_accuracy: float,
    pipeline_run_id: str,
    image_refs: str,
    decision: Output[Markdown],
) -> NamedTuple(  # type: ignore[valid-type]  # noqa: F821
    "RegisterOutputs",
    [
        ("registered", bool),
        ("promoted", bool),
        ("version", int),
        ("decision_text", str),
        ("version_uri", str),
    ],
):
    """Quality gate + champion/challenger; publish the model as the next numeric version.

    `image_refs` is a JSON object (component -> image reference) stored with the version.
    The model must hash to the ``saved_model_sha256`` the trainer recorded (in the run summary
    and the Model artifact's metadata), or nothing is registered.
    The decision goes out twice: as the Markdown artifact ``decision`` (for the UI) and as the
    string ``decision_text`` (a NamedTuple field cannot share the artifact's name in KFP: the
    compiler would rename it ``decision_2`` and the executor would then drop its value).
    """
    from collections import namedtuple

    from components.register.register import parse_image_refs, register

    result = register(
        model.path,
        run_summary.path,
        dataset.path,
        accuracy,
        loss,
        registry_root=registry_root,
        pipeline_run_id=pipeline_run_id,
        model_name=model_name,
        min_accuracy=min_accuracy,
        image_refs=parse_image_refs(image_refs),
        saved_model_sha256=model.metadata.get("saved_model_sha256"),
    )
    with open(decision.path, "w", encoding="utf-8") as fh:
        fh.write(result.to_markdown())
    decision.metadata["decision"] = result.decision
    decision.metadata["version"] = result.version
    RegisterOutputs = namedtuple(
        "RegisterOutputs", ["registered", "promoted", "version", "decision_text", "version_uri"]
    )
    return RegisterOutputs(
        result.registered, result.promoted, result.version, result.decision, result.version_uri
    )


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP register component running in `image`."""
    return dsl.component(base_image=image, install_kfp_package=False)(register_model)
