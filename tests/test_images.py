"""Checks on the component images that need no Docker engine.

Every image the pipeline uses has a Dockerfile under ``images/<name>/``; every third-party module
a component imports is installed in its image; every pin agrees with ``requirements/lock.txt``;
base images are pinned and overridable; the GPU trainer is the trainer plus TensorFlow's CUDA
libraries (requirements/lock-cuda.txt). What the built images hold and do (their user, no
credentials, Horovod's controllers, sshd and ssh) is tested by running them:
tests/containers/test_images_built.py.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

from components.common import defaults
from components.common.defaults import IMAGE_NAMES, image_ref

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
LOCK = ROOT / "requirements" / "lock.txt"
CUDA_LOCK = ROOT / "requirements" / "lock-cuda.txt"

# Which code each image serves (besides components/common, which every image serves).
IMAGE_CODE_DIRS: dict[str, tuple[str, ...]] = {
    "data_prep": ("data_prep",),
    "trainer": ("train",),
    "trainer_gpu": ("train",),
    "evaluate": ("evaluate",),
    "register": ("register",),
}
# Component packages that run in no image of the project: `make serve` runs components/serve on
# the user's machine (the `serve` extra; its imports are exercised by its own tests, which start
# it); on a cluster, KServe's own TensorFlow runtime serves the registry's serving folder.
NOT_IN_AN_IMAGE = {"serve"}
# Not component images: the offline base (images/base) and the GCS emulator of the container
# tests (images/gcs-emulator).
SUPPORT_IMAGE_DIRS = {"base", "component", "gcs-emulator"}
# The check-parameters step runs in the data_prep image.
IMAGE_EXTRA_SOURCES: dict[str, tuple[str, ...]] = {"data_prep": ("components/common/params.py",)}
FIRST_PARTY = {"components", "pipeline"}

IMAGE_PARAMS = sorted(IMAGE_NAMES)
GPU_SUFFIX = "_gpu"


def normalize(name: str) -> str:
    """PEP 503 distribution-name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- Dockerfile parsing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int  # index of the FROM this instruction belongs to (0-based)
    line: int


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comment lines dropped."""
    out: list[Instruction] = []
    stage = -1
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        text = " ".join(part for part in buf if part)
        buf = []
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, args.strip(), stage, start))
    assert not buf, f"{path}: dangling line continuation at the end"
    return out


SHARED_DOCKERFILE = IMAGES / "component" / "Dockerfile"


def dockerfile(image: str) -> Path:
    """images/<image>/Dockerfile; else, for <X>_gpu, images/<X>/Dockerfile (built with
    IMAGE=<image>); else the shared one (built with COMPONENT=<image>): the rule of
    images/build-local.sh."""
    own = IMAGES / image / "Dockerfile"
    variant = IMAGES / image.removesuffix(GPU_SUFFIX) / "Dockerfile"
    if own.is_file():
        return own
    if image.endswith(GPU_SUFFIX) and variant.is_file():
        return variant
    return SHARED_DOCKERFILE


def instructions(image: str) -> list[Instruction]:
    """The image's Dockerfile instructions, ``${COMPONENT}`` and ``${IMAGE}`` (the build args
    images/build-local.sh sets to the image's folder) read as the image's name."""
    return [
        dataclasses.replace(
            i, args=i.args.replace("${COMPONENT}", image).replace("${IMAGE}", image)
        )
        for i in parse_dockerfile(dockerfile(image))
    ]


def final_stage(instrs: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instrs)
    return [i for i in instrs if i.stage == last]


def copy_sources(instr: Instruction) -> list[str]:
    """The source paths of a COPY/ADD (not --from=...), flags removed."""
    words = [w for w in instr.args.split() if not w.startswith("--")]
    if words and words[0].startswith("["):
        words = [w.strip('[]",') for w in words]
    return words[:-1]


# --- requirements -------------------------------------------------------------------------------


def read_pins(path: Path) -> dict[str, tuple[str, str]]:
    """normalized name -> (line, version) for a file of exact pins; fails on anything else."""
    pins: dict[str, tuple[str, str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        assert match, f"{path.relative_to(ROOT)}: not an exact `name==version` pin: {line!r}"
        name = normalize(match[1])
        assert name not in pins, f"{path.relative_to(ROOT)}: {match[1]} is pinned twice"
        pins[name] = (line, match[2])
    return pins


def lock_pins() -> dict[str, tuple[str, str]]:
    return read_pins(LOCK)


def cuda_lock_requires() -> dict[str, list[str]]:
    """normalized name -> what it requires, from lock-cuda.txt's ``# requires:`` comments: its
    wheels are not installed here, so their metadata is not either."""
    needs: dict[str, list[str]] = {}
    for raw in CUDA_LOCK.read_text().splitlines():
        pin, _, comment = raw.partition("#")
        if not pin.strip():
            continue
        match = re.fullmatch(r"\s*requires:((?:\s+[A-Za-z0-9._-]+)+)\s*", comment)
        assert match or not comment, f"lock-cuda.txt: not a `# requires: ...` comment: {raw!r}"
        names = match.group(1).split() if match else []
        needs[normalize(pin.split("==")[0].strip())] = [normalize(n) for n in names]
    return needs


def image_requirement_files(image: str) -> list[Path]:
    return sorted((IMAGES / image).glob("*requirements.txt"))


def runtime_pins(image: str) -> dict[str, str]:
    """normalized name -> version of what the image's final stage gets from requirements.txt."""
    return {n: v for n, (_, v) in read_pins(IMAGES / image / "requirements.txt").items()}


