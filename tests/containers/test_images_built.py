"""What the built images are, checked by running them: their user, no credential, exactly their
pinned packages and the project's code, their program imports, the trainer's Horovod, Open MPI,
sshd and ssh as the MPIJob uses them, and the GPU trainer built on the CPU trainer's layers.
The Dockerfiles themselves are linted in tests/test_images.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from components.common import defaults
from components.common.failure import ExitCode
from components.train.rank import cuda
from tests.containers.support import require_images
from tests.horovod.common import CHECK_BUILD, built_with
from tests.test_horovod_build import VERSION as HOROVOD_VERSION
from tests.test_images import PINS, pinned

TENSORFLOW_VERSION = pinned(PINS.LOCK)["tensorflow"]

pytestmark = pytest.mark.containers

ROOT = Path(__file__).resolve().parents[2]
TRAINERS = ("trainer", "trainer_gpu")
# The component packages each image's program runs (components/common only as far as they
# import it); the check-parameters step runs in the data_prep image. components/serve runs in no
# image: `make serve` runs it here, KServe's own TensorFlow runtime on a cluster.
PROGRAMS = {
    "data_prep": ("components.data_prep", "components.common.declare"),
    "trainer": ("components.train",),
    "trainer_gpu": ("components.train",),
    "evaluate": ("components.evaluate",),
    "register": ("components.register",),
}
NOT_IN_AN_IMAGE = {"common", "serve"}
# What the base brings besides the pinned packages (pip itself).
BASE_DISTS = {"pip"}
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
import importlib, importlib.metadata as md, json, os, pwd, re, shutil, sys
import components, pipeline
found, shipped, failed = [], [], {}
for top in sys.argv[2:]:
    for folder, dirs, files in os.walk(top):
        found += [os.path.join(folder, f) for f in files + [d for d in dirs if d == ".ssh"]]
for package in (components, pipeline):
    base = os.path.dirname(package.__path__[0])
    for folder, dirs, files in os.walk(package.__path__[0]):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        shipped += [os.path.relpath(os.path.join(folder, f), base) for f in files]
for path in shipped:
    module = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    skip = "/tests/" in path or os.path.basename(path).startswith(("test_", "conftest", "__main__"))
    if path.endswith(".py") and not skip and module.startswith(tuple(sys.argv[1].split(","))):
        try:
            importlib.import_module(module)
        except Exception as exc:
            failed[module] = repr(exc)
user = pwd.getpwuid(os.getuid())
print(json.dumps({
    "uid": os.getuid(), "user": user.pw_name, "home": user.pw_dir, "cwd": os.getcwd(),
    "files": found, "tools": {t: shutil.which(t) for t in ("mpirun", "sshd", "ssh")},
    "shipped": shipped, "import_errors": failed,
    "dists": {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
              for d in md.distributions()},
}))
"""


def _run(client: Any, image: str, command: list[str], want: int = 0) -> tuple[str, str]:
    """Run `command` in a new container of `image`: (stdout, stderr); the test fails unless it
    exits with `want`."""
    container = client.containers.run(image, command, detach=True,
                                      labels={"kfp-horovod.test/images": "probe"})  # fmt: skip
    try:
        code = container.wait(timeout=300)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert code == want, f"{image} {command}: exit {code}\n{out[-2000:]}{err[-3000:]}"
    return out, err


def test_every_component_package_runs_in_an_image() -> None:
    """A new components/<pkg>/ must be given an image here, or its imports go unchecked."""
    served = {p.split(".")[1] for programs in PROGRAMS.values() for p in programs}
    packages = {p.parent.name for p in (ROOT / "components").glob("*/__init__.py")}
    assert packages == served | NOT_IN_AN_IMAGE
    assert set(PROGRAMS) == set(defaults.IMAGE_NAMES)


