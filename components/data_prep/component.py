"""KFP definitions of data prep's three steps (``components.data_prep.prep``): the listing,
one slice's conversion (run once per slice under ``dsl.ParallelFor``), and the publishing of
the dataset; each takes its declared parameters (`PrepStep`) under their own names."""

from kfp import dsl

from components.common.kfp_function import kfp_function
from components.data_prep.step_parameters import (
    LIST_PARAMETERS,
    PUBLISH_PARAMETERS,
    SLICE_PARAMETERS,
)


def _declared(params: list) -> list[tuple[str, str]]:
    return [(p.name, p.type.__name__) for p in params]


def make_components(
    image: str,
) -> tuple[
    dsl.base_component.BaseComponent,
    dsl.base_component.BaseComponent,
    dsl.base_component.BaseComponent,
]:
    """The listing, slice and publish components running in `image` (the data-prep image)."""
    listing = kfp_function(
        "list_data",
        [*_declared(LIST_PARAMETERS), ("listing", "Output[Artifact]")],
        "List[int]",
        "components.data_prep.prep:list_step",
        "List `data_source`'s classes and images, split them, and cut them into at most "
        "`prep_parallelism` slices; return the slices' numbers.",
    )
    slice_ = kfp_function(
        "prepare_slice",
        [
            ("listing", "Input[Artifact]"),
            ("slice_index", "int"),
            *_declared(SLICE_PARAMETERS),
            ("shards", "Output[Dataset]"),
            ("part", "Output[Artifact]"),
        ],
        "None",
        "components.data_prep.prep:slice_step",
        "Convert one slice of the listing into TFRecord shards, and report what it found.",
    )
    publish = kfp_function(
        "publish_dataset",
        [
            ("listing", "Input[Artifact]"),
            ("parts", "Input[List[Artifact]]"),
            *_declared(PUBLISH_PARAMETERS),
            ("dataset", "Output[Dataset]"),
        ],
        "None",
        "components.data_prep.prep:publish_step",
        "Check every slice's shards and write the dataset's manifest.",
    )
    return tuple(  # type: ignore[return-value]
        dsl.component(base_image=image, install_kfp_package=False)(f)
        for f in (listing, slice_, publish)
    )