def installs_horovod(image: str) -> bool:
    """True if the final stage installs a Horovod wheel built in the Dockerfile."""
    return any(
        i.keyword == "RUN" and re.search(r"pip install[^&;]*horovod", i.args)
        for i in final_stage(instructions(image))
    )


def image_distributions(image: str) -> set[str]:
    dists = set(runtime_pins(image))
    if installs_horovod(image):
        dists.add("horovod")
    return dists


def requires(dist: str) -> list[str]:
    """Normalized names of what `dist` needs here (no extras; markers evaluated here); for the
    CUDA lock's wheels, which are not installed here, what lock-cuda.txt says they need."""
    try:
        specs = md.requires(dist) or []
    except md.PackageNotFoundError:
        needs = cuda_lock_requires()
        assert dist in needs, f"{dist} is neither installed here nor in lock-cuda.txt"
        return needs[dist]
    needed = []
    for spec in specs:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            needed.append(normalize(req.name))
    return needed


# --- import scanning ----------------------------------------------------------------------------


def component_sources(image: str) -> list[Path]:
    """The .py files an image's program runs: the non-test files of its component packages, and
    every first-party module they import, transitively (so components/common only as far as
    it is used: an image carries only what its program imports)."""
    files: list[Path] = [ROOT / extra for extra in IMAGE_EXTRA_SOURCES.get(image, ())]
    for sub in IMAGE_CODE_DIRS[image]:
        base = ROOT / "components" / sub
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).parts
            if "tests" in rel[:-1] or rel[-1].startswith("test_") or rel[-1] == "conftest.py":
                continue
            files.append(path)
    queue = list(files)
    while queue:
        for module in sorted(imported_modules(queue.pop())):
            path = first_party_file(module)
            if path is not None and path not in files:
                files.append(path)
                queue.append(path)
    return files


def first_party_file(module: str) -> Path | None:
    """The file of first-party `module` (longest prefix that is a module), or None."""
    parts = module.split(".")
    if parts[0] not in FIRST_PARTY:
        return None
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Absolute module names `path` imports, anywhere in the file (lazy imports included).

    ``from a.b import c`` yields ``a.b.c`` (``c`` may be a submodule; resolution falls back to
    the longest importable prefix).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n.split(".")[0] != "__future__"}


