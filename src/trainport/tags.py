"""trainport's extensions that ride in a request's ``Tags``: one registry of their parsers.

Every ``trainport:`` key is listed here with what it means and the module that owns its
meaning; that module registers the tag's parser (:func:`parser`) beside the code that acts
on the tag. Parsing a request (:func:`trainport.spec.parse_request`) checks its tags
through :func:`check`, which loads an owner by name the first time one of its tags is seen
(as fsspec loads a backend), so parsing imports nothing of the runners or the host. A
parser is a pure function of the tag's value and the request's other tags: it asks no
container engine and no network.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainport.errors import ValidationError

__all__ = ["KNOWN", "Tag", "TagParser", "check", "parser"]

#: Checks a tag's value (the request's tags beside it); raises ValidationError.
TagParser = Callable[[str, Mapping[str, str]], object]


@dataclass(frozen=True)
class Tag:
    describes: str
    owner: str  # the module that registers the tag's parser


#: Tag keys trainport reads from a request (values are strings, as tags are).
KNOWN: dict[str, Tag] = {
    "trainport:runner": Tag(
        "runner for this job: sandbox, process, auto or ray",
        "trainport.spec",
    ),
    "trainport:stop-grace-seconds": Tag(
        "seconds between SIGTERM and SIGKILL on stop (default 120)",
        "trainport.spec",
    ),
    "trainport:pipe-workers": Tag(
        "P: each Pipe channel becomes P per-worker FIFO series "
        "<channel>_w<k>_<epoch> holding disjoint shards (docs/pipe-mode.md)",
        "trainport.spec",
    ),
    "trainport:distribution": Tag(
        "torchrun: launch the script-mode entry point with torchrun on "
        "every host (as the hyperparameter sagemaker_torch_distributed_enabled does); mpi: with "
        "mpirun over every host (as sagemaker_mpi_enabled does); smddp: as SageMaker's distributed "
        "data parallel launch (as sagemaker_distributed_dataparallel_enabled does)",
        "trainport.spec",
    ),
    "trainport:processes-per-host": Tag(
        "P: processes per host for torchrun or MPI (default: the host's GPU count, else 1)",
        "trainport.spec",
    ),
    "trainport:mpi-options": Tag(
        "extra mpirun options (as sagemaker_mpi_custom_mpi_options)",
        "trainport.spec",
    ),
    "trainport:gpus-per-host": Tag(
        "K or all: each host's share of the machine's GPUs (default: "
        "an equal split; fewer GPUs than hosts: one each, shared in turn)",
        "trainport.host.gpus",
    ),
    "trainport:network": Tag(
        "namespaces (the default as root, ray aside: each host a network "
        "namespace on a bridge of the job's own, the outside through NAT, nothing of the machine "
        "or of other jobs) or loopback (the machine's network, host k at 127.a.b.(k+1), a block "
        "per job; the default without root)",
        "trainport.spec",
    ),
    "trainport:host-bandwidth": Tag(
        "with network=namespaces, shape each host's link with tc tbf to this rate (e.g. 400mbit)",
        "trainport.runners.netns",
    ),
    "trainport:resources": Tag(
        "instance (default: each host gets its InstanceType's memory, CPUs "
        "and processes, enforced) or machine (no limits: the whole machine)",
        "trainport.runners.limits",
    ),
}

_PARSERS: dict[str, TagParser] = {}


def parser(key: str) -> Callable[[TagParser], TagParser]:
    """Register the decorated function as the parser of tag ``key`` (a known key)."""
    if key not in KNOWN:
        raise KeyError(f"{key} is not a known trainport tag; list it in trainport.tags.KNOWN")

    def register(parse: TagParser) -> TagParser:
        _PARSERS[key] = parse
        return parse

    return register


def check(tags: Mapping[str, str]) -> None:
    """Refuse an unknown ``trainport:`` key, or a value its owner's parser refuses, in the
    request's order."""
    for key, value in tags.items():
        if not key.startswith("trainport:"):
            continue
        if key not in KNOWN:
            raise ValidationError(
                f"Tags: unknown trainport extension {key!r}; known: {', '.join(KNOWN)}"
            )
        parse = _PARSERS.get(key)
        if parse is None:
            importlib.import_module(KNOWN[key].owner)  # registers its parsers
            parse = _PARSERS.get(key)
        if parse is not None:
            parse(value, tags)
