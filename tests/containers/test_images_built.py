"""What the built images are, checked by running them: the user each runs as, that none carries
a credential, the trainer's Horovod (MPI and Gloo, built against the locked TensorFlow), its
Open MPI and its sshd and ssh client as the MPIJob uses them, and the GPU trainer built on the
CPU trainer's layers.

The Dockerfiles are not read here: what counts is what the images hold and do.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from components.common import defaults
from tests.containers.support import require_images

pytestmark = pytest.mark.containers

TRAINERS = ("trainer", "trainer_gpu")
CREDENTIAL_ENV = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|GOOGLE_APPLICATION_CREDENTIALS|AWS_|AZURE_|AUTH", re.I
)
# Key and credential files; searched where an image's own files live (not in site-packages,
# whose test fixtures include sample keys).
CREDENTIAL_FILE = re.compile(
    r"\.pem$|\.key$|\.p12$|^id_(rsa|ecdsa|ed25519)|^ssh_host_.*_key|credential|service[-_]?account"
    r"|^\.netrc$|^\.git-credentials$|^config\.json$",
    re.I,
)
SEARCHED = ("/home", "/app", "/root", "/etc/ssh", "/tmp", "/opt/python/etc")

PROBE = r"""
import json, os, pwd, shutil, sys
found = []
for top in sys.argv[1:]:
    for folder, dirs, files in os.walk(top):
        found += [os.path.join(folder, f) for f in files + [d for d in dirs if d == ".ssh"]]
