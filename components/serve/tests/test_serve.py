"""`make serve`'s server for real, on a free loopback port, answering held-out digits over the V1
protocol, checked against the evaluate step on the same digits."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.common.defaults import EVAL_BATCH_SIZE
from components.common.failure import ExitCode
from components.common.model_files import load_serving
from components.common.tests.datasets import read_arrays, save_image
from components.register.tests.registering import register_run
from components.serve import server
from standins.fake_gcs import free_port
from standins.waiting import HANG_S, wait_until
from tests.conftest import summary_json

MODEL = "mnist-cnn"


@pytest.fixture(scope="session")
def challenger_model(tiny_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A second real SavedModel (another seed, 1 epoch), predicting otherwise."""
    from tests.conftest import train_small

    return train_small(tiny_dataset, 3, 1, tmp_path_factory.mktemp("challenger") / "model")


def register_model(model: Any, root: str, run_id: str, accuracy: float, tmp_path: Path) -> Any:
    summary = tmp_path / f"{run_id}-summary.json"
    summary.write_text(summary_json(model.saved_model_sha256, world_size=1))
    return register_run(model, str(summary), root, run_id, accuracy)


@contextmanager
def running(
    root: str, log: list[str] | None = None, model: str = MODEL
) -> Iterator[tuple[str, str]]:
    """``python -m components.serve`` on a free loopback port, serving `model`: yields (its
    banner, its URL); `log` gets everything it printed once it has stopped."""
    port = free_port()
    command = [sys.executable, "-m", "components.serve", "--registry-root", root]
    command += ["--model-name", model]
    proc = subprocess.Popen(
        [*command, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        for line in proc.stdout or []:
            lines.append(line)
            if line.startswith("serving "):
                break
        assert proc.poll() is None, "".join(lines)
        url = f"http://127.0.0.1:{port}/v1/models/{model}:predict"
        wait_until(
            lambda: _answers(port, model),
            f"answer from the server on port {port}",
            alive=lambda: proc.poll() is None,
            poll_s=0.2,
        )
        yield lines[-1].strip(), url
    finally:
        proc.terminate()
        lines += proc.communicate(timeout=HANG_S)[0].splitlines(keepends=True)
        if log is not None:
            log += lines


def _answers(port: int, model: str = MODEL) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/{model}", timeout=5):
            return True
    except OSError:
        return False


def post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def served(url: str, images: np.ndarray) -> np.ndarray:
    """The predictions for `images`, sent as (n, 28, 28) digits, as the README's request does."""
    rows = []
    for start in range(0, len(images), 200):
        digits = images[start : start + 200, ..., 0]
        status, answer = post(url, {"instances": digits.tolist()})
        assert status == 200, answer
        rows += answer["predictions"]
    return np.asarray(rows)


def evaluate_step_predictions(model_dir: str, images: np.ndarray) -> np.ndarray:
    return load_serving(model_dir, model_dir).predict(images, EVAL_BATCH_SIZE)  # evaluate's


def test_serves_the_champion_with_the_evaluate_steps_predictions(
    trained_model, challenger_model, tmp_path: Path
) -> None:
    """Champion (version 1) and a newer version that was not promoted: the champion is served,
    its predictions and accuracy those of the evaluate step. Bad requests get 400 naming the
    shape and the server goes on. A promoted version is served after a restart."""
    from components.evaluate.evaluate import Scores, evaluate

    root = str(tmp_path / "registry")
    assert register_model(trained_model, root, "run-a", 0.90, tmp_path).promoted
    assert not register_model(challenger_model, root, "run-b", 0.80, tmp_path).promoted  # v2
    images, labels = read_arrays(trained_model.dataset, "test")
    champion = evaluate_step_predictions(trained_model.path, images)
    challenger = evaluate_step_predictions(challenger_model.path, images)
    assert (champion.argmax(1) != challenger.argmax(1)).any()  # the two models can be told apart
    log: list[str] = []
    with running(root, log) as (banner, url):
        assert banner.startswith(f"serving {MODEL} version 1 (production) from ")
        got = served(url, images)
        np.testing.assert_allclose(got, champion, atol=1e-5)
        assert (got.argmax(1) == champion.argmax(1)).all()
        expected = evaluate(trained_model.path, trained_model.dataset)
        scores = Scores(10)
        scores.add(got, labels)
        assert scores.result()["accuracy"] == expected.accuracy
        files = _image_files_get_their_class_names(url, images[:5], champion[:5], tmp_path)
        reasons = _bad_requests_get_400(url, images, files)
        assert post(url, {"instances": images[:3].tolist()})[0] == 200  # still serving
    # the server logs one line per rejected request, with its reason, and no traceback
    rejected = [line for line in log if f"rejected POST /v1/models/{MODEL}:predict (400): " in line]
    assert [reason in line for reason, line in zip(reasons, rejected, strict=True)] == [True] * 10
    assert not [line for line in log if "Traceback" in line or "Exception" in line]
    assert register_model(challenger_model, root, "run-c", 0.95, tmp_path).version == 3
    with running(root) as (banner, url):
        assert banner.startswith(f"serving {MODEL} version 3 (production) from ")
        np.testing.assert_allclose(served(url, images[:50]), challenger[:50], atol=1e-5)


def _image_files_get_their_class_names(
    url: str, images: np.ndarray, expected: np.ndarray, tmp_path: Path
) -> list[dict[str, str]]:
    """Held-out digits sent as PNG files (TF Serving's binary form, as ``--image`` writes it)
    get the probabilities their pixels get from ``serving_default`` (PNG is lossless, and they
    are at the model's size), and their top class's name; returns the files' instances."""
    paths = [str(save_image(tmp_path / f"digit-{k}.png", image)) for k, image in enumerate(images)]
    request = json.loads(server.image_request(paths))
    assert request["signature_name"] == "serving_bytes" and len(request["instances"]) == 5
    status, answer = post(url, request)
    assert status == 200, answer
    got = np.asarray([p["probabilities"] for p in answer["predictions"]])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [p["class_name"] for p in answer["predictions"]] == [str(c) for c in got.argmax(1)]
    return request["instances"]


def _bad_requests_get_400(url: str, images: np.ndarray, files: list[dict[str, str]]) -> list[str]:
    """Each bad request gets 400 naming what is wrong; returns the reasons, in order."""
    shape = "1 <= n <= 256 images: pixel arrays of shape (n, 28, 28, 1) or (n, 28, 28)"
    digit = images[0, ..., 0].tolist()
    cases = [
        ({"instances": [row[:27] for row in digit]}, "instances have shape (28, 27)"),
        ({"instances": [digit[:27]]}, "instances have shape (1, 27, 28)"),
        ({"instances": [[["a"] * 28] * 28]}, "values, not numbers"),
        ({"instances": [digit] * 257}, "257 instances"),
        ({"instances": []}, "0 instances"),
        ({"instances": [[[300] * 28] * 28]}, "pixel values span 300..300"),
        ({"inputs": [digit]}, 'no "instances" list'),
        ({"instances": [files[0], digit]}, 'instances mix {"b64": ...} files with other values'),
        ({"instances": [{"b64": "not base64!"}]}, 'an instance\'s "b64" is not valid base64'),
        ({"instances": [{"b64": "aGVsbG8="}]}, "an image file cannot be decoded"),
    ]
    for body, reason in cases:
        status, answer = post(url, body)
        assert status == 400, (reason, answer)
        assert reason in answer["error"] and shape in answer["error"], answer
    return [reason for _, reason in cases]


def serve_command(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "components.serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_no_production_version_says_so_in_one_line_and_points_at_make_run(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    proc = serve_command("--registry-root", str(empty))
    assert (proc.returncode, proc.stdout) == (ExitCode.BAD_INPUT, "")
    assert proc.stderr.splitlines() == [
        f"FAILED: no production version of {MODEL} in {empty}: train and register one with "
        "`make run` first"
    ]
    assert not empty.exists()  # nothing written


def test_a_gs_registry_without_credentials_is_one_line(no_credentials: dict[str, str]) -> None:
    command = [sys.executable, "-m", "components.serve", "--registry-root", "gs://my-bucket/reg"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=no_credentials)
    assert (proc.returncode, proc.stdout) == (ExitCode.BAD_INPUT, "")
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "FAILED: --registry-root gs://my-bucket/reg: this process's identity found no Google "
        "credentials to reach bucket 'my-bucket'; "
    )


def test_a_bad_registry_and_a_taken_port_are_one_line(trained_model, tmp_path: Path) -> None:
    """A registry the server cannot read, and a port another process holds, end in one line
    (a RegistryError must not escape with its traceback)."""
    root = tmp_path / "registry"
    assert register_model(trained_model, str(root), "run-a", 0.90, tmp_path).promoted
    alias = root / MODEL / "_aliases" / "production.json"
    good = alias.read_text()
    alias.write_text("[1]")
    files = {path: path.stat().st_mtime_ns for path in root.rglob("*")}
    bad = serve_command("--registry-root", str(root))
    assert (bad.returncode, bad.stdout) == (ExitCode.BAD_INPUT, "")
    assert bad.stderr.splitlines() == [f"FAILED: {alias}: expected a JSON object"]
    assert {path: path.stat().st_mtime_ns for path in root.rglob("*")} == files  # untouched
    alias.write_text(good)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = serve_command("--registry-root", str(root), "--port", str(port))
    assert busy.returncode == ExitCode.BAD_INPUT
    assert busy.stderr.splitlines()[-1].startswith(f"FAILED: cannot listen on 127.0.0.1:{port}: ")
    assert "Traceback" not in busy.stderr


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([1, 2], "the body is not a JSON object (send it with Content-Type: application/json)"),
        (b"instances=1", "the body is not a JSON object"),
        ({"instances": {"a": 1}}, 'no "instances" list'),
        ({"instances": [[[1] * 28] * 28, [[1] * 28] * 27]}, "instances are ragged"),
        ({"instances": [[[True] * 28] * 28]}, "instances hold bool values, not numbers"),
        ({"instances": [[[float("nan")] * 28] * 28]}, "pixel values span nan..nan"),
        ({"instances": [[[1] * 28] * 28], "signature_name": "serving_bytes"}, "signature_name"),
    ],
)
def test_what_a_predictor_refuses(trained_model, body: Any, reason: str) -> None:
    from components.serve.predictor import answer

    with pytest.raises(ValueError) as info:
        answer(body, load_serving(trained_model.path, "m"), 256)
    assert str(info.value).startswith(reason) and "(n, 28, 28, 1) or (n, 28, 28)" in str(info.value)


