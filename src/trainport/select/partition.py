"""Datasets as files, split into partitions, read from a folder or the object store.

A dataset is a local folder or an ``s3://`` prefix of files. :func:`list_files` lists it
(through :mod:`trainport.store` for prefixes, so the embedded local store and
S3-compatible endpoints both work); :func:`split_partitions` shuffles the files once with
the seed and deals them into ``p`` partitions of nearly equal size (a pure function);
:func:`fetch` makes one file local on the worker that needs it and counts the bytes read.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainport.errors import NotFoundError, ValidationError

__all__ = ["DataFile", "fetch", "list_files", "split_partitions"]


@dataclass(frozen=True)
class DataFile:
    """A file of a dataset: a local path or an ``s3://`` URI, with its size."""

    uri: str
    size: int


def list_files(source: str | Path, *, field: str = "data") -> list[DataFile]:
    """Every file under ``source``, sorted by name; hidden files are skipped."""
    text = str(source)
    if text.startswith("s3://"):
        from trainport.config import load_settings
        from trainport.store import S3Uri, open_store

        uri = S3Uri.parse(text, field=field)
        store = open_store(load_settings())
        objects = store.list_objects(uri.bucket, uri.key)
        files = [
            DataFile(f"s3://{uri.bucket}/{o.key}", o.size)
            for o in objects
            if not o.key.rsplit("/", 1)[-1].startswith(".")
        ]
    else:
        root = Path(text).expanduser()
        if root.is_file():
            return [DataFile(str(root.resolve()), root.stat().st_size)]
        if not root.is_dir():
            raise NotFoundError(f"{field}: {text!r} is neither a folder nor an s3:// prefix")
        files = [
            DataFile(str(p.resolve()), p.stat().st_size)
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        ]
    if not files:
        raise NotFoundError(f"{field}: {text!r} holds no files; put the dataset's files there")
    return sorted(files, key=lambda f: f.uri)


def split_partitions(files: Sequence[DataFile], partitions: int, seed: int) -> list[list[DataFile]]:
    """Shuffle once, then deal files into ``partitions`` groups, largest first to the lightest.

    The shuffle is what lets each model see partitions as i.i.d. samples of the data; the
    greedy dealing keeps partitions near the same size so units take similar time.
    """
    if partitions < 1:
        raise ValidationError(f"partitions={partitions}: need at least one")
    if len(files) < partitions:
        raise ValidationError(
            f"partitions={partitions}: the dataset has only {len(files)} file(s); split it "
            "into at least as many files as partitions"
        )
    shuffled = list(files)
    random.Random(seed).shuffle(shuffled)
    # Stable sort by size keeps the shuffled order among equal sizes.
    shuffled.sort(key=lambda f: -f.size)
    groups: list[list[DataFile]] = [[] for _ in range(partitions)]
    loads = [0] * partitions
    for f in shuffled:
        i = min(range(partitions), key=lambda k: (loads[k], len(groups[k]), k))
        groups[i].append(f)
        loads[i] += f.size
    return groups


def fetch(file: DataFile, cache: Path) -> Path:
    """A local path for ``file``: itself when local, else downloaded into ``cache``."""
    if not file.uri.startswith("s3://"):
        return Path(file.uri)
    from trainport.config import load_settings
    from trainport.store import S3Uri, open_store

    uri = S3Uri.parse(file.uri)
    dest = (cache / uri.bucket / uri.key).resolve()
    if not dest.is_relative_to(cache.resolve()):
        # A key like "../x" must not write outside the worker's cache.
        raise ValidationError(f"data file {file.uri!r}: its key leaves the download folder")
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        open_store(load_settings()).download(uri.bucket, uri.key, dest)
    return dest
