"""Evaluate program: load ONLY the exported SavedModel and score it on the test split. Runs in the
evaluate step's pod (or the CLI's process), never beside training, so nothing from training is
in memory: what is measured is the ``serving_default`` signature TF Serving would run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import click
import numpy as np

from components.common import dataset, keras_env
from components.common.declare import run_command
from components.common.defaults import EVAL_BATCH_SIZE
from components.common.failure import InputError, one_line_failures
from components.common.model_files import (
    ModelError,
    ServingModel,
    fetch_model,
    load_serving,
    verify_digest,
)
from components.common.shard_files import read_split

# Keras clips probabilities to [eps, 1 - eps] in its cross-entropy; do the same so the logged
# loss equals model.evaluate()'s.
_EPSILON = 1e-7


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    loss: float
    samples: int
    classes: list[str]
    confusion_matrix: list[list[int]]  # rows: true class, columns: predicted class
    precision: list[float]  # per class; 0.0 where the class was never predicted
    recall: list[float]  # per class; 0.0 where the class never occurs
    split: str
    dataset_manifest_sha256: str
    saved_model_sha256: str  # of the saved_model.pb that was scored

    def to_markdown(self, model_uri: str, dataset_uri: str, tensorboard_uri: str = "") -> str:
        lines = ["# Evaluation", "", f"- model: `{model_uri}`"]
        if tensorboard_uri:
            lines.append(f"- TensorBoard: `tensorboard --logdir {tensorboard_uri}`")
        lines += [
            f"- saved_model.pb sha256: `{self.saved_model_sha256}`",
            f"- dataset: `{dataset_uri}` (manifest sha256 `{self.dataset_manifest_sha256}`)",
            f"- split: {self.split}, {self.samples} samples, {len(self.classes)} classes",
            f"- **accuracy: {self.accuracy:.4f}**, loss: {self.loss:.4f}",
            "",
            "| class | support | precision | recall |",
            "|---|---:|---:|---:|",
        ]
        support = np.asarray(self.confusion_matrix).sum(axis=1)
        for c, name in enumerate(self.classes):
            lines.append(
                f"| {name} | {int(support[c])} | {self.precision[c]:.4f} | {self.recall[c]:.4f} |"
            )
        return "\n".join(lines) + "\n"


class Scores:
    """Accuracy, loss, confusion matrix, precision and recall, batch by batch: the test split is
    streamed, never held whole."""

    def __init__(self, num_classes: int) -> None:
        self.confusion = np.zeros((num_classes, num_classes), np.int64)
        self.log_loss = 0.0

    def add(self, probabilities: np.ndarray, labels: np.ndarray) -> None:
        """One batch of class `probabilities` (ModelError unless they are finite rows of one
        probability per class summing to 1) and their true labels."""
        p = np.asarray(probabilities, dtype=np.float64)
        y = np.asarray(labels).astype(np.int64)
        classes = len(self.confusion)
        if p.ndim != 2 or p.shape != (len(y), classes):
            raise ModelError(
                f"model output has shape {p.shape}, expected ({len(y)}, {classes}) class "
                "probabilities"
            )
        if not np.isfinite(p).all():
            raise ModelError("model output contains NaN or infinite values")
        if not np.allclose(p.sum(axis=1), 1.0, atol=1e-3) or p.min() < 0:
            raise ModelError("model output rows are not probabilities (expected a softmax output)")
        np.add.at(self.confusion, (y, p.argmax(axis=1)), 1)
        picked = np.clip(p[np.arange(len(y)), y], _EPSILON, 1.0 - _EPSILON)
        self.log_loss -= float(np.log(picked).sum())

    def result(self) -> dict[str, Any]:
        samples = int(self.confusion.sum())
        if samples == 0:
            raise dataset.DataError("the evaluation split is empty")
        true_positive = np.diag(self.confusion).astype(np.float64)

        def per_class(count: np.ndarray) -> list[float]:  # 0.0 where `count` is 0
            zeros = np.zeros(len(count))
            return np.divide(true_positive, count, out=zeros, where=count > 0).tolist()

        return {
            "accuracy": float(true_positive.sum() / samples),
            "loss": self.log_loss / samples,
            "samples": samples,
            "confusion_matrix": self.confusion.tolist(),
            "precision": per_class(self.confusion.sum(axis=0)),
            "recall": per_class(self.confusion.sum(axis=1)),
        }


def check_fits(served: ServingModel, manifest: dataset.Manifest, model_uri: str) -> None:
    """ModelError unless the model takes the dataset's images and scores its classes."""
    want = (manifest.image.shape, manifest.num_classes)
    if (served.input_shape, served.num_classes) != want:
        raise ModelError(
            f"{model_uri}: the model takes images of shape {served.input_shape} and scores "
            f"{served.num_classes} classes; the dataset's are {manifest.image.shape} and "
            f"{manifest.num_classes}: it was trained on another dataset"
        )


