"""The KFP v2 pipeline: check -> data prep -> Horovod training -> evaluation -> registration.
Its parameters are the steps' declared ones (`pipeline.checks.PIPELINE_PARAMETERS`), each passed
by its own name to every step that takes it; the placement (`node_selector`, `tolerations`) is set
on the train task with kfp-kubernetes and reaches the job's pods through its task config."""

from collections.abc import Callable
from typing import Any

from kfp import dsl, kubernetes

from components.common import defaults
from components.common.declare import Declared, Validated
from components.data_prep.component import make_components as make_data_prep
from components.data_prep.step_parameters import (
    LIST_PARAMETERS,
    PUBLISH_PARAMETERS,
    SLICE_PARAMETERS,
    PrepStep,
)
from components.evaluate.component import make_component as make_evaluate
from components.register.component import make_component as make_register
from components.register.step_parameters import RegisterStep
from components.train.config import TrainConfig
from components.train.launcher.parameters import TrainStep
from components.train.step.component import make_component as make_train
from pipeline.check_component import make_component as make_check
from pipeline.checks import PIPELINE_DEFAULTS as DEFAULTS
from pipeline.checks import PIPELINE_PARAMETERS

PIPELINE_DESCRIPTION = (
    "Check the parameters and the storage; prepare the data (an image folder, a .csv index, "
    "TFRecord files or MNIST digits into sharded TFRecords, converted in parallel slices); train "
    "with Horovod as ONE job; evaluate the single exported model; register it. "
    "training_backend picks the job: auto (the default) an MPIJob where the cluster serves "
    "mpi-operator, else a TrainJob on Kubeflow Trainer v2; mpijob or trainjob forces one; local "
    "runs mpirun (horovodrun for an elastic job) in the train step's own pod. registry_root, "
    "the model store, is required."
)


def parameters_docstring(params: list[Declared]) -> str:
    """The pipeline function's docstring: an ``Args:`` section of every parameter's help text,
    which KFP compiles into the parameter's description (the KFP UI shows it)."""
    args = [f"    {p.name}: {' '.join(p.help.split())}" for p in params]
    return "\n".join(["The kfp-horovod pipeline.", "", "Args:", *args]) + "\n"


def data_prep(ops: Any, values: dict[str, Any], after: Any = None) -> Any:
    """Data prep's three steps in a pipeline: the listing (after `after`), one task per slice
    under ``dsl.ParallelFor``, the publishing of their parts (``dsl.Collected``); each step
    takes its declared parameters from `values`. Returns the publishing task, whose ``dataset``
    the later steps read."""
    list_op, slice_op, publish_op = ops
    listed = list_op(**{p.name: values[p.name] for p in LIST_PARAMETERS})
    if after is not None:
        listed.after(after)
    listed.set_display_name("data prep: list the images")
    listing = listed.outputs["listing"]
    with dsl.ParallelFor(listed.outputs["Output"]) as slice_index:
        sliced = slice_op(
            listing=listing,
            slice_index=slice_index,
            **{p.name: values[p.name] for p in SLICE_PARAMETERS},
        )
        sliced.set_display_name("data prep: convert a slice")
    published = publish_op(
        listing=listing,
        parts=dsl.Collected(sliced.outputs["part"]),
        **{p.name: values[p.name] for p in PUBLISH_PARAMETERS},
    )
    return published.set_display_name("data prep: publish the dataset")


def build_prep_pipeline(image: str) -> Callable[..., Any]:
    """A pipeline of data prep alone, running in `image`, taking data prep's declared
    parameters; its output is the dataset. For measuring and testing data prep's graph."""
    ops = make_data_prep(image)

    def data_prep_only(
        data_source: str = DEFAULTS["data_source"],
        data_format: str = DEFAULTS["data_format"],
        data_sha256: str = DEFAULTS["data_sha256"],
        data_limit: int = DEFAULTS["data_limit"],
        image_size: int = DEFAULTS["image_size"],
        color_mode: str = DEFAULTS["color_mode"],
        test_fraction: float = DEFAULTS["test_fraction"],
        skip_bad_images: bool = DEFAULTS["skip_bad_images"],
        image_feature: str = DEFAULTS["image_feature"],
        label_feature: str = DEFAULTS["label_feature"],
        shard_size: int = DEFAULTS["shard_size"],
        prep_parallelism: int = DEFAULTS["prep_parallelism"],
    ) -> dsl.Dataset:
        given = locals()  # the parameters, and the names this function closes over
        values = {p.name: given[p.name] for p in PrepStep.parameters()}
        return data_prep(ops, values).outputs["dataset"]

    return dsl.pipeline(name="kfp-horovod-data-prep")(data_prep_only)


