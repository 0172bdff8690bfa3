"""The pipeline's parameters, in the order of its signature, from the steps' declarations; the
check step, first in every run, which refuses bad values and storage it cannot use before any
work; and the same parameter checks for the ``NAME=VALUE`` arguments ``python -m pipeline
submit | schedule`` send."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from components.common import declare, defaults, storage_access
from components.common.dataset import DataError
from components.common.declare import Declared, json_value
from components.common.failure import InputError
from components.common.placement import Placement
from components.data_prep.step_parameters import PrepStep
from components.register.step_parameters import RegisterStep
from components.train.config import TrainConfig
from components.train.launcher.parameters import TrainStep

# In the order of the pipeline's signature, under their docs/parameters.md headings.
GROUPS = (
    (
        "The trainer (`TrainConfig`, components/train/config.py)",
        TrainConfig.parameters(pipeline_only=True),
    ),
    (
        "The train step (`TrainStep`, components/train/launcher/parameters.py)",
        TrainStep.parameters(pipeline_only=True),
    ),
    ("Placement (`Placement`, components/common/placement.py)", Placement.parameters()),
    ("Data prep (`PrepStep`, components/data_prep/step_parameters.py)", PrepStep.parameters()),
    (
        "Register (`RegisterStep`, components/register/step_parameters.py)",
        RegisterStep.parameters(),
    ),
)
PIPELINE_PARAMETERS: list[Declared] = [p for _, group in GROUPS for p in group]
# The rules across parameters, each of the class that owns them.
JOINT_RULES = [
    cls.joint_problems for cls in (TrainConfig, TrainStep, Placement, PrepStep, RegisterStep)
]
# The declared defaults; a required parameter (``registry_root``) has none: a run must be given it.
PIPELINE_DEFAULTS: dict[str, Any] = {
    p.name: p.default for p in PIPELINE_PARAMETERS if not p.required
}
# What docs/parameters.md says under the placement table.
PLACEMENT_NOTE = (
    "`node_selector` and `tolerations` are KFP `dict` and `list` parameters; earlier pipelines "
    "took them as JSON text in `str` parameters, and that is the only change in the pipeline's "
    "parameters (names, types, defaults). The pipeline sets them on the train task with "
    "kfp-kubernetes (`add_node_selector_json`, `add_toleration_json`), so they reach the job's "
    "pods through the train task's config, the path a pipeline author's own kfp-kubernetes "
    "settings take (docs/cluster.md, section 6)."
)


class Checked(NamedTuple):
    """What the check step hands on: the trainer's image, and the GPUs of the train step's own
    pod (the local backend trains there, a GPU per worker; the MPIJob backend only launches)."""

    trainer_image: str
    train_step_gpus: int


def samples_problem(values: dict[str, Any]) -> str | None:
    """Why the job's ranks cannot train on the data, where the data's size is known before
    data prep (the bundled digits); other sources are checked once listed and prepared, before
    any rank starts (`components.train.launcher.preflight.check_job_before_launch`)."""
    from components.data_prep.sources import detect, list_source
    from components.train.rank.data import ranks_problem

    if detect(values["data_source"], values["data_format"]) != "bundled":
        return None
    try:
        listing = list_source(
            "bundled", "bundled", None, values["data_limit"], values["test_fraction"]
        )
    except DataError as exc:
        return str(exc)
    ranks = values["workers"] * values["slots_per_worker"]
    return ranks_problem(listing.counts.get("train", 0), ranks, values["batch_size_per_worker"])


def check_step(images: dict[str, str], **values: Any) -> Checked:
    """Raise ValueError naming every bad parameter; else choose the trainer's image from the
    compiled `images`."""
    declare.check(PIPELINE_PARAMETERS, values, "pipeline parameters", JOINT_RULES)
    problem = samples_problem(values)
    if problem:
        raise InputError(f"invalid pipeline parameters: {problem}")
    gpus = values["gpus_per_worker"]
    image = defaults.trainer_image(gpus, images, values["trainer_image"])
    local = values["training_backend"] == "local"
    return Checked(image, values["workers"] * gpus if local else 0)


def storage_locations(values: dict[str, Any]) -> list[storage_access.Location]:
    """The locations a run's steps read and write by parameter: the data source (read) and the
    registry (read and written). The pipeline root is not among them: KFP's backend does not
    resolve ``dsl.PIPELINE_ROOT_PLACEHOLDER`` for a task (only the job's and task's names and
    ids), so the check step cannot know it; the job's workers check it, where they write the
    model (`storage_access.check_job`)."""
    return [
        storage_access.Location("data_source", values["data_source"]),
        storage_access.Location("registry_root", values["registry_root"], writes=True),
    ]


def check_parameters_step(images: dict[str, str], **values: Any) -> Checked:
    """The check step: `check_step`'s parameters, then every ``gs://`` location of
    `storage_locations` with this step's own identity (StorageAccessError, one line)."""
    checked = check_step(images, **values)
    storage_access.check(storage_locations(values))
    return checked


def parameters_markdown() -> str:
    """docs/parameters.md, from the declarations (a test keeps the two in step)."""
    lines = [
        "# Pipeline parameters",
        "",
        "Generated from the declarations by `python -m pipeline parameters > docs/parameters.md`."
        " Each parameter has this name everywhere: the pipeline, the step's input, the check "
        "step's rule, the trainer's or the CLI's `--<name-with-dashes>`.",
    ]
    for title, group in GROUPS:
        lines += ["", f"## {title}", "", "| parameter | type | default | |", "|---|---|---|---|"]
        for p in group:
            default = "(required)" if p.required else f"`{p.default!r}`"
            lines.append(f"| `{p.name}` | {p.type.__name__} | {default} | {p.help} |")
        if group == Placement.parameters():
            lines += ["", PLACEMENT_NOTE]
    return "\n".join(lines) + "\n"


def parse_arguments(pairs: Sequence[str]) -> dict[str, Any]:
    """Pipeline arguments from ``NAME=VALUE`` strings, typed by their declarations and checked
    by the check step's rules (with the declared defaults); ValueError naming what is wrong."""
    import click  # the CLI's converters (not loaded by the check step)

    declared = {p.name: p for p in PIPELINE_PARAMETERS}
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise InputError(f"bad parameter {pair!r}: expected NAME=VALUE")
        if name in values:
            raise InputError(f"parameter {name!r} is given more than once")
        if name not in declared:
            known = ", ".join(declared)
            raise InputError(f"unknown pipeline parameter {name!r}; the pipeline declares: {known}")
        kind = declared[name].type
        if kind in (dict, list):  # JSON text, its kind checked by the declared rule
            values[name] = json_value(name, raw, kind())
            continue
        try:
            values[name] = click.types.convert_type(kind).convert(raw, None, None)
        except click.BadParameter as exc:
            raise InputError(f"parameter {name!r}: {exc.message}") from exc
    missing = [f"{p.name} is required: {p.help}" for p in required_missing(values)]
    declare.check(
        PIPELINE_PARAMETERS, PIPELINE_DEFAULTS | values, "pipeline parameters", JOINT_RULES, missing
    )
    return values


def required_missing(values: dict[str, Any]) -> list[Declared]:
    """The pipeline's required parameters (no default) that `values` does not give."""
    return [p for p in PIPELINE_PARAMETERS if p.required and p.name not in values]
