"""Compile the pipeline into one YAML file for the KFP UI, the client and schedules. Runs in the
pipeline's CLI process (``python -m pipeline compile``, ``make compile``).
"""

from __future__ import annotations

from pathlib import Path

from kfp import compiler

from components.common.defaults import image_refs
from components.common.failure import InputError
from components.common.storage_access import check_local_folder
from pipeline.pipeline import build_pipeline


def compile_pipeline(
    output_path: str | Path, image_registry: str | None = None, image_tag: str | None = None
) -> Path:
    """Write the compiled pipeline to `output_path` (atomically) and return it; images default
    to ``components.common.defaults``, and nothing else (who compiles, where) changes it."""
    output = Path(output_path)
    if output.is_dir():
        raise InputError(f"--output {output_path} is a folder: name the YAML file to write")
    check_local_folder("--output's folder", output.parent)  # one line, before anything is written
    output.parent.mkdir(parents=True, exist_ok=True)
    pipeline_func = build_pipeline(image_refs(image_registry, image_tag))
    tmp = output.with_name(f".{output.stem}.tmp.yaml")
    compiler.Compiler().compile(pipeline_func, str(tmp))
    tmp.replace(output)
    return output