def build_pipeline(images: dict[str, str], image_at_run_time: bool = True) -> Callable[..., Any]:
    """The pipeline function with each component running in its image from `images`.

    The train step runs in the trainer image the check step chooses (`image_at_run_time`: KFP
    resolves a task's image from an upstream output when the task starts). kfp.local runs each
    task in its compiled image and cannot do that, so a local run passes False and builds the
    pipeline with ``images["trainer"]`` already chosen (`pipeline.local_run`).
    """
    check_op = make_check(images["data_prep"])
    prep_ops = make_data_prep(images["data_prep"])
    train_op = make_train(images["trainer"])
    evaluate_op, register_op = make_evaluate(images["evaluate"]), make_register(images["register"])

    def kfp_horovod(
        registry_root: str,
        workers: int = DEFAULTS["workers"],
        slots_per_worker: int = DEFAULTS["slots_per_worker"],
        epochs: int = DEFAULTS["epochs"],
        batch_size_per_worker: int = DEFAULTS["batch_size_per_worker"],
        learning_rate: float = DEFAULTS["learning_rate"],
        warmup_epochs: int = DEFAULTS["warmup_epochs"],
        lr_scaling: str = DEFAULTS["lr_scaling"],
        threads_per_worker: int = DEFAULTS["threads_per_worker"],
        model: str = DEFAULTS["model"],
        augment: bool = DEFAULTS["augment"],
        min_workers: int = DEFAULTS["min_workers"],
        mixed_precision: bool = DEFAULTS["mixed_precision"],
        gpus_per_worker: int = DEFAULTS["gpus_per_worker"],
        training_backend: str = DEFAULTS["training_backend"],
        trainer_image: str = DEFAULTS["trainer_image"],
        cpu_per_worker: str = DEFAULTS["cpu_per_worker"],
        memory_per_worker: str = DEFAULTS["memory_per_worker"],
        namespace: str = DEFAULTS["namespace"],
        trainer_service_account: str = DEFAULTS["trainer_service_account"],
        node_selector: dict = DEFAULTS["node_selector"],
        tolerations: list = DEFAULTS["tolerations"],
        data_source: str = DEFAULTS["data_source"],
        data_format: str = DEFAULTS["data_format"],
        data_sha256: str = DEFAULTS["data_sha256"],
        data_limit: int = DEFAULTS["data_limit"],
        image_size: int = DEFAULTS["image_size"],
        color_mode: str = DEFAULTS["color_mode"],
        test_fraction: float = DEFAULTS["test_fraction"],
        skip_bad_images: bool = DEFAULTS["skip_bad_images"],
        image_feature: str = DEFAULTS["image_feature"],
        label_feature: str = DEFAULTS["label_feature"],
        shard_size: int = DEFAULTS["shard_size"],
        prep_parallelism: int = DEFAULTS["prep_parallelism"],
        min_accuracy: float = DEFAULTS["min_accuracy"],
        model_name: str = DEFAULTS["model_name"],
    ) -> None:
        given = locals()  # the parameters, and the names this function closes over
        values = {p.name: given[p.name] for p in PIPELINE_PARAMETERS}

        def taken_by(*classes: type[Validated], pipeline_only: bool = False) -> dict[str, Any]:
            return {p.name: values[p.name] for c in classes for p in c.parameters(pipeline_only)}

        check = check_op(**values, images=images).set_display_name(
            "check parameters, choose the trainer image"
        )
        check.set_caching_options(False)
        prep = data_prep(prep_ops, values, after=check)
        train = train_op(
            **taken_by(TrainConfig, TrainStep, pipeline_only=True)
            | {"trainer_image": check.outputs["trainer_image"]},  # the check step's choice
            dataset=prep.outputs["dataset"],
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        ).set_display_name("Horovod training (one job)")
        # where the job's pods run: through the train task's config
        # (`components.train.step.component`)
        kubernetes.add_node_selector_json(train, node_selector)
        kubernetes.add_toleration_json(train, tolerations)
        if image_at_run_time:
            train.set_container_image(check.outputs["trainer_image"])
            train.set_accelerator_type("nvidia.com/gpu")
            train.set_accelerator_limit(check.outputs["train_step_gpus"])
        saved_model = train.outputs["saved_model"]
        evaluate = evaluate_op(
            dataset=prep.outputs["dataset"], saved_model=saved_model
        ).set_display_name("evaluate the exported model")
        register_op(
            **taken_by(RegisterStep),
            saved_model=saved_model,
            run_summary=train.outputs["run_summary"],
            dataset=prep.outputs["dataset"],
            accuracy=evaluate.outputs["accuracy"],
            loss=evaluate.outputs["loss"],
            confusion_matrix=evaluate.outputs["confusion_matrix"],
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            image_refs=images,
        ).set_display_name("register")

    # KFP compiles each parameter's description from an ``Args:`` section: the declared help.
    kfp_horovod.__doc__ = parameters_docstring(PIPELINE_PARAMETERS)
    return dsl.pipeline(name=defaults.PIPELINE_NAME, description=PIPELINE_DESCRIPTION)(kfp_horovod)
