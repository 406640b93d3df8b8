"""SageMaker's framework containers: which one an image URI names, and what it adds.

The SageMaker SDK names a framework container by its image URI (``PyTorch(...)`` sends
``.../pytorch-training:2.3.0-cpu-py311-ubuntu20.04-sagemaker``). In script mode trainport
plays that container, so it needs to know which framework the URI names
(:func:`parse_image_uri`, a pure function of the string) and what the framework's training
toolkit puts into the environment on top of the sagemaker-training contract
(:func:`container_variables`, pure too). The interface the collective libraries use is
the job network's (:func:`choose_interface`); a ``sagemaker_network_interface_name``
hyperparameter picks another where the host's network has it.

A script-mode job whose image names no framework (none, or a short name) plays the PyTorch
container: the interpreter trainport runs with is a PyTorch environment.
"""

from __future__ import annotations

import enum
import importlib.metadata
import json
import logging
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from trainport.host.jobenv import SYSTEM_PATH

__all__ = [
    "INTERFACE_HYPERPARAMETER",
    "Framework",
    "FrameworkImage",
    "choose_interface",
    "container_variables",
    "framework_of",
    "network_interfaces",
    "parse_image_uri",
    "torch_version",
]

log = logging.getLogger(__name__)

INTERFACE_HYPERPARAMETER = "sagemaker_network_interface_name"
# The PyTorch toolkit's rendezvous port for MASTER_PORT (its training.MASTER_PORT).
PYTORCH_MASTER_PORT = "7777"


class Framework(enum.StrEnum):
    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"
    SKLEARN = "sklearn"
    XGBOOST = "xgboost"


# The repository part of each framework's image URI (the last path segment, before ':').
_REPOSITORIES = {
    "pytorch-training": Framework.PYTORCH,
    "huggingface-pytorch-training": Framework.PYTORCH,
    "tensorflow-training": Framework.TENSORFLOW,
    "sagemaker-scikit-learn": Framework.SKLEARN,
    "sagemaker-xgboost": Framework.XGBOOST,
}
_PY_TAG = re.compile(r"^py(\d)(\d*)$")
# scikit-learn and XGBoost tag a container release after the framework version: 1.2-1.
_VERSION = re.compile(r"^\d+(\.\d+)*(-\d+)?$")


@dataclass(frozen=True)
class FrameworkImage:
    """What a framework image URI says: the framework, its version, the Python the image
    ships (``3.10`` from ``py310``; None where the tag does not say), and CPU or GPU."""

    uri: str
    framework: Framework
    version: str
    python: str | None = None
    processor: str = "cpu"


def parse_image_uri(uri: str | None) -> FrameworkImage | None:
    """The framework ``uri`` names, or None for any other image (or none).

    Accepts what the SDK's ``image_uris.retrieve`` gives and the short local forms:
    ``[registry/]repository:version[-cpu|-gpu][-pyNN][-...]``.
    """
    if not uri or uri.startswith(("/", ".", "~")):
        return None  # none, or a local folder
    path, _, tag = uri.rpartition(":")
    if not path or "/" in tag:
        return None  # no tag (or a registry port, no tag)
    framework = _REPOSITORIES.get(path.rsplit("/", 1)[-1])
    if framework is None:
        return None
    parts = tag.split("-")
    # The version runs up to the first part that is not a number (1.2-1 keeps its release).
    version = parts[0]
    rest = parts[1:]
    if rest and rest[0].isdigit() and _VERSION.match(f"{version}-{rest[0]}"):
        version, rest = f"{version}-{rest[0]}", rest[1:]
    if not _VERSION.match(version):
        return None
    python = None
    for part in rest:
        if match := _PY_TAG.match(part):
            python = f"{match.group(1)}.{match.group(2)}" if match.group(2) else match.group(1)
    processor = "gpu" if "gpu" in rest else "cpu"
    return FrameworkImage(uri, framework, version, python, processor)


def framework_of(training_image: str | None) -> Framework:
    """The framework container a script-mode job plays: the image's, else PyTorch's (for a
    job that names no image or a short name, the interpreter trainport runs with plays)."""
    image = parse_image_uri(training_image)
    return image.framework if image else Framework.PYTORCH


