"""What a registration decides, and from which checked inputs: the candidate, the
champion/challenger rule and the decision with its one-line reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from components.register.registry import ModelStore, check_name


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


@dataclass(frozen=True)
class Candidate:
    """The checked inputs of one registration: which model, from which run, with what scores."""

    model_uri: str
    model_name: str
    run_id: str
    alias: str
    accuracy: float
    loss: float
    min_accuracy: float

    @property
    def metrics(self) -> dict[str, float]:
        """The scores stored with the version and compared by champion/challenger."""
        return {"accuracy": self.accuracy, "loss": self.loss, "min_accuracy": self.min_accuracy}

    def decision(
        self,
        store: ModelStore,
        version: int,
        text: str,
        promoted: bool = False,
        champion: dict[str, Any] | None = None,
    ) -> Decision:
        """The outcome for this candidate: registered as `version` (0: not registered)."""
        champion_acc = champion.get("metrics", {}).get("accuracy") if champion else None
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
            champion_accuracy=float(champion_acc) if champion_acc is not None else None,
        )


def check_inputs(
    model_uri: str,
    model_name: str,
    pipeline_run_id: str,
    alias: str,
    scores: tuple[float, float, float],
) -> Candidate:
    """The registration's parameters, checked: `scores` is (accuracy, loss, min_accuracy)."""
    accuracy, loss, min_accuracy = scores
    if not pipeline_run_id.strip():
        raise ValueError("pipeline_run_id is empty")
    return Candidate(
        model_uri=model_uri,
        model_name=check_name("model name", model_name),
        run_id=pipeline_run_id,
        alias=check_name("alias", alias),
        accuracy=_check_score("accuracy", accuracy, 1.0),
        loss=_check_score("loss", loss, None),
        min_accuracy=_check_score("min_accuracy", min_accuracy, 1.0),
    )
