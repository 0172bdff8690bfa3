"""Pipelines and their versions: the compiled package, git-named versions, upload, look-up.

kfp.Client does the uploading (``upload_pipeline_version``) and the version GET; creating the
pipeline goes to the generated ``pipeline_service_create_pipeline`` because kfp.Client's
``upload_pipeline`` would name the first version after the pipeline instead of the commit.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kfp
import kfp_server_api
import yaml

from components import __version__
from pipeline.ops.api import call, named
from pipeline.ops.errors import AlreadyExistsError, NotFoundError, OpsError
from pipeline.ops.parameters import unwrap_spec

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def read_pipeline_spec(package_path: str | Path) -> dict[str, Any]:
    """Return the PipelineSpec (first YAML document) of a compiled pipeline package."""
    path = Path(package_path)
    if not path.is_file():
        raise OpsError(
            f"pipeline package {path} does not exist; compile it first "
            "(python -m pipeline compile --output build/pipeline.yaml)"
        )
    if path.suffix not in (".yaml", ".yml"):
        raise OpsError(f"pipeline package {path} must be a .yaml or .yml file")
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except yaml.YAMLError as exc:
        raise OpsError(f"pipeline package {path} is not valid YAML: {exc}") from exc
    spec = docs[0] if docs else None
    if not isinstance(spec, dict) or "root" not in spec or "pipelineInfo" not in spec:
        raise OpsError(
            f"{path} is not a compiled KFP v2 pipeline (no 'root' and 'pipelineInfo' sections)"
        )
    return spec


def pipeline_name_of(spec: Mapping[str, Any]) -> str:
    """Return the pipeline name a compiled spec declares (``pipelineInfo.name``)."""
    name = unwrap_spec(spec).get("pipelineInfo", {}).get("name")
    if not name:
        raise OpsError("the pipeline spec has no pipelineInfo.name")
    return str(name)


def _git(args: Sequence[str], cwd: Path) -> str:
    """Run ``git ARGS`` in `cwd` and return its stripped stdout."""
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=30
    )
    if result.returncode != 0:
        raise OpsError(
            f"git {' '.join(args)} failed in {cwd}: {result.stderr.strip() or result.returncode}"
            "; pass --version-name to name the version yourself"
        )
    return result.stdout.strip()


def git_version_name(repo: str | Path | None = None, package_version: str = __version__) -> str:
    """Return ``<package version>-g<short commit>[-dirty]``, e.g. ``0.1.0-g1a2b3c4``.

    ``-dirty`` is added when tracked files have uncommitted changes (as ``git describe
    --dirty`` does; untracked files do not count).
    """
    cwd = Path(repo) if repo is not None else PROJECT_ROOT
    try:
        commit = _git(["rev-parse", "--short=7", "HEAD"], cwd)
        dirty = bool(_git(["status", "--porcelain", "--untracked-files=no"], cwd))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OpsError(
            f"cannot run git in {cwd} ({exc}); pass --version-name to name the version yourself"
        ) from exc
    return f"{package_version}-g{commit}" + ("-dirty" if dirty else "")


def find_pipeline(client: kfp.Client, name: str, namespace: str | None = None) -> Any | None:
    """Return the pipeline whose display name is `name`, or ``None``; error if several."""
    found = named(
        f"pipeline {name!r}", client.list_pipelines, "pipelines", name, namespace=namespace
    )
    if len(found) > 1:
        ids = ", ".join(p.pipeline_id for p in found)
        raise OpsError(f"several pipelines are named {name!r} ({ids}); names must be unique")
    return found[0] if found else None


def find_pipeline_version(client: kfp.Client, pipeline_id: str, version_name: str) -> Any | None:
    """Return the version of pipeline `pipeline_id` named `version_name`, or ``None``."""
    found = named(
        f"version {version_name!r} of pipeline {pipeline_id}",
        client.list_pipeline_versions,
        "pipeline_versions",
        version_name,
        pipeline_id=pipeline_id,
    )
    return found[0] if found else None


@dataclass(frozen=True)
class UploadResult:
    """What :func:`upload` did."""

    pipeline_id: str
    version_id: str
    pipeline_name: str
    version_name: str
    created_pipeline: bool
    created_version: bool


def _create_pipeline(
    client: kfp.Client, name: str, description: str | None, namespace: str | None
) -> Any:
    """Create the empty pipeline `name` (``POST /apis/v2beta1/pipelines``) and return it."""
    body = kfp_server_api.V2beta1Pipeline(
        display_name=name, description=description, namespace=namespace
    )
    return call(
        f"create pipeline {name!r}", client.pipelines.pipeline_service_create_pipeline, body
    )


def _existing_version(
    client: kfp.Client, pipeline: Any, name: str, version_name: str, reuse_existing: bool
) -> UploadResult | None:
    """Return the kept version `version_name` if it exists and `reuse_existing`, ``None`` if it
    does not exist; raise :class:`AlreadyExistsError` if it exists and may not be reused."""
    existing = find_pipeline_version(client, pipeline.pipeline_id, version_name)
    if existing is None:
        return None
    if not reuse_existing:
        raise AlreadyExistsError(
            f"pipeline {name!r} already has a version named {version_name!r} "
            f"({existing.pipeline_version_id}); commit your change, pass another "
            "--version-name, or --reuse-existing to keep the existing one"
        )
    return UploadResult(
        pipeline.pipeline_id,
        existing.pipeline_version_id,
        name,
        version_name,
        created_pipeline=False,
        created_version=False,
    )


def upload(
    client: kfp.Client,
    package_path: str | Path,
    version_name: str,
    *,
    pipeline_name: str | None = None,
    description: str | None = None,
    namespace: str | None = None,
    reuse_existing: bool = False,
) -> UploadResult:
    """Upload `package_path` as version `version_name` of its pipeline, creating the pipeline.

    The pipeline (named `pipeline_name`, default: the package's ``pipelineInfo.name``) is
    created empty when missing (``POST /apis/v2beta1/pipelines``) so that every version,
    the first one included, carries `version_name`; the package is then uploaded with
    ``POST /apis/v2beta1/pipelines/upload_version``. A version of that name existing already
    is an error, unless `reuse_existing`, which returns it untouched (for re-run CI jobs).
    `namespace` makes the pipeline private to that namespace (multi-user KFP).
    """
    spec = read_pipeline_spec(package_path)  # a bad package fails before any request
    name = pipeline_name or pipeline_name_of(spec)
    if not version_name or not version_name.strip():
        raise OpsError("the version name is empty")
    pipeline = find_pipeline(client, name, namespace)
    created_pipeline = pipeline is None
    if pipeline is None:
        pipeline = _create_pipeline(client, name, description, namespace)
    else:
        kept = _existing_version(client, pipeline, name, version_name, reuse_existing)
        if kept is not None:
            return kept
    try:
        version = call(
            f"upload version {version_name!r} of pipeline {name!r}",
            client.upload_pipeline_version,
            pipeline_package_path=str(package_path),
            pipeline_version_name=version_name,
            pipeline_id=pipeline.pipeline_id,
            description=description,
        )
    except AlreadyExistsError as exc:  # created by someone else between the check and now
        raise AlreadyExistsError(
            f"pipeline {name!r} already has a version named {version_name!r}: {exc}"
        ) from exc
    return UploadResult(
        pipeline.pipeline_id,
        version.pipeline_version_id,
        name,
        version_name,
        created_pipeline=created_pipeline,
        created_version=True,
    )


def resolve_version(
    client: kfp.Client, pipeline_name: str, version_name: str, namespace: str | None = None
) -> tuple[Any, Any]:
    """Return ``(pipeline, version)`` for the named version, fetched with its pipeline spec."""
    pipeline = find_pipeline(client, pipeline_name, namespace)
    if pipeline is None:
        raise NotFoundError(
            f"no pipeline named {pipeline_name!r} on the server; upload it first "
            "(python -m pipeline upload)"
        )
    version = find_pipeline_version(client, pipeline.pipeline_id, version_name)
    if version is None:
        raise NotFoundError(f"pipeline {pipeline_name!r} has no version named {version_name!r}")
    if not version.pipeline_spec:  # list responses may omit the spec; GET has it
        version = call(
            f"get version {version_name!r} of pipeline {pipeline_name!r}",
            client.get_pipeline_version,
            pipeline_id=pipeline.pipeline_id,
            pipeline_version_id=version.pipeline_version_id,
        )
    return pipeline, version
