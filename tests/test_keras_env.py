"""The trainer selects Keras 2 through components/common/keras_env.py before it imports
Horovod, so Horovod 0.28.1's callbacks get Keras 2's backend (tf_keras), never Keras 3's.

Each check runs in a fresh interpreter, without TF_USE_LEGACY_KERAS in its environment: what
matters is the order of first imports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not importorskip: importing horovod.tensorflow binds tf.keras to Keras 3 in this process.
# In CI (CI set) the tests run regardless, so a missing Horovod fails them instead of skipping.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None and not os.environ.get("CI"),
    reason="needs Horovod (make install)",
)

# A rank's real path (python -m components.train -> cli.main -> trainer.run), stopped by the
# preflight (1 rank, 2 expected) right after hvd.init(); then what Horovod's Keras API got.
TRAINER_PROBE = """
import json, sys
from components.train.cli import main
from components.common.failure import ExitCode
assert main(["--data", {data!r}, "--output", {out!r}, "--workers", "2"]) == ExitCode.PREFLIGHT
import horovod.tensorflow.keras as hvd_keras
import horovod.tensorflow.keras.callbacks as callbacks
import tensorflow as tf
import tf_keras
print(json.dumps({{
    "callbacks_K": callbacks.K.__name__,
    "K_is_tf_keras_backend": callbacks.K is tf_keras.backend and hvd_keras.K is tf_keras.backend,
    "K_has_constant": hasattr(callbacks.K, "constant"),
    "tf_keras_model": tf.keras.Model.__module__,
    "keras3_modules": sorted(m for m in sys.modules if m.startswith("keras.src")),
}}))
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env
    )


def test_trainer_gives_horovod_callbacks_the_keras2_backend(tmp_path: Path) -> None:
    proc = _python(TRAINER_PROBE.format(data=str(tmp_path / "no-data"), out=str(tmp_path / "out")))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["callbacks_K"] == "tf_keras.backend"
    assert result["K_is_tf_keras_backend"] is True
    assert result["K_has_constant"] is True  # what MetricAverageCallback needs
    assert result["tf_keras_model"].startswith("tf_keras.")
    assert result["keras3_modules"] == []


def test_importing_the_trainer_loads_no_keras_or_tensorflow() -> None:
    """Nothing happens at import: the selection is made by calling keras_env.keras()."""
    proc = _python(
        "import sys, os\n"
        "from components.train import cli, trainer, model\n"
        "from components.evaluate import evaluate\n"
        "from components.common import keras_env\n"
        "loaded = [m for m in ('tensorflow', 'keras', 'tf_keras', 'horovod') if m in sys.modules]\n"
        "print(loaded, os.environ.get('TF_USE_LEGACY_KERAS'))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] None"


def test_horovod_imported_before_keras_env_is_refused() -> None:
    """Horovod's Keras API imported first binds Keras 3's backend: keras_env.keras() says so."""
    proc = _python(
        "import horovod.tensorflow.keras\n"
        "from components.common import keras_env\n"
        "try:\n"
        "    keras_env.keras()\n"
        "except keras_env.Keras3Loaded as exc:\n"
        "    print('refused:', exc)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("refused: ")


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
