"""Register program: quality gate, champion/challenger, publish to the model store; every outcome
a `Decision` with a one-line reason. Runs in the register step's pod (or the CLI's process). The
rules, and how the steps below follow the process: components/register/README.md.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from components.common import dataset, model_files, storage
from components.common.declare import declared_options, run_command
from components.common.defaults import MIN_ACCURACY, MODEL_NAME, PRODUCTION_ALIAS
from components.common.failure import InputError, one_line_failures
from components.common.model_files import DIGEST_KEY, ModelError
from components.register.registry import REGISTRY_FORMAT, ModelStore, challenger_wins, check_name
from components.register.serving import ServingFolder
from components.register.step_parameters import RegisterStep
from components.train import summary as run_summary
from components.train.summary import RunSummary


def parse_image_refs(text: str) -> dict[str, str]:
    """The ``--image-refs`` option: a JSON object of component name -> image reference (the
    register step gets it as a KFP ``dict`` parameter)."""
    try:
        refs = json.loads(text or "{}")
    except ValueError as exc:
        raise InputError(f"image_refs is not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(refs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in refs.items()
    ):
        raise InputError(f"image_refs must be a JSON object of strings, got {text!r}")
    return refs


@dataclass(frozen=True)
class Decision:
    """What registration did, and why."""

    registered: bool
    promoted: bool
    version: int  # 0 when not registered
    decision: str
    version_uri: str  # "" when not registered
    model_name: str
    accuracy: float
    loss: float
    champion_version: int | None = None
    champion_accuracy: float | None = None

    def to_markdown(self) -> str:
        """The KFP ``decision`` output."""
        registered = f"yes, version {self.version}" if self.registered else "no"
        lines = [
            "# Registration",
            "",
            f"**{self.decision}**",
            "",
            f"- model: `{self.model_name}`",
            f"- accuracy: {self.accuracy:.4f}, loss: {self.loss:.4f}",
            f"- registered: {registered}",
            f"- promoted: {'yes' if self.promoted else 'no'}",
        ]
        if self.version_uri:
            lines.append(f"- location: `{self.version_uri}`")
        if self.champion_version is not None:
            lines.append(
                f"- compared with: version {self.champion_version} "
                f"(accuracy {self.champion_accuracy:.4f})"
            )
        return "\n".join(lines) + "\n"


def _check_score(name: str, value: float, upper: float | None) -> None:
    if not math.isfinite(value) or value < 0 or (upper is not None and value > upper):
        bound = f"in 0..{upper}" if upper is not None else ">= 0"
        raise InputError(f"{name} must be a finite number {bound}, got {value}")


@dataclass(frozen=True)
class Candidate:
    """The inputs of one registration (ValueError naming a bad score, alias or run id)."""

    model_uri: str
    model_name: str
    run_id: str
    alias: str
    accuracy: float
    loss: float
    min_accuracy: float

    def __post_init__(self) -> None:
        if not self.run_id.strip():
            raise InputError("pipeline_run_id is empty")
        check_name("alias", self.alias)  # the model name: by ModelStore
        _check_score("accuracy", self.accuracy, 1.0)
        _check_score("loss", self.loss, None)

    @property
    def metrics(self) -> dict[str, float]:
        return {"accuracy": self.accuracy, "loss": self.loss, "min_accuracy": self.min_accuracy}

    def decision(
        self,
        store: ModelStore,
        version: int,
        text: str,
        promoted: bool = False,
        champion: dict[str, Any] | None = None,
    ) -> Decision:
        """The outcome: registered as `version` (0: not registered)."""
        old = champion.get("metrics", {}).get("accuracy") if champion else None
        return Decision(
            version > 0,
            promoted,
            version,
            text,
            store.version_uri(version) if version > 0 else "",
            self.model_name,
            self.accuracy,
            self.loss,
            champion_version=champion.get("version") if champion else None,
            champion_accuracy=float(old) if old is not None else None,
        )

    def metadata(
        self, manifest: dataset.Manifest, summary: RunSummary, provenance: dict[str, Any]
    ) -> dict[str, Any]:
        """The version's ``kfp_horovod_metadata.json`` (`provenance`: version, time, image
        references, digest)."""
        return {
            "format": REGISTRY_FORMAT,
            "model_name": self.model_name,
            "metrics": self.metrics,
            "dataset": {
                "uri": manifest.root,
                "manifest_sha256": manifest.sha256,
                "counts": {split: manifest.count(split) for split in manifest.splits},
                "image": list(manifest.image.shape),
                "classes": list(manifest.classes),
                "source": manifest.raw.get("source", {}),
            },
            "model": summary.config.model,
            "augment": summary.config.augment,
            "run_summary": asdict(summary),
            "pipeline_run_id": self.run_id,
            "source_model_uri": self.model_uri,
            **provenance,
        }


def trusted_model(
    candidate: Candidate,
    summary: RunSummary,
    summary_uri: str,
    from_artifact: str | None,
    workdir: str,
) -> tuple[Path, str]:
    """The fetched model and its digest: its ``saved_model.pb`` must hash to the digest the
    trainer recorded in the run summary and, when given, in the Model artifact's metadata
    (`from_artifact`); both present, they must agree."""
    found = {}
    if summary.saved_model_sha256:
        found["the run summary " + summary_uri] = summary.saved_model_sha256
    if from_artifact is not None:
        found["the Model artifact's metadata"] = from_artifact
    try:
        if not found:
            raise ModelError(
                f"no {DIGEST_KEY} recorded, neither in the run summary {summary_uri} nor in the "
                "Model artifact's metadata: registration only accepts a model whose digest the "
                "trainer recorded"
            )
        digests = {model_files.check_digest_text(value, where) for where, value in found.items()}
        if len(digests) > 1:
            listed = ", ".join(f"{where} records {value}" for where, value in found.items())
            raise ModelError(f"the recorded {DIGEST_KEY} values disagree: {listed}")
        local = model_files.fetch_model(candidate.model_uri, workdir)
        return local, model_files.verify_digest(local, digests.pop(), candidate.model_uri)
    except ModelError as exc:
        raise ModelError(f"not registering {candidate.model_name!r}: {exc}") from exc


def gate(store: ModelStore, candidate: Candidate) -> tuple[Decision | None, dict[str, Any] | None]:
    """What needs no writing: a run that already registered gets its version back; a model
    below the minimum is not registered. Returns (decision or None, the run's record)."""
    previous = store.find_run(candidate.run_id)
    if previous is not None and "decision" in previous:
        version = int(previous["version"])
        text = (
            f"already registered by run {candidate.run_id} as version {version}: "
            f"{previous['decision']}"
        )
        return candidate.decision(store, version, text, promoted=bool(previous["promoted"])), None
    if previous is None and candidate.accuracy < candidate.min_accuracy:
        text = (
            f"not registered: accuracy {candidate.accuracy:.4f} < "
            f"minimum {candidate.min_accuracy:.4f}"
        )
        return candidate.decision(store, 0, text), None
    return None, previous


def _contract(image: list[int], classes: list[str]) -> str:
    names = ", ".join(classes[:4]) + (", …" if len(classes) > 4 else "")
    return f"{'x'.join(map(str, image))} images of {len(classes)} classes ({names})"


def contract_problem(
    store: ModelStore, candidate: Candidate, manifest: dataset.Manifest
) -> str | None:
    """Why the model must not join `store`: the version its alias serves takes other images or
    classes, so the served model's clients could not use it. None for a registry whose alias
    holder predates these records."""
    holder, _ = store.read_alias(candidate.alias)
    if holder is None:
        return None
    version = int(holder["version"])
    held = store.read_metadata(version).get("dataset", {})
    if "image" not in held or "classes" not in held:
        return None
    mine = (list(manifest.image.shape), list(manifest.classes))
    if mine == (held["image"], held["classes"]):
        return None
    return (
        f"not registering {candidate.model_name!r}: its {candidate.alias} version {version} "
        f"takes {_contract(held['image'], held['classes'])}, this model "
        f"{_contract(*mine)}; the served model's clients could not use it: register it under "
        "a model_name of its own"
    )


def promote(
    store: ModelStore, candidate: Candidate, version: int, version_uri: str, promoted_at: str
) -> Decision:
    """Move the alias to the published `version` if it beats the holder; record the outcome."""
    record = {
        "version": version,
        "metrics": candidate.metrics,
        "pipeline_run_id": candidate.run_id,
        "version_uri": version_uri,
        "promoted_at": promoted_at,
    }
    promoted, reason, champion = store.move_alias_if(candidate.alias, record, challenger_wins)
    # The serving folder follows the alias: published into when it moved, only read when it
    # already matches (and repaired if an earlier registration died before this point).
    ServingFolder(store, candidate.alias).sync()
    verdict = "promoted to" if promoted else "not promoted to"
    text = f"registered as version {version}; {verdict} {candidate.alias}: {reason}"
    run_record = {"pipeline_run_id": candidate.run_id, "version": version}
    store.update_run(candidate.run_id, {**run_record, "promoted": promoted, "decision": text})
    return candidate.decision(store, version, text, promoted=promoted, champion=champion)


def register(
    model_uri: str,
    run_summary_uri: str,
    dataset_uri: str,
    accuracy: float,
    loss: float,
    *,
    registry_root: str,
    pipeline_run_id: str,
    model_name: str = MODEL_NAME,
    min_accuracy: float = MIN_ACCURACY,
    image_refs: dict[str, str] | None = None,
    alias: str = PRODUCTION_ALIAS,
    saved_model_sha256: str | None = None,
    now: Callable[[], datetime] | None = None,
) -> Decision:
    """Gate, publish and maybe promote the SavedModel at `model_uri`. Every input is checked
    before the registry is touched (ValueError, DataError, ModelError)."""
    clock = now or (lambda: datetime.now(timezone.utc))
    RegisterStep(  # the declared rules
        min_accuracy=float(min_accuracy), model_name=model_name, registry_root=registry_root
    )
    scores = float(accuracy), float(loss), float(min_accuracy)
    candidate = Candidate(model_uri, model_name, pipeline_run_id, alias, *scores)
    store = ModelStore(registry_root, model_name)
    summary = run_summary.read(run_summary_uri)
    manifest = dataset.read_manifest(dataset_uri)
    with tempfile.TemporaryDirectory(prefix="register-model-") as workdir:
        local_model, digest = trusted_model(
            candidate, summary, run_summary_uri, saved_model_sha256, workdir
        )
        decided, previous = gate(store, candidate)
        if decided is not None:
            return decided
        problem = contract_problem(store, candidate, manifest)
        if problem:
            raise InputError(problem)
        started = clock().isoformat()
        version = store.claim_for_run(candidate.run_id, previous, started)
        provenance = {
            "version": version,
            "registered_at": started,
            "image_refs": dict(image_refs or {}),
            DIGEST_KEY: digest,
        }
        metadata = candidate.metadata(manifest, summary, provenance)
        version_uri = store.publish(version, local_model, metadata)
    return promote(store, candidate, version, version_uri, clock().isoformat())


def below_chance(result: Decision, min_accuracy: float, evaluation: dict[str, Any]) -> str | None:
    """The warning for a model registered with a test accuracy below chance, 1 / the number of
    classes the evaluation scored (its confusion matrix's, `evaluation`: the ClassificationMetrics
    artifact's metadata), or None. The registration stands: min_accuracy is the user's."""
    matrix = evaluation.get("confusionMatrix") or {}
    classes = len(matrix.get("annotationSpecs") or matrix.get("rows") or [])
    if not result.registered or classes < 2 or result.accuracy >= 1 / classes:
        return None
    return (
        f"register: WARNING: {result.model_name} version {result.version} was registered with a "
        f"test accuracy of {result.accuracy:.4f}, below chance ({1 / classes:.4f}, 1 of the "
        f"{classes} classes the evaluation scored): min_accuracy {min_accuracy:g} let it through"
    )


def register_model_step(
    saved_model: Any,
    run_summary: Any,
    dataset: Any,
    accuracy: float,
    loss: float,
    confusion_matrix: Any,
    min_accuracy: float,
    model_name: str,
    registry_root: str,
    pipeline_run_id: str,
    image_refs: dict[str, str],
    decision: Any,
) -> tuple[bool, bool, int, str, str]:
    """The register step: the component's outputs from KFP artifacts and parameters; a line warns
    of a model registered below chance (`below_chance`)."""
    result = register(
        saved_model.path,
        run_summary.path,
        dataset.path,
        accuracy,
        loss,
        registry_root=registry_root,
        pipeline_run_id=pipeline_run_id,
        model_name=model_name,
        min_accuracy=min_accuracy,
        image_refs=dict(image_refs),
        saved_model_sha256=saved_model.metadata.get(DIGEST_KEY),
    )
    if warning := below_chance(result, min_accuracy, dict(confusion_matrix.metadata)):
        print(warning, flush=True)
    storage.write_text(decision.path, result.to_markdown())
    decision.metadata["decision"] = result.decision
    decision.metadata["version"] = result.version
    return result.registered, result.promoted, result.version, result.decision, result.version_uri


@click.command(help="Register a trained model: the quality gate, then champion or challenger.")
@click.option("--model", required=True, help="SavedModel directory (local or gs://)")
@click.option("--run-summary", required=True, help="the trainer's run_summary.json")
@click.option("--dataset", required=True, help="dataset directory (for its manifest)")
@click.option("--accuracy", type=float, required=True, help="the model's test accuracy")
@click.option("--loss", type=float, required=True, help="the model's test loss")
@click.option(
    "--pipeline-run-id",
    required=True,
    help="the run registering (a re-run gets its version back)",
)
@declared_options(RegisterStep.parameters())
@click.option("--image-refs", default="{}", help="JSON object: component -> image")
@click.option("--alias", default=PRODUCTION_ALIAS, show_default=True)
@click.option(
    "--saved-model-sha256",
    help="the digest the trainer recorded (default: the run summary's saved_model_sha256)",
)
@click.option("--output-json", help="also write the decision as JSON here")
def command(
    model: str,
    run_summary: str,
    dataset: str,
    accuracy: float,
    loss: float,
    image_refs: str,
    output_json: str | None,
    **options: Any,
) -> int:
    """``python -m components.register.register --model DIR --registry-root DIR ...``; an
    expected failure ends in one ``FAILED:`` line and its exit code."""
    with one_line_failures():  # bad input (ModelError, DataError), a RegistryError
        refs = parse_image_refs(image_refs)
        decision = register(model, run_summary, dataset, accuracy, loss, image_refs=refs, **options)
    if output_json:
        storage.write_text(output_json, json.dumps(asdict(decision), indent=2, sort_keys=True))
    print(decision.decision)
    return 0


def main(argv: list[str] | None = None) -> int:
    return int(run_command(command, argv, "python -m components.register.register"))


if __name__ == "__main__":
    sys.exit(main())
