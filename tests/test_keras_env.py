"""The trainer runs Keras 3 on its TensorFlow backend through components/common/keras_env.py,
and Horovod's Keras API (the project's patched build) works on it: Keras 2 (tf-keras) is
neither installed nor selected, and another backend is refused by name.

Each check runs in a fresh interpreter: what matters is what a process imports first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not importorskip: in CI (CI set) the tests run regardless, so a missing Horovod fails them.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None and not os.environ.get("CI"),
    reason="needs Horovod (make install)",
)

# A rank's real path (python -m components.train.rank -> cli.main -> trainer.run), stopped by the
# preflight (1 rank, 2 expected) right after hvd.init(); then what Keras and Horovod are.
TRAINER_PROBE = """
import importlib.util, json, sys
from components.train.rank.cli import main
from components.common.failure import ExitCode
assert main(["--data", {data!r}, "--output", {out!r}, "--workers", "2"]) == ExitCode.PREFLIGHT
import horovod.tensorflow.keras as hvd
import keras, tensorflow as tf
optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
print(json.dumps({{
    "keras": keras.__version__, "backend": keras.backend.backend(),
    "tf_keras_is_keras": tf.keras.Model is keras.Model,
    "tf_keras_installed": importlib.util.find_spec("tf_keras") is not None,
    "optimizer": [type(optimizer).__module__, type(optimizer).__name__],
    "averages_in_apply": "apply" in type(optimizer).__mro__[1].__dict__,
}}))
"""


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=environment
    )


def test_the_trainer_runs_keras_3_and_horovods_optimizer_averages_in_apply(tmp_path: Path) -> None:
    proc = _python(TRAINER_PROBE.format(data=str(tmp_path / "no-data"), out=str(tmp_path / "out")))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["keras"].startswith("3.") and result["backend"] == "tensorflow"
    assert result["tf_keras_is_keras"] is True
    assert result["tf_keras_installed"] is False  # not in the lock, not in the images
    # The wrapped class keeps Adam's name and module (a saved model loads without Horovod); the
    # Horovod mix-in before it overrides Keras 3's public hook, `apply`.
    assert result["optimizer"] == ["keras.src.optimizers.adam", "Adam"]
    assert result["averages_in_apply"] is True


def test_importing_the_trainer_loads_no_keras_or_tensorflow() -> None:
    """Nothing happens at import: Keras is reached by calling keras_env.keras()."""
    proc = _python(
        "import sys\n"
        "from components.train.rank import cli, trainer, model\n"
        "from components.evaluate import evaluate\n"
        "from components.common import keras_env\n"
        "print([m for m in ('tensorflow', 'keras', 'horovod') if m in sys.modules])\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_keras_backend_other_than_tensorflow_is_refused_by_name(backend: str) -> None:
    proc = _python(
        "from components.common import keras_env\n"
        "try:\n"
        "    keras_env.keras()\n"
        "except keras_env.KerasSetupError as exc:\n"
        "    print(exc)\n"
        "import sys; print('keras' in sys.modules)\n",
        KERAS_BACKEND=backend,
    )
    assert proc.returncode == 0, proc.stderr
    said, imported = proc.stdout.strip().splitlines()
    assert said == (
        f"KERAS_BACKEND={backend}: Horovod's collectives are TensorFlow ops, so the trainer runs "
        "Keras 3 on its TensorFlow backend; unset KERAS_BACKEND or set it to tensorflow"
    )
    assert imported == "False"  # refused before Keras read the variable


def test_tensorflow_import_noise_is_dropped_and_nothing_else() -> None:
    """The wheels' C++ import lines (2.18's CUDA registrations, 2.21's missing-driver stub: once
    per process, so once per rank) are dropped at the first TF import; anything else native code
    writes then still comes out."""
    code = (
        "import os\n"
        "from components.common import keras_env\n"
        "with keras_env.stderr_without(keras_env.IMPORT_NOISE):\n"
        "    os.write(2, b'E0000 cuda_dnn.cc] Unable to register cuDNN factory: '\n"
        "                b'Attempting to register factory for plugin cuDNN\\n')\n"
        "    os.write(2, b'I0000 00:00:1796410369.275781    8731 cudart_stub.cc:31] Could not '\n"
        "                b'find cuda drivers on your machine, GPU will not be used.\\n')\n"
        "    os.write(2, b'a real error\\n')\n"
        "keras_env.keras()\n"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert "a real error" in out.stderr
    assert "Unable to register" not in out.stderr
    assert "absl::InitializeLog" not in out.stderr
    assert "Could not find cuda drivers" not in out.stderr
