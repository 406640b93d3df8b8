"""The Python environment a framework image stands for, built once and shared by jobs.

A script-mode job whose image is ``sagemaker-scikit-learn:1.2-1-cpu-py3`` expects
scikit-learn 1.2 and what that container ships beside it (numpy, pandas, scipy, joblib, the
training toolkit). trainport's own interpreter is a PyTorch environment, so for the other
frameworks (and another PyTorch version) it layers the framework's packages on it:

- :func:`environment_for` is the decision, a pure function of the parsed image and the
  interpreter: the pip requirement lines of the layer, or None where the interpreter
  plays the image as it is (a PyTorch image, on an interpreter that has PyTorch:
  :func:`torch_note` says when the versions differ).
- :func:`check_available` asks the package index (through pip, so its configuration
  holds) whether the framework's version can be had, and refuses the job at submission,
  naming what can, when it cannot.
- :func:`python_note` says when the image's Python is not the one the job runs.

TensorFlow's layer also carries what its container ships that pip cannot install from a
requirement line alone: PipeModeDataset's wheel of the image's Python and Horovod compiled
against the layer's TensorFlow, as :mod:`trainport.host.envbuild`'s steps.

The build itself is :func:`trainport.host.script_mode.prepare_python`'s, as a layer under
the source's own ``requirements.txt``, cached by the requirement lines and the base
interpreter, and run where the job runs (its sandbox, identity, limits and network).
"""

from __future__ import annotations

import functools
import logging
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainport.errors import ValidationError
from trainport.host.envbuild import STEP_PREFIX as STEP
from trainport.host.frameworks import Framework, FrameworkImage

__all__ = [
    "FrameworkEnvironment",
    "available_versions",
    "check_available",
    "check_image",
    "environment_for",
    "image_notes",
    "layer_for",
    "python_note",
    "torch_note",
]

log = logging.getLogger(__name__)

# What each framework's container ships beside the framework (the training toolkit comes
# from the base interpreter, where trainport's jobs always have it).
_PACKAGES = {
    Framework.PYTORCH: "torch",
    Framework.TENSORFLOW: "tensorflow-cpu",
    Framework.SKLEARN: "scikit-learn",
    Framework.XGBOOST: "xgboost",
}
_COMPANIONS = {
    Framework.PYTORCH: ("numpy",),
    Framework.TENSORFLOW: ("numpy", "pandas"),
    Framework.SKLEARN: ("numpy", "pandas", "scipy", "joblib"),
    Framework.XGBOOST: ("numpy", "pandas", "scipy", "scikit-learn"),
}
# Releases built before numpy 2 existed break on it (their compiled parts ask for the
# numpy 1 ABI): below these versions the layer keeps numpy 1.
_NUMPY_2_FROM = {
    Framework.PYTORCH: (2, 3),
    Framework.TENSORFLOW: (2, 18),
    Framework.SKLEARN: (1, 4),
    Framework.XGBOOST: (2, 1),
}
_PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# TensorFlow's container ships PipeModeDataset (``from sagemaker_tensorflow import
# PipeModeDataset``), one release of it per TensorFlow release. The index publishes it for
# the container's Python only; its compiled op links TensorFlow, not libpython, so the
# image's wheel loads on the job's Python and goes in as it is (envbuild's for-python step).
_PIPE_MODE_DATASET = "sagemaker-tensorflow"
# And Horovod, built from source against the layer's TensorFlow (its ops compile against
# TensorFlow's headers and library): MPI for mpirun's ranks, Gloo beside it.
_HOROVOD = "horovod==0.28.1"
_HOROVOD_BUILD = (
    "HOROVOD_WITH_TENSORFLOW=1",
    "HOROVOD_WITHOUT_PYTORCH=1",
    "HOROVOD_WITHOUT_MXNET=1",
    "HOROVOD_WITH_MPI=1",
    "HOROVOD_WITH_GLOO=1",
)


@dataclass(frozen=True)
class FrameworkEnvironment:
    """The layer a framework image stands for: the package and the versions it takes
    (``1.2``: any 1.2.x), and the pip requirement lines that install it."""

    image: FrameworkImage
    package: str
    version: str
    requirements: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}.*"


def framework_version(image: FrameworkImage) -> str:
    """The framework's own version in the image's (``1.2-1`` is scikit-learn 1.2, the
    container's first release of it)."""
    return image.version.split("-", 1)[0]


