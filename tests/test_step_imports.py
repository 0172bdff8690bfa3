"""The overhead rule, asserted on real runs: a step imports TensorFlow only where it needs
it, and only once. Data prep never does; the train step's own process does not either (only its
ranks, each once, in its own process), so a train step pays TensorFlow's import once per rank.
Registration has its own test (components/register/tests/test_register.py); evaluation needs
TensorFlow to load the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import json, sys
from components.data_prep.prep import main as prep
from components.train.config import TrainConfig
from components.train.step.program import train_locally

seen = {{}}
assert prep(["--output", {data!r}, "--data-limit", "400", "--shard-size", "200"]) == 0
seen["data prep"] = sorted(m for m in ("tensorflow", "keras", "horovod") if m in sys.modules)
# data and output are the artifacts' URIs on a cluster; train_locally uses the local paths
config = TrainConfig(data="gs://b/data", output="gs://b/out", workers=2, epochs=1,
                     batch_size_per_worker=32, threads_per_worker=1, model="small")
summary = train_locally(config, {data!r}, {model!r}, log=lambda line: None)
seen["train step"] = sorted(m for m in ("tensorflow", "keras", "horovod.tensorflow")
                            if m in sys.modules)
seen["world_size"] = summary.world_size
print("SEEN=" + json.dumps(seen))
"""


@pytest.mark.horovod
def test_data_prep_and_the_train_steps_process_import_no_tensorflow(tmp_path: Path) -> None:
    data, model = tmp_path / "data", tmp_path / "artifacts" / "model"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(data=str(data), model=str(model))],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("SEEN=")]
    seen = json.loads(line.removeprefix("SEEN="))
    assert seen == {"data prep": [], "train step": [], "world_size": 2}
    assert (model / "saved_model.pb").is_file()  # the ranks did import it, and trained
