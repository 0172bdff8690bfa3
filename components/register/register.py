"""Register program: quality gate, champion/challenger, publish to the model store.

A model that passes the gate (``accuracy >= min_accuracy``) becomes the next numeric version
under ``<registry_root>/<model_name>/``; the alias (``production``) moves to it only if it beats
the current holder. Every outcome is returned as a :class:`Decision` with a one-line reason,
including "not registered: accuracy 0.9700 < minimum 0.9800". Re-running the same pipeline run
returns the version it already registered instead of creating another.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from components.common import dataset
from components.common.defaults import MIN_ACCURACY, MODEL_NAME, PRODUCTION_ALIAS
from components.common.model_files import (
    DIGEST_KEY,
    ModelError,
    check_digest_text,
    check_layout,
    fetch_model,
    verify_digest,
)
from components.register.decision import Candidate, Decision, challenger_wins, check_inputs
from components.register.registry import REGISTRY_FORMAT, ModelStore, RegistryError
from components.register.serving import ServingFolder
from components.train import summary as run_summary
from components.train.summary import RunSummary


def parse_image_refs(text: str) -> dict[str, str]:
    """Parse the ``image_refs`` parameter: a JSON object of component name -> image reference."""
    try:
        refs = json.loads(text or "{}")
    except ValueError as exc:
        raise ValueError(f"image_refs is not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(refs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in refs.items()
    ):
        raise ValueError(f"image_refs must be a JSON object of strings, got {text!r}")
    return refs


@dataclass(frozen=True)
class Provenance:
    """Where the candidate came from: stored with its version."""

    dataset_uri: str
    manifest: dataset.Manifest
    run_summary: RunSummary
    image_refs: dict[str, str]
    saved_model_sha256: str

    def metadata(self, candidate: Candidate, version: int, registered_at: str) -> dict[str, Any]:
        """The version's ``kfp_horovod_metadata.json``."""
        manifest = self.manifest
        return {
            "format": REGISTRY_FORMAT,
            "model_name": candidate.model_name,
            "version": version,
            "metrics": candidate.metrics,
            "dataset": {
                "uri": self.dataset_uri,
                "manifest_sha256": manifest.sha256,
                "counts": {split: manifest.count(split) for split in manifest.splits},
                "source": manifest.raw.get("source", {}),
            },
            # which model the trainer trained (the pipeline's `model` and `augment`)
            "model": self.run_summary.config.model,
            "augment": self.run_summary.config.augment,
            "run_summary": asdict(self.run_summary),
            "pipeline_run_id": candidate.run_id,
            "registered_at": registered_at,
            "image_refs": dict(self.image_refs),
            "source_model_uri": candidate.model_uri,
            DIGEST_KEY: self.saved_model_sha256,
        }


def recorded_digest(summary: RunSummary, summary_uri: str, from_artifact: str | None) -> str:
    """The ``saved_model.pb`` sha256 the trainer recorded: in the run summary and, when given,
    in the Model artifact's metadata (`from_artifact`). Both present: they must agree."""
    found = {}
    if summary.saved_model_sha256:
        found["the run summary " + summary_uri] = summary.saved_model_sha256
    if from_artifact is not None:
        found["the Model artifact's metadata"] = from_artifact
    if not found:
        raise ModelError(
            f"no {DIGEST_KEY} recorded, neither in the run summary {summary_uri} nor in the Model "
            "artifact's metadata: registration only accepts a model whose digest the trainer "
            "recorded"
        )
    digests = {check_digest_text(value, where) for where, value in found.items()}
    if len(digests) > 1:
        listed = ", ".join(f"{where} records {value}" for where, value in found.items())
        raise ModelError(f"the recorded {DIGEST_KEY} values disagree: {listed}")
    return digests.pop()


def trusted_model(
    candidate: Candidate,
    summary: RunSummary,
    summary_uri: str,
    from_artifact: str | None,
    workdir: str,
) -> tuple[Path, str]:
    """Fetch the model; check its SavedModel layout and that its ``saved_model.pb`` hashes to
    the digest the trainer recorded. Returns the local directory and the digest."""
    try:
        recorded = recorded_digest(summary, summary_uri, from_artifact)
        local = fetch_model(candidate.model_uri, workdir)
        check_layout(local, candidate.model_uri)
        return local, verify_digest(local, recorded, candidate.model_uri)
    except ModelError as exc:
        raise ModelError(f"not registering {candidate.model_name!r}: {exc}") from exc


def gate(store: ModelStore, candidate: Candidate) -> tuple[Decision | None, dict[str, Any] | None]:
    """Decide what needs no writing: a run that already registered gets its version back; a
    model below the minimum accuracy is not registered. Returns (decision or None, run record)."""
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