def third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in sys.stdlib_module_names and top not in FIRST_PARTY


@lru_cache(maxsize=1)
def module_owners() -> dict[str, frozenset[str]]:
    """Dotted module name -> normalized names of the installed distributions shipping it."""
    owners: dict[str, set[str]] = {}
    for dist in md.distributions():
        name = normalize(dist.metadata["Name"] or "")
        for file in dist.files or []:
            parts = file.parts
            if not parts or ".." in parts or parts[0].endswith((".dist-info", ".egg-info")):
                continue
            last = parts[-1]
            if last.endswith(".py"):
                stem = last[:-3]
            elif last.endswith((".so", ".pyd")):
                stem = last.split(".")[0]
            else:
                continue
            mod_parts = list(parts[:-1]) + ([] if stem == "__init__" else [stem])
            if mod_parts and all(p.isidentifier() for p in mod_parts):
                owners.setdefault(".".join(mod_parts), set()).add(name)
    return {k: frozenset(v) for k, v in owners.items()}


def distributions_for(module: str) -> frozenset[str]:
    """The distributions that provide `module` (longest known prefix; empty if none)."""
    owners = module_owners()
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        found = owners.get(".".join(parts[:end]))
        if found:
            return found
    top = md.packages_distributions().get(parts[0], [])
    return frozenset(normalize(d) for d in top)


# --- tests: the image set -----------------------------------------------------------------------


def test_image_dirs_match_image_names() -> None:
    """One folder per name in IMAGE_NAMES, and none for an unknown image (besides the support
    images: the offline base, the shared component Dockerfile, the tests' GCS emulator)."""
    built = {p.parent.name for p in IMAGES.glob("*/requirements.in")} - SUPPORT_IMAGE_DIRS
    assert built == set(IMAGE_NAMES), (
        f"images/*/requirements.in {sorted(built)} != IMAGE_NAMES {sorted(IMAGE_NAMES)}"
    )
    own = {p.parent.name for p in IMAGES.glob("*/Dockerfile")} - SUPPORT_IMAGE_DIRS
    assert own == {"trainer"}, f"one shared Dockerfile for the other images, not {sorted(own)}"
    assert set(IMAGE_CODE_DIRS) == set(IMAGE_NAMES)


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_every_image_has_dockerfile_and_requirements(image: str) -> None:
    assert dockerfile(image).is_file(), f"{image_ref(image)} has no Dockerfile"
    assert (IMAGES / image / "requirements.txt").is_file()
    assert image_ref(image).split("/")[-1].startswith(IMAGE_NAMES[image] + ":")


def test_every_component_package_is_served_by_an_image() -> None:
    """A new components/<pkg>/ must be mapped to an image here, or its imports go unchecked."""
    served = {d for dirs in IMAGE_CODE_DIRS.values() for d in dirs} | {"common"} | NOT_IN_AN_IMAGE
    packages = {
        p.name
        for p in (ROOT / "components").iterdir()
        if p.is_dir() and p.name not in {"tests", "__pycache__"} and any(p.rglob("*.py"))
    }
    assert packages <= served, f"components not served by any image: {sorted(packages - served)}"


