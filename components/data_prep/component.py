"""KFP definition of data prep: its declared parameters (`PrepStep`) in, the dataset out
(``components.data_prep.prep.prepare_step``)."""

from kfp import dsl

from components.common.kfp_function import kfp_function
from components.data_prep.step_parameters import PREP_PARAMETERS

SIGNATURE = [*((p.name, p.type.__name__) for p in PREP_PARAMETERS), ("dataset", "Output[Dataset]")]


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP data prep component running in `image`."""
    func = kfp_function(
        "prepare_data", SIGNATURE, "None",
        "components.data_prep.prep:prepare_step",
        "Write the MNIST dataset from `data_source` under ``dataset.path``.",
    )  # fmt: skip
    return dsl.component(base_image=image, install_kfp_package=False)(func)