def claim_version(
    store: ModelStore, candidate: Candidate, previous: dict[str, Any] | None, started: str
) -> int:
    """The version this run publishes: the one an earlier attempt of the same run claimed and
    did not finish, or the next free number (bound to the run so a re-run finds it)."""
    if previous is not None:
        return int(previous["version"])
    run_id = candidate.run_id
    version = store.claim_next_version({"pipeline_run_id": run_id, "claimed_at": started})
    if store.bind_run(run_id, {"pipeline_run_id": run_id, "version": version}):
        return version
    bound = store.find_run(run_id)  # the same run registering concurrently got there first
    return int(bound["version"]) if bound else version


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
    """Gate, publish and maybe promote the SavedModel at `model_uri`.

    The model must hash to the ``saved_model_sha256`` the trainer recorded (run summary, and
    `saved_model_sha256` from the Model artifact's metadata when given). All inputs are checked
    before the registry is touched: a bad parameter, a missing or corrupt run summary, dataset
    manifest or model, a missing or unmatched digest raise (ValueError, DataError, ModelError)
    and leave the registry as it was.
    """
    clock = now or (lambda: datetime.now(timezone.utc))
    candidate = check_inputs(
        model_uri, model_name, pipeline_run_id, alias, (accuracy, loss, min_accuracy)
    )
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
        started = clock().isoformat()
        version = claim_version(store, candidate, previous, started)
        provenance = Provenance(dataset_uri, manifest, summary, image_refs or {}, digest)
        version_uri = store.publish(
            version, local_model, provenance.metadata(candidate, version, started)
        )
    return promote(store, candidate, version, version_uri, clock().isoformat())


class StepOutputs(NamedTuple):
    """The register step's output parameters."""

    registered: bool
    promoted: bool
    version: int
    decision_text: str
    version_uri: str


def register_step(
    model: Any, run_summary: Any, dataset: Any, accuracy: float, loss: float,
    min_accuracy: float, model_name: str, registry_root: str, pipeline_run_id: str,
    image_refs: str, decision: Any,
) -> StepOutputs:  # fmt: skip
    """The register step (KFP artifacts `model`, `run_summary`, `dataset`, `decision`): the
    model must hash to the ``saved_model_sha256`` the trainer recorded (in the run summary and
    the Model artifact's metadata), or nothing is registered."""
    result = register(
        model.path, run_summary.path, dataset.path, accuracy, loss,
        registry_root=registry_root, pipeline_run_id=pipeline_run_id, model_name=model_name,
        min_accuracy=min_accuracy, image_refs=parse_image_refs(image_refs),
        saved_model_sha256=model.metadata.get("saved_model_sha256"),
    )  # fmt: skip
    Path(decision.path).write_text(result.to_markdown(), encoding="utf-8")
    decision.metadata["decision"] = result.decision
    decision.metadata["version"] = result.version
    return StepOutputs(
        result.registered, result.promoted, result.version, result.decision, result.version_uri
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m components.register.register --model DIR --registry-root DIR ...``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="SavedModel directory (local or gs://)")
    parser.add_argument("--run-summary", required=True, help="the trainer's run_summary.json")
    parser.add_argument("--dataset", required=True, help="dataset directory (for its manifest)")
    parser.add_argument("--accuracy", type=float, required=True)
    parser.add_argument("--loss", type=float, required=True)
    parser.add_argument("--registry-root", required=True, help="local directory or gs:// URI")
    parser.add_argument("--pipeline-run-id", required=True)
    parser.add_argument("--model-name", default=MODEL_NAME)
    parser.add_argument("--min-accuracy", type=float, default=MIN_ACCURACY)
    parser.add_argument("--image-refs", default="{}", help="JSON object: component -> image")
    parser.add_argument("--alias", default=PRODUCTION_ALIAS)
    parser.add_argument(
        "--saved-model-sha256",
        help="the digest the trainer recorded (default: the run summary's saved_model_sha256)",
    )
    parser.add_argument("--output-json", help="also write the decision as JSON here")
    args = parser.parse_args(argv)
    try:
        decision = register(
            args.model,
            args.run_summary,
            args.dataset,
            args.accuracy,
            args.loss,
            registry_root=args.registry_root,
            pipeline_run_id=args.pipeline_run_id,
            model_name=args.model_name,
            min_accuracy=args.min_accuracy,
            image_refs=parse_image_refs(args.image_refs),
            alias=args.alias,
            saved_model_sha256=args.saved_model_sha256,
        )
    except (ValueError, ModelError, dataset.DataError, RegistryError) as exc:
        print(f"registration failed: {exc}", file=sys.stderr)
        return 2
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(asdict(decision), indent=2, sort_keys=True))
    print(decision.decision)
    return 0


if __name__ == "__main__":
    sys.exit(main())