@pytest.mark.parametrize("component", sorted(defaults.IMAGE_NAMES))
def test_every_image_as_built(component: str, docker_client: Any) -> None:
    """A non-root user (the trainers': the MPIJob's, with Open MPI and sshd) and no credential;
    exactly images/<name>/requirements.txt's pins (installed --no-deps; no TensorFlow in the
    register image, no Horovod in data prep's) and Horovod in the trainers; every file of the
    project's packages (it installs the project's wheel); every module of its program imports."""
    image = require_images(docker_client, component)[component]
    config = docker_client.images.get(image).attrs["Config"]
    assert config["User"] not in ("", "root", "0"), f"{image} runs as {config['User'] or 'root'}"
    # Who the image runs as, its files and tools, its distributions, the project's files it
    # holds, and the modules of its program (``__main__`` not run) that fail to import.
    command = ["python", "-c", PROBE, ",".join(PROGRAMS[component]), *SEARCHED]
    probe = json.loads(_run(docker_client, image, command)[0].strip().splitlines()[-1])
    assert probe["uid"] != 0, probe
    env = [e.partition("=")[0] for e in config.get("Env") or []]
    assert not [n for n in env if CREDENTIAL_ENV.search(n)], env
    keys = [f for f in probe["files"] if CREDENTIAL_FILE.search(f.rsplit("/", 1)[-1])]
    assert keys == [], f"{image} carries key or credential files: {keys}"
    # The trainer's ~/.ssh is where the MPIJob mounts its Secret: the image has none of its own.
    assert not [f for f in probe["files"] if f.endswith("/.ssh")], probe["files"]
    assert probe["import_errors"] == {}, probe["import_errors"]
    pins = pinned(ROOT / "images" / component / "requirements.txt")
    own = {"kfp-horovod": defaults.PACKAGE_VERSION}
    if component in TRAINERS:
        own["horovod"] = HOROVOD_VERSION
    dists = {n: v for n, v in probe["dists"].items() if n not in BASE_DISTS}
    assert dists == {**pins, **own}, sorted(set(dists.items()) ^ set({**pins, **own}.items()))
    if component == "register":  # it hashes the model; it loads nothing
        assert not {"tensorflow", "keras", "tf-keras", "horovod"} & set(dists)
    if component == "data_prep":  # TF decodes and resizes images (keras: TF's requirement)
        assert "tensorflow" in dists and not {"tf-keras", "horovod"} & set(dists)
    repo = {
        p.relative_to(ROOT).as_posix()
        for package in ("components", "pipeline")
        for p in (ROOT / package).rglob("*")
        if p.is_file() and p.suffix not in (".md", ".pyc") and "__pycache__" not in p.parts
        and "tests" not in p.relative_to(ROOT).parts[:-1]
    }  # fmt: skip
    assert sorted(repo - set(probe["shipped"])) == [], "not in the image's project package"
    if component in TRAINERS:
        home = str(defaults.MPI_SSH_AUTH_MOUNT_PATH).rsplit("/", 1)[0]
        assert (probe["uid"], probe["home"], probe["cwd"]) == (
            defaults.MPI_USER_UID, home, defaults.TRAINER_WORKDIR
        ), probe  # fmt: skip
        assert all(probe["tools"].values()), probe["tools"]
        assert defaults.MPI_SSHD_CONFIG in probe["files"], "the probe walks the user's home"
        assert set(config.get("ExposedPorts") or {}) == {f"{defaults.MPI_SSHD_PORT}/tcp"}


@pytest.mark.parametrize("component", TRAINERS)
def test_trainer_horovod_has_mpi_and_gloo_and_runs_on_the_locked_tensorflow(
    component: str, docker_client: Any
) -> None:
    image = require_images(docker_client, component)[component]
    script = (
        "import json, importlib.util, importlib.metadata as md; "
        "from components.common import keras_env; keras = keras_env.keras(); "
        "import horovod.tensorflow as hvd, horovod.tensorflow.keras as hvd_keras; "
        "print(json.dumps({"
        "'mpi': hvd.mpi_built(), 'gloo': hvd.gloo_built(), 'keras_3_apply': 'apply' in "
        "vars(type(hvd_keras.DistributedOptimizer(keras.optimizers.Adam())).__mro__[1]), "
        "'tf_keras': importlib.util.find_spec('tf_keras') is not None, "
        "**{n: md.version(n) for n in ('tensorflow', 'keras', 'protobuf')}}))"
    )
    out, _ = _run(docker_client, image, ["python", "-c", script])
    built = json.loads(out.splitlines()[-1])
    assert (built["mpi"], built["gloo"]) == (True, True), built
    assert built["tensorflow"] == TENSORFLOW_VERSION, built
    # Keras 3, no tf-keras; Horovod's optimizer averages in Keras 3's `apply` (patch 0002).
    assert built["keras"].startswith("3.") and built["tf_keras"] is False, built
    assert built["keras_3_apply"] is True, built
    assert built["protobuf"].startswith("6."), "kfp 2.17 and TF 2.21 both need protobuf 6"
    # Every package is installed --no-deps: pip's own check finds nothing missing or clashing.
    assert "No broken requirements found" in _run(docker_client, image, ["pip", "check"])[0]
    out, _ = _run(docker_client, image, ["python", "-c", CHECK_BUILD])
    assert {"TensorFlow", "MPI", "Gloo"} <= built_with(out), out


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
    out, _ = _run(docker_client, image, ["bash", "-c", script])
    server, client = (_settings(text) for text in out.split("---\n"))
    assert server["port"] == [str(defaults.MPI_SSHD_PORT)]
    assert f"{mount}/id_rsa" in server["hostkey"], server["hostkey"]
    assert server["authorizedkeysfile"] == [f"{mount}/authorized_keys"]
    assert server["pidfile"][0].startswith(mount.rsplit("/", 1)[0] + "/")
    assert (server["passwordauthentication"], server["usepam"]) == (["no"], ["no"])
    assert client["port"] == [str(defaults.MPI_SSHD_PORT)]
    assert client["userknownhostsfile"] == ["/dev/null"]
    assert client["stricthostkeychecking"] == ["false"]