def test_example_prints_a_request_of_held_out_digits(capsys) -> None:
    from components.data_prep.sources import list_source

    assert server.main(["--example", "2"]) == 0
    out, err = capsys.readouterr()
    digits = list_source("bundled")  # the held-out digits, as data prep lists them
    rows = [i.row for i in digits.items if i.split == "test"][:2]
    images, labels = digits.arrays
    assert json.loads(out) == {"instances": images[rows].tolist()}
    assert err == f"labels: {labels[rows[0]]} {labels[rows[1]]}\n"
    assert server.main(["--example", "257"]) == 2  # a usage error
    assert "--example must be 1..256, got 257" in capsys.readouterr().err


def test_image_prints_a_request_of_image_files_or_says_which_is_missing(
    tmp_path: Path, capsys
) -> None:
    png = save_image(tmp_path / "x.png", np.zeros((4, 4), np.uint8))
    assert server.main(["--image", str(png)]) == 0
    request = json.loads(capsys.readouterr().out)
    assert request["signature_name"] == "serving_bytes"
    assert request["instances"] == [{"b64": base64.b64encode(png.read_bytes()).decode()}]
    with pytest.raises(SystemExit, match="^2$"):
        server.main(["--image", str(tmp_path / "nope.jpg")])
    assert capsys.readouterr().err.splitlines() == [
        f"FAILED: --image {tmp_path / 'nope.jpg'}: cannot be read (No such file or directory)"
    ]