user = pwd.getpwuid(os.getuid())
print(json.dumps({
    "uid": os.getuid(), "user": user.pw_name, "home": user.pw_dir, "cwd": os.getcwd(),
    "files": found, "tools": {t: shutil.which(t) for t in ("mpirun", "sshd", "ssh")},
}))
"""


def _run(client: Any, image: str, command: list[str], user: str | None = None) -> str:
    """Run `command` in a new container of `image`; its stdout (the test fails on a non-zero
    exit, showing stderr)."""
    container = client.containers.run(image, command, detach=True, user=user or "",
                                      labels={"kfp-horovod.test/images": "probe"})  # fmt: skip
    try:
        code = container.wait(timeout=300)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert code == 0, f"{image} {command}: exit {code}\n{err[-3000:]}"
    return out


def _probe(client: Any, image: str) -> dict[str, Any]:
    out = _run(client, image, ["python", "-c", PROBE, *SEARCHED])
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize("component", sorted(defaults.IMAGE_NAMES))
def test_every_image_runs_as_a_non_root_user_and_carries_no_credential(
    component: str, docker_client: Any
) -> None:
    image = require_images(docker_client, component)[component]
    config = docker_client.images.get(image).attrs["Config"]
    assert config["User"] not in ("", "root", "0"), f"{image} runs as {config['User'] or 'root'}"
    probe = _probe(docker_client, image)
    assert probe["uid"] != 0, probe
    env = [e.partition("=")[0] for e in config.get("Env") or []]
    assert not [n for n in env if CREDENTIAL_ENV.search(n)], env
    keys = [f for f in probe["files"] if CREDENTIAL_FILE.search(f.rsplit("/", 1)[-1])]
    assert keys == [], f"{image} carries key or credential files: {keys}"
    # The trainer's ~/.ssh is where the MPIJob mounts its Secret: the image has none of its own.
    assert not [f for f in probe["files"] if f.endswith("/.ssh")], probe["files"]


@pytest.mark.parametrize("component", TRAINERS)
def test_trainer_runs_as_the_mpijob_user_with_open_mpi_and_sshd(
    component: str, docker_client: Any
) -> None:
    image = require_images(docker_client, component)[component]
    probe = _probe(docker_client, image)
    home = str(defaults.MPI_SSH_AUTH_MOUNT_PATH).rsplit("/", 1)[0]
    assert (probe["uid"], probe["home"], probe["cwd"]) == (
        defaults.MPI_USER_UID, home, defaults.TRAINER_WORKDIR
    ), probe  # fmt: skip
    assert all(probe["tools"].values()), probe["tools"]
    assert defaults.MPI_SSHD_CONFIG in probe["files"], "the probe walks the user's home"
    ports = docker_client.images.get(image).attrs["Config"].get("ExposedPorts") or {}
    assert set(ports) == {f"{defaults.MPI_SSHD_PORT}/tcp"}, ports


@pytest.mark.parametrize("component", TRAINERS)
def test_trainer_horovod_has_mpi_and_gloo_and_runs_on_the_locked_tensorflow(
    component: str, docker_client: Any
) -> None:
    image = require_images(docker_client, component)[component]
    script = (
        "import json, importlib.metadata as md; from components.common import keras_env; "
        "keras_env.keras(); import horovod.tensorflow as hvd; print(json.dumps({"
        "'mpi': hvd.mpi_built(), 'gloo': hvd.gloo_built(), **{n: md.version(n) for n in "
        "('tensorflow', 'tf-keras', 'protobuf', 'horovod')}}))"
    )
    built = json.loads(_run(docker_client, image, ["python", "-c", script]).splitlines()[-1])
    assert (built["mpi"], built["gloo"]) == (True, True), built
    assert built["tensorflow"] == defaults.TENSORFLOW_VERSION, built
    assert built["horovod"] == defaults.HOROVOD_VERSION, built
    assert built["tf-keras"].startswith("2."), "Keras 3 breaks Horovod 0.28: tf-keras 2 needed"
    assert built["protobuf"].startswith("6."), "kfp 2.17 and TF 2.21 both need protobuf 6"
    # Every package is installed --no-deps: pip's own check finds nothing missing or clashing.
    assert "No broken requirements found" in _run(docker_client, image, ["pip", "check"])


@pytest.mark.parametrize("component", TRAINERS)
def test_trainer_ssh_matches_the_mpijob_contract(component: str, docker_client: Any) -> None:
    """sshd's and ssh's effective settings (``sshd -T``, ``ssh -G``), as mpirun and the
    MPIJob's Secret need them: port, keys from the Secret mount, no password, no PAM, a pid file
    the non-root user can write, and no known-hosts file (the Secret mount is read-only)."""
    image = require_images(docker_client, component)[component]
    mount, config = defaults.MPI_SSH_AUTH_MOUNT_PATH, defaults.MPI_SSHD_CONFIG
    # sshd -T loads a host key: a throwaway one made in this container (the image has none).
    script = (
        f"ssh-keygen -q -t ecdsa -N '' -f /tmp/probe-key && sshd -T -f {config} "
        "-o HostKey=/tmp/probe-key && echo --- && ssh -G worker-1"
    )
    out = _run(docker_client, image, ["bash", "-c", script])
    server_text, client_text = out.split("---\n")
    server = _settings(server_text)
    client = _settings(client_text)
    assert server["port"] == [str(defaults.MPI_SSHD_PORT)]
    assert f"{mount}/id_rsa" in server["hostkey"], server["hostkey"]
    assert server["authorizedkeysfile"] == [f"{mount}/authorized_keys"]
    assert server["pidfile"][0].startswith(mount.rsplit("/", 1)[0] + "/")
    assert (server["passwordauthentication"], server["usepam"]) == (["no"], ["no"])
    assert client["port"] == [str(defaults.MPI_SSHD_PORT)]
    assert client["userknownhostsfile"] == ["/dev/null"]
    assert client["stricthostkeychecking"] == ["false"]


def test_the_trainer_image_validates_both_backends_manifests_without_deploy(
    docker_client: Any,
) -> None:
    """The train step runs in the trainer image, which has no deploy/crd/: it checks the MPIJob,
    TrainingRuntime and TrainJob against the schemas packaged beside each backend, strictly."""
    image = require_images(docker_client, "trainer")["trainer"]
    script = (
        "import pathlib, yaml; from click.testing import CliRunner; from pipeline.cli import cli; "
        "assert not any((p / 'deploy').exists() for p in pathlib.Path.cwd().parents); "
        "args = ['--workers', '3', '--data', 'gs://b/d', '--output', 'gs://b/o']; "
        "out = [CliRunner().invoke(cli, [f'render-{kind}', *args]) "
        "for kind in ('mpijob', 'trainjob')]; "
        "print([r.exit_code for r in out]); "
        "print([d['kind'] for r in out for d in yaml.safe_load_all(r.output)])"
    )
    codes, kinds = _run(docker_client, image, ["python", "-c", script]).splitlines()[-2:]
    assert codes == "[0, 0]", codes
    assert kinds == "['MPIJob', 'TrainingRuntime', 'TrainJob']", kinds


def _settings(text: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key.lower(), []).append(value.strip())
    return values


def test_gpu_trainer_is_built_on_the_cpu_trainers_layers(docker_client: Any) -> None:
    """The CPU trainer's big layers (the base, Open MPI, TensorFlow) are the GPU trainer's own,
    the same layers from the build cache: the GPU image adds its CUDA wheels on top."""
    images = require_images(docker_client, *TRAINERS)
    cpu, gpu = (docker_client.images.get(images[c]).history() for c in TRAINERS)
    gpu_steps = {step["Id"] for step in gpu if step["Id"] != "<missing>"}
    shared = sum(step["Size"] for step in cpu if step["Id"] in gpu_steps)
    total = sum(step["Size"] for step in cpu)
    assert shared >= 0.9 * total, f"only {shared / 1e6:.0f} of {total / 1e6:.0f} MB shared"
