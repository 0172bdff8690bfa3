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
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from components.common import dataset, storage
from components.common.defaults import MIN_ACCURACY, MODEL_NAME, PRODUCTION_ALIAS
from components.common.model_files import ModelError, fetch_model
from components.evaluate.saved_model import check_saved_model
from components.register.registry import REGISTRY_FORMAT, ModelStore, RegistryError, check_name


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
        """The decision as a short Markdown report (the KFP ``decision`` output)."""
        lines = [
            "# Registration",
            "",
            f"**{self.decision}**",
            "",
            f"- model: `{self.model_name}`",
            f"- accuracy: {self.accuracy:.4f}, loss: {self.loss:.4f}",
            f"- registered: {'yes, version ' + str(self.version) if self.registered else 'no'}",
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


def read_run_summary(uri: str) -> dict[str, Any]:
    """The trainer's run summary: a JSON object at `uri` (local or gs://)."""
    try:
        data = storage.read_bytes(uri)
    except FileNotFoundError as exc:
        raise ValueError(f"run summary {uri}: missing") from exc
    except IsADirectoryError as exc:
        raise ValueError(f"run summary {uri}: is a directory, expected a JSON file") from exc
    try:
        summary = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"run summary {uri}: not valid JSON ({exc})") from exc
    if not isinstance(summary, dict):
        raise ValueError(f"run summary {uri}: expected a JSON object")
    return summary


def _check_score(name: str, value: float, upper: float | None) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (upper is not None and value > upper):
        bound = f"in 0..{upper}" if upper is not None else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


def challenger_wins(candidate: dict[str, Any], champion: dict[str, Any] | None) -> tuple[bool, str]:
    """Champion/challenger rule: higher accuracy wins; equal accuracy, lower loss wins."""
    if champion is None:
        return True, "no production version yet"
    new, old = candidate["metrics"], champion.get("metrics", {})
    old_acc, old_loss = float(old.get("accuracy", -1.0)), float(old.get("loss", math.inf))
    version = champion.get("version")
    if new["accuracy"] > old_acc:
        return True, f"accuracy {new['accuracy']:.4f} > {old_acc:.4f} of version {version}"
    if new["accuracy"] == old_acc and new["loss"] < old_loss:
        return True, (
            f"accuracy ties version {version} at {old_acc:.4f} and loss "
            f"{new['loss']:.4f} < {old_loss:.4f}"
        )
    return False, f"accuracy {new['accuracy']:.4f} does not beat {old_acc:.4f} of version {version}"


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
    now: Callable[[], datetime] | None = None,
) -> Decision:
    """Gate, publish and maybe promote the SavedModel at `model_uri`.

    All inputs are checked before the registry is touched: a bad parameter, a missing or
    corrupt run summary, dataset manifest or model raise (ValueError, DataError, ModelError)
    and leave the registry as it was.
    """
    clock = now or (lambda: datetime.now(timezone.utc))
    accuracy = _check_score("accuracy", accuracy, 1.0)
    loss = _check_score("loss", loss, None)
    min_accuracy = _check_score("min_accuracy", min_accuracy, 1.0)
    if not pipeline_run_id.strip():
        raise ValueError("pipeline_run_id is empty")
    check_name("alias", alias)
    store = ModelStore(registry_root, model_name)
    summary = read_run_summary(run_summary_uri)
    manifest = dataset.read_manifest(dataset_uri)

    with tempfile.TemporaryDirectory(prefix="register-model-") as workdir:
        local_model = fetch_model(model_uri, workdir)
        check_saved_model(local_model, model_uri)

        def decide(
            registered: bool, promoted: bool, version: int, text: str, **kw: Any
        ) -> Decision:
            uri = store.version_uri(version) if registered else ""
            return Decision(
                registered, promoted, version, text, uri, model_name, accuracy, loss, **kw
            )

        previous = store.find_run(pipeline_run_id)
        if previous is not None and "decision" in previous:
            version = int(previous["version"])
            return decide(
                True,
                bool(previous["promoted"]),
                version,
                f"already registered by run {pipeline_run_id} as version {version}: "
                f"{previous['decision']}",
            )
        if previous is None and accuracy < min_accuracy:
            return decide(
                False,
                False,
                0,
                f"not registered: accuracy {accuracy:.4f} < minimum {min_accuracy:.4f}",
            )

        started = clock().isoformat()
        if previous is not None:  # an earlier attempt of this run stopped half way: finish it
            version = int(previous["version"])
        else:
            version = store.claim_next_version(
                {"pipeline_run_id": pipeline_run_id, "claimed_at": started}
            )
            if not store.bind_run(
                pipeline_run_id, {"pipeline_run_id": pipeline_run_id, "version": version}
            ):
                bound = store.find_run(pipeline_run_id)  # the same run registering concurrently
                version = int(bound["version"]) if bound else version
        metrics = {"accuracy": accuracy, "loss": loss, "min_accuracy": min_accuracy}
        metadata = {
            "format": REGISTRY_FORMAT,
            "model_name": model_name,
            "version": version,
            "metrics": metrics,
            "dataset": {
                "uri": dataset_uri,
                "manifest_sha256": manifest.sha256,
                "counts": {split: manifest.count(split) for split in manifest.splits},
                "source": manifest.raw.get("source", {}),
            },
            "run_summary": summary,
            "pipeline_run_id": pipeline_run_id,
            "registered_at": started,
            "image_refs": dict(image_refs or {}),
            "source_model_uri": model_uri,
        }
        version_uri = store.publish(version, local_model, metadata)

    candidate = {
        "version": version,
        "metrics": metrics,
        "pipeline_run_id": pipeline_run_id,
        "version_uri": version_uri,
        "promoted_at": clock().isoformat(),
    }
    promoted, reason, champion = store.move_alias_if(alias, candidate, challenger_wins)
    verdict = f"promoted to {alias}" if promoted else f"not promoted to {alias}"
    text = f"registered as version {version}; {verdict}: {reason}"
    store.update_run(
        pipeline_run_id,
        {
            "pipeline_run_id": pipeline_run_id,
            "version": version,
            "promoted": promoted,
            "decision": text,
        },
    )
    champion_acc = champion.get("metrics", {}).get("accuracy") if champion else None
    return decide(
        True,
        promoted,
        version,
        text,
        champion_version=champion.get("version") if champion else None,
        champion_accuracy=float(champion_acc) if champion_acc is not None else None,
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
