"""The CRD-schema check every cluster manifest passes before it is printed or sent: the
vendored CRDs are found from the project, each packaged copy equals its CRD, and the packaged
copy is what validates where the CRD is absent (the trainer image)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.common import crd as crds
from components.common.crd import Crd
from components.train.cluster.mpijob import MPIJOB
from components.train.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB

ALL = [MPIJOB, TRAINJOB, TRAINING_RUNTIME]


@pytest.mark.parametrize("crd", ALL, ids=lambda c: c.kind)
def test_crd_is_found_from_the_project_and_a_missing_or_wrong_crd_is_named(
    crd: Crd, tmp_path: Path
) -> None:
    path = crds.find_crd(crd)
    assert path.name == crd.relative_path.name
    assert crds.load_schema(crd, str(path))["properties"]["spec"]["additionalProperties"] is False
    with pytest.raises(FileNotFoundError, match=crd.relative_path.name):
        crds.find_crd(crd, tmp_path)
    other = tmp_path / "crd.yaml"
    other.write_text(yaml.safe_dump({"kind": "ConfigMap", "spec": {"group": "x"}}))
    with pytest.raises(ValueError, match=f"not the {crd.group} {crd.kind} CRD"):
        crds.load_schema(crd, str(other))
    # a CRD of another kind in the same group (TrainingRuntime, TrainJob) is not this one's
    for sibling in (c for c in ALL if c.group == crd.group and c is not crd):
        with pytest.raises(ValueError, match=f"not the {crd.group} {crd.kind} CRD"):
            crds.crd_schema(crd, crds.find_crd(sibling))


@pytest.mark.parametrize("crd", ALL, ids=lambda c: c.kind)
def test_packaged_schema_equals_the_crd_and_validates_where_the_crd_is_absent(
    crd: Crd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer image has no deploy/crd/ folder and validates, strictly, with the packaged
    copy, which must not drift from the CRD (``make crd`` rewrites the copies)."""
    assert json.loads(crd.packaged_schema.read_text()) == crds.crd_schema(crd, crds.find_crd(crd))
    crds.load_schema.cache_clear()  # read anew, where the vendored CRD cannot be read
    monkeypatch.setattr(crds, "find_crd", lambda *_: pytest.fail("the vendored CRD was read"))
    assert crds.load_schema(crd)["properties"]["spec"]["additionalProperties"] is False
