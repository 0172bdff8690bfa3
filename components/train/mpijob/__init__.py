"""The MPIJob backend of the train component: manifest, schema check, lifecycle, dry run."""

from components.train.mpijob.lifecycle import (
    MPIJobCancelled,
    MPIJobError,
    MPIJobFailed,
    RunCheckError,
    run_mpijob,
)
from components.train.mpijob.manifest import MPIJobParams, build_manifest, job_name
from components.train.mpijob.validate import ManifestError, validate_manifest

__all__ = [
    "MPIJobCancelled",
    "MPIJobError",
    "MPIJobFailed",
    "MPIJobParams",
    "ManifestError",
    "RunCheckError",
    "build_manifest",
    "job_name",
    "run_mpijob",
    "validate_manifest",
]