def _images_in(node: object) -> set[str]:
    """Every `image:` value, and every string naming one of our images, in a YAML tree (an image
    KFP resolves at run time, ``{{$.inputs...}}``, is one of the images named elsewhere)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str) and not value.startswith("{{$"):
                found.add(value)
            found |= _images_in(value)
    elif isinstance(node, list):
        for value in node:
            found |= _images_in(value)
    elif isinstance(node, str) and defaults.DEFAULT_IMAGE_REGISTRY + "/" in node:
        found.update(re.findall(re.escape(defaults.DEFAULT_IMAGE_REGISTRY) + r"/[^\s'\"]+", node))
    return found


def test_compiled_pipeline_images_have_dockerfiles(tmp_path: Path) -> None:
    """Compile the pipeline; every image it references is one of ours, with a Dockerfile."""
    from pipeline.build import compile_pipeline

    output = tmp_path / "pipeline.yaml"
    compile_pipeline(str(output), image_registry=None, image_tag=None)
    docs = [d for d in yaml.safe_load_all(output.read_text()) if d is not None]
    referenced = set().union(*(_images_in(d) for d in docs))
    assert referenced, "the compiled pipeline references no image"
    by_ref = {image_ref(name): name for name in IMAGE_NAMES}
    unknown = sorted(referenced - set(by_ref))
    assert not unknown, f"images without a Dockerfile under images/: {unknown}"
    for ref in referenced:
        assert dockerfile(by_ref[ref]).is_file(), ref


# --- tests: what each image installs -------------------------------------------------------------


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_component_imports_are_installed_in_image(image: str) -> None:
    sources = component_sources(image)
    assert any(p.parent.name == "common" for p in sources), "no components/common module used?"
    installed = image_distributions(image)
    problems = []
    for path in sources:
        for module in sorted(imported_modules(path)):
            if not third_party(module):
                continue
            dists = distributions_for(module)
            where = path.relative_to(ROOT)
            if not dists:
                problems.append(f"{where}: imports {module}, which no installed distribution has")
            elif not dists & installed:
                problems.append(
                    f"{where}: imports {module} ({' or '.join(sorted(dists))}), "
                    f"not installed by images/{image}"
                )
    assert not problems, "\n".join(problems)


def test_data_prep_image_carries_no_tensorflow() -> None:
    """Data prep (and the check step in its image) imports no TensorFlow, so its image has none
    (see images/README.md for the sizes)."""
    assert not {"tensorflow", "tensorflow-cpu", "keras"} & image_distributions("data_prep")
    imported = {m for path in component_sources("data_prep") for m in imported_modules(path)}
    assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "keras", "horovod")}


def test_register_image_carries_no_tensorflow() -> None:
    """Registration verifies the model by hashing saved_model.pb against the digest the trainer
    recorded, and checks its files; it never parses the model, so its image has no TensorFlow."""
    assert not {"tensorflow", "tensorflow-cpu", "keras"} & image_distributions("register")
    sources = component_sources("register")
    assert ROOT / "components" / "common" / "model_files.py" in sources  # it does check models
    imported = {m for path in sources for m in imported_modules(path)}
    assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "keras", "horovod")}


def image_lock(image: str) -> dict[str, tuple[str, str]]:
    """The pins an image may take: the lock, and for a GPU image also lock-cuda.txt."""
    if image.endswith(GPU_SUFFIX):
        return {**lock_pins(), **read_pins(CUDA_LOCK)}
    return lock_pins()


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_requirements_are_pinned_to_the_lock(image: str) -> None:
    lock = image_lock(image)
    files = image_requirement_files(image)
    assert files, f"images/{image} has no requirements.txt"
    for path in files:
        for name, (line, version) in read_pins(path).items():
            assert name in lock, f"{path.relative_to(ROOT)}: {line} is not in requirements/lock.txt"
            assert version == lock[name][1], (
                f"{path.relative_to(ROOT)}: {line} but requirements/lock.txt has {lock[name][0]}"
            )
    assert runtime_pins(image).get("kfp") == defaults.KFP_VERSION, (
        f"images/{image}/requirements.txt must pin kfp=={defaults.KFP_VERSION} "
        "(components run with install_kfp_package=False)"
    )


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_requirements_are_closed_under_dependencies(image: str) -> None:
    """The images install with --no-deps, so every dependency must be pinned as well."""
    dists = image_distributions(image)
    missing = sorted(
        f"{dep} (needed by {dist})" for dist in dists for dep in requires(dist) if dep not in dists
    )
    assert not missing, f"images/{image}/requirements.txt lacks: {', '.join(missing)}"


def test_requirements_files_are_generated_from_in_files() -> None:
    """images/*/requirements.txt are what images/pin_requirements.py makes of the .in files."""
    result = subprocess.run(
        [sys.executable, str(IMAGES / "pin_requirements.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_requirements_are_installed_without_dependencies(image: str) -> None:
    """Each requirements file is installed, --no-deps, in the stage that needs it."""
    runs = [i for i in instructions(image) if i.keyword == "RUN"]
    for path in image_requirement_files(image):
        rel = path.relative_to(ROOT).as_posix()
        copied = [i for i in instructions(image) if i.keyword == "COPY" and rel in copy_sources(i)]
        assert copied, f"images/{image}/Dockerfile does not COPY {rel}"
        installed = [r for r in runs if re.search(rf"-r\s+\S*/{re.escape(path.name)}\b", r.args)]
        assert installed, f"images/{image}/Dockerfile does not pip install -r {path.name}"
        for run in installed:
            assert "--no-deps" in run.args, f"line {run.line}: install {path.name} with --no-deps"
    final_runs = [r for r in final_stage(instructions(image)) if r.keyword == "RUN"]
    assert any(re.search(r"-r\s+\S*/requirements\.txt\b", r.args) for r in final_runs)


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_project_package_is_installed_without_dependencies(image: str) -> None:
    final = final_stage(instructions(image))
    copied = {s.rstrip("/") for i in final if i.keyword == "COPY" for s in copy_sources(i)}
    assert {"pyproject.toml", "components", "pipeline"} <= copied
    assert any(
        i.keyword == "RUN" and re.search(r"pip install --no-deps [^&;]*/tmp/src\b", i.args)
        for i in final
    ), f"images/{image} must `pip install --no-deps` the project package"