def environment_for(
    image: FrameworkImage, *, torch: str | None, python: str | None = None
) -> FrameworkEnvironment | None:
    """The layer that makes the interpreter ``image``'s environment, or None where it is
    already (``torch``: the interpreter's PyTorch version, None if it has none; ``python``:
    its ``major.minor``, this process's by default)."""
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    version = framework_version(image)
    if image.framework is Framework.PYTORCH and torch:
        # The interpreter's own PyTorch plays every PyTorch image (torch_note says when its
        # version is another): a build of each PyTorch release would be gigabytes apiece.
        return None
    package = _PACKAGES[image.framework]
    if image.framework is Framework.TENSORFLOW and image.processor == "gpu":
        package = "tensorflow"
    lines: list[str] = []
    if image.framework is Framework.PYTORCH and image.processor == "cpu":
        lines.append(f"--extra-index-url {_PYTORCH_CPU_INDEX}")
    lines.append(f"{package}=={version}.*")
    for companion in _COMPANIONS[image.framework]:
        if companion == "numpy" and _release(version) < _NUMPY_2_FROM[image.framework]:
            lines.append("numpy<2")
        elif companion != package:
            lines.append(companion)
    if image.framework is Framework.TENSORFLOW:
        lines += _tensorflow_extras(image, version, python)
    return FrameworkEnvironment(image, package, version, tuple(lines))


def _tensorflow_extras(image: FrameworkImage, version: str, python: str) -> list[str]:
    """PipeModeDataset of the TensorFlow release, for the image's Python where it is not
    the job's; and Horovod (envbuild's steps, as the lines say them)."""
    release = ".".join(version.split(".")[:2])
    pipe_mode = f"{_PIPE_MODE_DATASET}=={release}.*"
    shipped = image.python if image.python and "." in image.python else None
    if shipped and shipped != python:
        pipe_mode = f"{STEP}for-python {shipped} {pipe_mode}"
    return [pipe_mode, f"{STEP}compile {' '.join(_HOROVOD_BUILD)} {_HOROVOD}"]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def _same_release(installed: str, wanted: str) -> bool:
    """Whether ``installed`` (``2.3.1+cpu``) is a release of ``wanted`` (``2.3``, ``2.3.1``)."""
    public = installed.split("+", 1)[0]
    return public == wanted or public.startswith(wanted + ".")


def python_note(image: FrameworkImage, running: str | None = None) -> str | None:
    """What the status message says when the job's Python is not the image's."""
    running = running or f"{sys.version_info.major}.{sys.version_info.minor}"
    if image.python is None or running == image.python or running.startswith(image.python + "."):
        return None
    return (
        f"image {image.uri} ships Python {image.python}; this job runs Python {running}, "
        f"with {image.framework.value} {framework_version(image)} installed for it"
    )


def torch_note(image: FrameworkImage, torch: str | None) -> str | None:
    """What the status message says when a PyTorch image's version is not the PyTorch the
    job runs with."""
    if image.framework is not Framework.PYTORCH or torch is None:
        return None
    wanted = framework_version(image)
    if _same_release(torch, wanted):
        return None
    return f"image {image.uri} is PyTorch {wanted}; this job runs PyTorch {torch}"


# -- the package index (effects) ----------------------------------------------------------


@functools.lru_cache(maxsize=64)
def available_versions(package: str, python: str = sys.executable) -> tuple[str, ...] | None:
    """The versions of ``package`` the package index offers ``python``'s pip, newest first;
    None when the index cannot be asked (no network: the build will say more)."""
    try:
        done = subprocess.run(
            [python, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not ask the package index about %s: %s", package, exc)
        return None
    match = re.search(r"^Available versions: (.*)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        said = (done.stderr or done.stdout).strip().splitlines()
        if "No matching distribution" in done.stderr:
            return ()
        log.warning("could not ask the package index about %s: %s", package, said[-1:] or "")
        return None
    return tuple(v.strip() for v in match.group(1).split(","))


def check_available(env: FrameworkEnvironment, versions: Sequence[str] | None) -> None:
    """Refuse the image when the index offers no release of its framework version."""
    if versions is None:
        return
    if any(_same_release(v, env.version) for v in versions):
        return
    releases = sorted({".".join(v.split(".")[:2]) for v in versions if v[:1].isdigit()}, key=_key)
    shown = ", ".join(releases[-12:]) or "none"
    raise ValidationError(
        f"AlgorithmSpecification.TrainingImage {env.image.uri}: {env.package} "
        f"{env.version} cannot be had from the package index for Python "
        f"{sys.version_info.major}.{sys.version_info.minor}; it offers {shown}. Name an image "
        "of one of those versions"
    )


def layer_for(training_image: str | None) -> FrameworkEnvironment | None:
    """The layer a job's image stands for on this interpreter, if any."""
    from trainport.host.frameworks import parse_image_uri, torch_version

    image = parse_image_uri(training_image)
    return environment_for(image, torch=torch_version()) if image else None


def image_notes(training_image: str | None) -> list[str]:
    """What the Training status says of how the job plays its framework image."""
    from trainport.host.frameworks import parse_image_uri, torch_version

    image = parse_image_uri(training_image)
    if image is None:
        return []
    notes = [python_note(image), torch_note(image, torch_version())]
    return [note for note in notes if note]


def check_image(training_image: str | None, envs_dir: Path) -> None:
    """At submission: refuse a framework image whose version the index cannot give (the
    index is not asked when its environment is built already)."""
    from trainport.host.script_mode import layer_built

    env = layer_for(training_image)
    if env is not None and not layer_built(env.requirements, envs_dir):
        check_available(env, available_versions(env.package))


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", release))