@pytest.mark.parametrize("port", ["-1", "0", "99999"])
def test_a_bad_port_is_one_line_before_the_registry_or_the_model(port: str, tmp_path: Path) -> None:
    """Checked first (it came after 10-17 s of loading the model): a registry that does not
    exist is not even looked at."""
    proc = serve_command("--registry-root", str(tmp_path / "nothing"), "--port", port)
    assert (proc.returncode, proc.stdout) == (ExitCode.BAD_INPUT, "")
    assert proc.stderr.splitlines() == [f"FAILED: --port must be 1..65535, got {port}"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_shuts_the_server_down_in_one_line(
    trained_model, tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C on `make serve`: uvicorn's graceful shutdown, one STOPPED line, exit 0 (so make adds
    no error line of its own), and no KeyboardInterrupt traceback."""
    root = str(tmp_path / "registry")
    assert register_model(trained_model, root, "run-a", 0.90, tmp_path).promoted
    port = free_port()
    command = [sys.executable, "-m", "components.serve", "--registry-root", root]
    proc = subprocess.Popen(
        [*command, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_until(lambda: _answers(port), "the server's answer", alive=lambda: proc.poll() is None)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, out + err
    assert out.splitlines()[-1] == (
        f"STOPPED: {sig.name}: the server shut down; {MODEL} is no longer served"
    )
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
