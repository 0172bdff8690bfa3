"""Data prep's three components, what the KFP data-prep steps' pods run, in the data-prep
image: the listing, one slice's conversion (once per slice under ``dsl.ParallelFor``), and the
publishing of the dataset (``components.data_prep.prep``). Each takes its declared parameters
(`PrepStep`) under their own names; tests/test_signatures.py holds these signatures to them."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Output


def list_data(
    data_source: str,
    data_format: str,
    data_sha256: str,
    data_limit: int,
    test_fraction: float,
    prep_parallelism: int,
    listing: Output[Artifact],
) -> list[int]:
    """List `data_source`'s classes and images, split them, and cut them into at most
    `prep_parallelism` slices; return the slices' numbers."""
    arguments = dict(locals())  # the parameters, before an import binds a name
    from components.common.failure import one_line_failures, stops_on_signals

    with one_line_failures(), stops_on_signals():
        from components.data_prep.prep import list_data_step

        return list_data_step(**arguments)


def prepare_slice(
    listing: Input[Artifact],
    slice_index: int,
    image_size: int,
    color_mode: str,
    skip_bad_images: bool,
    image_feature: str,
    label_feature: str,
    shard_size: int,
    shards: Output[Dataset],
    part: Output[Artifact],
) -> None:
    """Convert one slice of the listing into TFRecord shards, and report what it found."""
    arguments = dict(locals())  # the parameters, before an import binds a name
    from components.common.failure import one_line_failures, stops_on_signals

    with one_line_failures(), stops_on_signals():
        from components.data_prep.prep import prepare_slice_step

        return prepare_slice_step(**arguments)


def publish_dataset(
    listing: Input[Artifact],
    parts: Input[list[Artifact]],
    image_size: int,
    color_mode: str,
    skip_bad_images: bool,
    dataset: Output[Dataset],
) -> None:
    """Check every slice's shards and write the dataset's manifest."""
    arguments = dict(locals())  # the parameters, before an import binds a name
    from components.common.failure import one_line_failures, stops_on_signals

    with one_line_failures(), stops_on_signals():
        from components.data_prep.prep import publish_dataset_step

        return publish_dataset_step(**arguments)


def make_components(
    image: str,
) -> tuple[
    dsl.base_component.BaseComponent,
    dsl.base_component.BaseComponent,
    dsl.base_component.BaseComponent,
]:
    """The listing, slice and publish components running in `image` (the data-prep image)."""
    component = dsl.component(base_image=image, install_kfp_package=False)
    return component(list_data), component(prepare_slice), component(publish_dataset)