def evaluate(
    model_uri: str,
    dataset_uri: str,
    split: str = "test",
    batch_size: int = EVAL_BATCH_SIZE,
    saved_model_sha256: str | None = None,
) -> Evaluation:
    """Score the exported model at `model_uri` on `split` of the dataset at `dataset_uri`,
    streamed batch by batch; with `saved_model_sha256` (the trainer's digest) only if the model
    is the one that was trained."""
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    manifest = dataset.read_manifest(dataset_uri)
    scores = Scores(manifest.num_classes)
    with tempfile.TemporaryDirectory(prefix="evaluate-") as workdir:
        local = fetch_model(model_uri, workdir)
        digest = verify_digest(local, saved_model_sha256, model_uri)
        served = load_serving(local, model_uri)
        check_fits(served, manifest, model_uri)
        tf = keras_env.tensorflow()
        for images, labels in read_split(tf, manifest, split, batch_size):
            scores.add(served.predict(images.numpy(), batch_size), labels.numpy())
    return Evaluation(
        split=split,
        classes=list(manifest.classes),
        dataset_manifest_sha256=manifest.sha256,
        saved_model_sha256=digest,
        **scores.result(),
    )


class EvalOutputs(NamedTuple):
    accuracy: float
    loss: float


def evaluate_step(
    dataset: Any, saved_model: Any, metrics: Any, confusion_matrix: Any, report: Any
) -> EvalOutputs:
    """The evaluate step: `evaluate` the Model artifact against the digest in its metadata, and
    log metrics, a confusion matrix and a report (and the trainer's TensorBoard gets the test
    metrics, at its last epoch)."""
    digest = saved_model.metadata.get("saved_model_sha256")
    result = evaluate(saved_model.path, dataset.path, saved_model_sha256=digest)
    board = saved_model.metadata.get("tensorboard_uri", "")
    if board:
        from components.common.board import Board

        with tempfile.TemporaryDirectory(prefix="evaluate-board-") as workdir:
            writer = Board(keras_env.tensorflow(), board, "evaluation", Path(workdir))
            scalars = {"test_accuracy": result.accuracy, "test_loss": result.loss}
            writer.write(int(saved_model.metadata.get("epochs", 0)), scalars)
    for name in ("accuracy", "loss", "samples"):
        metrics.log_metric(name, getattr(result, name))
    confusion_matrix.log_confusion_matrix(result.classes, result.confusion_matrix)
    Path(report.path).write_text(result.to_markdown(saved_model.uri, dataset.uri, board), "utf-8")
    report.metadata["saved_model_sha256"] = result.saved_model_sha256
    return EvalOutputs(result.accuracy, result.loss)


@click.command(help="Score a SavedModel on a dataset's split.")
@click.option("--model", required=True, help="SavedModel directory (local or gs://)")
@click.option("--dataset", required=True, help="dataset directory (local or gs://)")
@click.option("--split", default="test", show_default=True, help="the split to score")
@click.option("--batch-size", type=int, default=EVAL_BATCH_SIZE, show_default=True)
@click.option("--saved-model-sha256", help="the digest the trainer recorded, to verify")
@click.option("--output-json", help="also write the evaluation as JSON here")
def command(
    model: str,
    dataset: str,
    split: str,
    batch_size: int,
    saved_model_sha256: str | None,
    output_json: str | None,
) -> int:
    """``python -m components.evaluate.evaluate --model DIR --dataset DIR``; bad input ends it
    as it ends the step (`one_line_failures`)."""
    with one_line_failures():  # ModelError and DataError are ValueErrors
        result = evaluate(model, dataset, split, batch_size, saved_model_sha256)
    text = json.dumps(asdict(result), indent=2, sort_keys=True)
    if output_json:
        Path(output_json).write_text(text)
    print(f"accuracy={result.accuracy:.4f} loss={result.loss:.4f} samples={result.samples}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return int(run_command(command, argv, "python -m components.evaluate.evaluate"))


if __name__ == "__main__":
    sys.exit(main())