def container_variables(
    framework: Framework | None,
    contract: Mapping[str, str],
    *,
    torch: str | None = None,
) -> dict[str, str]:
    """What the framework's toolkit sets in its own environment before it starts the
    user's entry point, so that the script inherits it, derived as the toolkit derives it
    from ``contract`` (the ``SM_*`` variables of script mode). ``torch`` is the PyTorch
    version the job's interpreter has (None: not installed, and not said).

    The PyTorch toolkit's ``train()``: ``MASTER_ADDR`` (the first host of the distribution,
    algo-1 unless instance groups say otherwise) and ``MASTER_PORT`` 7777 for every job,
    single-host too, so ``init_process_group(rank=..., world_size=...)`` works without a
    launcher; NCCL on the job's interface over IP sockets, warnings only; and the version
    of PyTorch.

    The TensorFlow toolkit's: TensorFlow's C++ log at warnings, its S3 file system over
    HTTPS in the job's region, and with the multi-worker mirrored strategy ``TF_CONFIG``
    naming every host of the distribution as a worker on port 8890.

    scikit-learn's and XGBoost's toolkits add nothing a script reads.
    """
    if framework is Framework.TENSORFLOW:
        return _tensorflow_variables(contract)
    if framework is not Framework.PYTORCH:
        return {}
    training_env = json.loads(contract.get("SM_TRAINING_ENV") or "{}")
    hosts = json.loads(contract.get("SM_HOSTS") or "[]")
    master = training_env.get("master_hostname") or (hosts[0] if hosts else "algo-1")
    env = {
        "MASTER_ADDR": str(master),
        "MASTER_PORT": PYTORCH_MASTER_PORT,
        "NCCL_SOCKET_IFNAME": contract.get("SM_NETWORK_INTERFACE_NAME") or "eth0",
        "NCCL_IB_DISABLE": "1",
        "NCCL_DEBUG": "WARN",
    }
    if torch:
        env["SM_DLC_TORCH_VERSION"] = torch
    return env


# The TensorFlow toolkit's multi-worker mirrored strategy: every worker listens on this port.
TENSORFLOW_WORKER_PORT = 8890
_MWMS = "sagemaker_multi_worker_mirrored_strategy_enabled"


def _tensorflow_variables(contract: Mapping[str, str]) -> dict[str, str]:
    env = {
        "TF_CPP_MIN_LOG_LEVEL": "1",
        "S3_USE_HTTPS": "1",
        "S3_REGION": contract.get("SAGEMAKER_REGION", ""),
    }
    training_env = json.loads(contract.get("SM_TRAINING_ENV") or "{}")
    params = json.loads(contract.get("SM_FRAMEWORK_PARAMS") or "{}")
    workers = list(training_env.get("distribution_hosts") or [])
    current = contract.get("SM_CURRENT_HOST", "")
    if params.get(_MWMS) and current in workers:
        tf_config = {
            "cluster": {"worker": [f"{h}:{TENSORFLOW_WORKER_PORT}" for h in workers]},
            "environment": "cloud",
            "task": {"index": workers.index(current), "type": "worker"},
        }
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def torch_version() -> str | None:
    """The version of PyTorch installed for the interpreter running this (as
    ``torch.__version__`` says it, local label included), without importing it."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


# -- the interface ---------------------------------------------------------------------------


def choose_interface(
    network_interface: str,
    hyperparameters: Mapping[str, str],
    available: frozenset[str] | None,
) -> tuple[str, str | None]:
    """The interface a host's collectives and ``SM_NETWORK_INTERFACE_NAME`` name, and a
    note for the status message when the job asked for one it cannot have.

    ``network_interface`` is the one that carries the host's address in the job's network
    (eth0 in a namespace of its own, lo on the machine's network); ``available``, the
    interfaces that network has (None: unknown). The hyperparameter
    ``sagemaker_network_interface_name`` (as the SDK sends it, JSON-quoted) wins where the
    host's network has that interface.
    """
    raw = hyperparameters.get(INTERFACE_HYPERPARAMETER)
    if raw is None:
        return network_interface, None
    try:
        wanted = json.loads(raw)
    except ValueError:
        wanted = raw
    wanted = str(wanted).strip()
    if not wanted or wanted == network_interface:
        return network_interface, None
    if available is not None and wanted in available:
        return wanted, None
    have = ", ".join(sorted(available)) if available else "unknown"
    return network_interface, (
        f"HyperParameters {INTERFACE_HYPERPARAMETER} {wanted!r} is not an interface of this "
        f"host's network (it has {have}); the job uses {network_interface}, which carries "
        "its hosts' addresses"
    )


def network_interfaces(netns: str | None) -> frozenset[str] | None:
    """The interfaces of a network namespace (None: the machine's own), or None if they
    cannot be listed."""
    if netns is None:
        try:
            return frozenset(name for _, name in socket.if_nameindex())
        except OSError:
            return None
    ip = shutil.which("ip", path=SYSTEM_PATH)
    if ip is None:
        return None
    try:
        out = subprocess.run(
            [ip, "-n", netns, "-o", "link", "show"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("could not list the interfaces of %s: %s", netns, exc)
        return None
    # "2: eth0@if7: <BROADCAST,...": the name, less the peer after '@'.
    return frozenset(
        line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines() if ":" in line
    )