def test_project_wheel_contains_all_component_code(tmp_path: Path) -> None:
    """Build the project as the images do; every module and data file must land in the wheel.

    The images install the wheel, not the source tree: a package without ``__init__.py`` or a
    data file setuptools does not pick up would be missing there while tests pass here.
    """
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    src.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", src)
    for package in ("components", "pipeline"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--disable-pip-version-check", "-w", str(tmp_path / "out"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "out").glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for package in ("components", "pipeline"):
        for path in sorted((src / package).rglob("*")):
            rel = path.relative_to(src)
            if not path.is_file() or path.suffix == ".md" or "tests" in rel.parts[:-1]:
                continue
            if rel.as_posix() not in shipped:
                missing.append(rel.as_posix())
    assert not missing, f"not in the project wheel the images install: {missing}"


# --- tests: Dockerfile hygiene ------------------------------------------------------------------


def _base_args(image: str) -> dict[str, str]:
    """The ``ARG NAME=default`` lines before the first FROM (the only ARGs a FROM may use)."""
    args: dict[str, str] = {}
    for instr in instructions(image):
        if instr.keyword == "FROM":
            break
        if instr.keyword == "ARG":
            name, _, default = instr.args.partition("=")
            args[name.strip()] = default.strip()
    return args


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_base_image_is_an_overridable_build_arg(image: str) -> None:
    """Every image builds on ``ARG BASE_IMAGE`` (so the offline base can stand in), defaulting
    to the one base of components/common/defaults.py."""
    assert _base_args(image).get("BASE_IMAGE") == defaults.BASE_IMAGE
    froms = [i.args.split()[0] for i in instructions(image) if i.keyword == "FROM"]
    assert "${BASE_IMAGE}" in froms


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_base_images_are_pinned(image: str) -> None:
    stages: set[str] = set()
    froms = [i for i in instructions(image) if i.keyword == "FROM"]
    assert froms
    base_args = _base_args(image)
    for instr in froms:
        words = [w for w in instr.args.split() if not w.startswith("--")]
        ref = words[0]
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if ref.lower() in stages - {words[2].lower() if len(words) >= 3 else ""}:
            continue  # FROM an earlier stage
        arg = re.fullmatch(r"\$\{?(\w+)\}?", ref)
        if arg:
            assert base_args.get(arg.group(1)), f"line {instr.line}: FROM {ref} has no default"
            ref = base_args[arg.group(1)]
        assert "$" not in ref, f"line {instr.line}: FROM {ref}: only a whole ARG with a default"
        name, _, digest = ref.partition("@")
        last = name.rsplit("/", 1)[-1]
        tag = last.partition(":")[2]
        assert tag or digest, f"line {instr.line}: FROM {ref} is not pinned (no tag)"
        assert tag != "latest", f"line {instr.line}: FROM {ref} uses :latest"
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), ref
        if last.startswith("python:"):
            assert re.match(rf"{re.escape(defaults.PYTHON_VERSION)}\.\d+-", tag), (
                f"line {instr.line}: FROM {ref}: want an exact Python "
                f"{defaults.PYTHON_VERSION}.x tag (PYTHON_VERSION in defaults.py)"
            )