def _settings(text: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key.lower(), []).append(value.strip())
    return values


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
    codes, kinds = _run(docker_client, image, ["python", "-c", script])[0].splitlines()[-2:]
    assert codes == "[0, 0]", codes
    assert kinds == "['MPIJob', 'TrainingRuntime', 'TrainJob']", kinds


def test_gpu_trainer_is_built_on_the_cpu_trainers_layers(docker_client: Any) -> None:
    """The CPU trainer's big layers (the base, Open MPI, TensorFlow) are the GPU trainer's own,
    the same layers from the build cache: the GPU image adds its CUDA wheels on top."""
    images = require_images(docker_client, *TRAINERS)
    cpu, gpu = (docker_client.images.get(images[c]).history() for c in TRAINERS)
    gpu_steps = {step["Id"] for step in gpu if step["Id"] != "<missing>"}
    shared = sum(step["Size"] for step in cpu if step["Id"] in gpu_steps)
    total = sum(step["Size"] for step in cpu)
    assert shared >= 0.9 * total, f"only {shared / 1e6:.0f} of {total / 1e6:.0f} MB shared"


# --- the CUDA check of components/train/rank/cuda.py in both trainers: the GPU image loads every
# CUDA library TensorFlow needs from its nvidia-*-cu12 wheels and its Horovod matches its label; the
# CPU image reports each of them missing, by soname. No GPU here: this proves what the GPU image
# holds and that it loads, not that it trains on a GPU (libcuda.so.1 comes from a GPU node).


def _cuda_check(client: Any, image: str, allreduce: str, want: int) -> tuple[str, str]:
    """``python -m components.train.rank.cuda --check --gradient-allreduce ALLREDUCE`` in
    `image`."""
    command = ["python", "-m", "components.train.rank.cuda", "--check", "--gradient-allreduce"]
    return _run(client, image, [*command, allreduce], want=want)


def _label(docker_client: Any, image: str) -> str:
    value = (docker_client.images.get(image).labels or {}).get(cuda.GRADIENT_ALLREDUCE_LABEL)
    assert value in cuda.GRADIENT_ALLREDUCE, f"{image}: gradient-allreduce label {value!r}"
    return str(value)


def test_gpu_trainer_image_loads_every_cuda_library_from_its_wheels(docker_client: Any) -> None:
    image = require_images(docker_client, "trainer_gpu")["trainer_gpu"]
    allreduce = _label(docker_client, image)
    out, err = _cuda_check(docker_client, image, allreduce, want=0)
    for soname, wheel in cuda.TF_CUDA_LIBRARIES.items():
        folder = wheel.removeprefix("nvidia-").removesuffix("-cu12").replace("-", "_")
        line = next((ln for ln in out.splitlines() if ln.startswith(f"cuda: {soname}: ")), "")
        assert line.endswith(f"/site-packages/nvidia/{folder}/lib/{soname}"), line or out + err
    assert f"cuda: TensorFlow {TENSORFLOW_VERSION}: CUDA 12.5" in out
    assert f"cuda: Horovod gradient allreduce: {allreduce}; all checks pass" in out, out + err
    # The label is what Horovod was built with: the other value fails the check.
    other = next(v for v in cuda.GRADIENT_ALLREDUCE if v != allreduce)
    _, err = _cuda_check(docker_client, image, other, want=ExitCode.BAD_INPUT)
    assert f"{cuda.GRADIENT_ALLREDUCE_LABEL}={other}, but Horovod" in err


def test_cpu_trainer_image_reports_the_cuda_libraries_missing(docker_client: Any) -> None:
    image = require_images(docker_client, "trainer")["trainer"]
    assert _label(docker_client, image) == "host"
    out, err = _cuda_check(docker_client, image, "host", want=ExitCode.BAD_INPUT)
    for soname, wheel in cuda.TF_CUDA_LIBRARIES.items():
        assert f"cuda: {soname}: MISSING" in out
        assert f"cuda check: cannot load {soname}: " in err
        assert f"{soname}: cannot open shared object file" in err and f"wheel {wheel}" in err
    assert "all checks pass" not in out