@pytest.mark.parametrize("image", IMAGE_PARAMS)
def test_copied_files_exist_and_are_in_the_build_context(image: str) -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for instr in instructions(image):
        if instr.keyword != "COPY" or "--from=" in instr.args:
            continue
        for src in copy_sources(instr):
            assert (ROOT / src).exists(), f"images/{image}/Dockerfile line {instr.line}: {src}?"
            assert src.split("/")[0] not in ignored, f"{src} is excluded by .dockerignore"


def test_dockerignore_excludes_local_state() -> None:
    entries = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "build", "runs", "**/__pycache__"} <= entries


# --- tests: the trainer -------------------------------------------------------------------------


# --- tests: the GPU trainer ---------------------------------------------------------------------


def test_gpu_trainer_is_the_trainer_plus_tensorflows_cuda_libraries() -> None:
    """The GPU image's closure is the CPU trainer's plus exactly lock-cuda.txt's pins (the same
    TensorFlow wheel: it is a CUDA build), and no other image carries a CUDA wheel."""
    cuda = {n: v for n, (_, v) in read_pins(CUDA_LOCK).items()}
    assert cuda and not set(cuda) & set(lock_pins()), "lock-cuda.txt only adds to the lock"
    assert runtime_pins("trainer_gpu") == {**runtime_pins("trainer"), **cuda}
    for image in IMAGE_NAMES:
        if not image.endswith(GPU_SUFFIX):
            carried = {n for p in image_requirement_files(image) for n in read_pins(p)}
            assert not carried & set(cuda), f"images/{image} pins CUDA wheels"


def test_cuda_lock_is_what_tensorflow_and_cuda_adds() -> None:
    """lock-cuda.txt pins every requirement of the locked TensorFlow's ``and-cuda`` extra at a
    version it allows, plus only what those need; the dev venv installs none of them."""
    cuda = {n: v for n, (_, v) in read_pins(CUDA_LOCK).items()}
    extra = [
        Requirement(spec)
        for spec in md.requires("tensorflow") or []
        if (r := Requirement(spec)).marker is not None
        and r.marker.evaluate({"extra": "and-cuda"})
        and not r.marker.evaluate({"extra": ""})
    ]
    assert extra, "the installed tensorflow has no and-cuda extra"
    for req in extra:
        name = normalize(req.name)
        assert name in cuda, f"lock-cuda.txt lacks {req} (tensorflow[and-cuda])"
        assert req.specifier.contains(cuda[name]), f"lock-cuda.txt: {name}=={cuda[name]} vs {req}"
    needed = {normalize(r.name) for r in extra}
    needed |= {dep for name in needed for dep in requires(name)}
    assert set(cuda) == needed, f"lock-cuda.txt pins more: {sorted(set(cuda) - needed)}"
    installed = [n for n in cuda if _installed(n)]
    assert not installed, f"the dev venv must not install the CUDA wheels: {installed}"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = declared["dependencies"] + sum(declared["optional-dependencies"].values(), [])
    assert not [s for s in specs if "and-cuda" in s], "pyproject.toml declares tensorflow[and-cuda]"


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True
