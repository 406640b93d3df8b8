"""Channels in File mode: which objects a host gets, where each lands, and staging them.

The decisions are pure functions (:func:`object_order`, :func:`shard`, :func:`prefix_name`,
:func:`relative_path`) with unit tests; :func:`resolve_channel` lists or reads a manifest
from the store, and :func:`stage_file_channel` downloads in parallel.
"""

from __future__ import annotations

import json
import posixpath
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from trainport.errors import ValidationError
from trainport.spec import ChannelSpec, confined_uri
from trainport.store.api import ObjectStore, S3Uri
from trainport.store.transfer import Progress, Transfer, TransferStats, download_all

__all__ = [
    "ChannelObject",
    "ManifestLine",
    "object_order",
    "prefix_name",
    "relative_path",
    "resolve_augmented_manifest",
    "resolve_channel",
    "shard",
    "stage_file_channel",
]


@dataclass(frozen=True)
class ChannelObject:
    bucket: str
    key: str
    rel_path: str  # where it lands under /opt/ml/input/data/<channel>/
    size: int


def relative_path(rel: str, *, what: str) -> str:
    """``rel`` if it stays inside its channel folder; a clear error otherwise."""
    if rel.startswith("/") or "\\" in rel:
        raise ValidationError(f"{what} would land outside the channel directory (absolute path)")
    parts = rel.split("/")
    if any(p == ".." for p in parts):
        raise ValidationError(
            f"{what} would land outside the channel directory ('..' in its path); "
            "rename the object or fix the manifest"
        )
    clean = posixpath.normpath(rel)
    if clean in (".", "") or clean.startswith("../"):
        raise ValidationError(f"{what} has no usable file name")
    return clean


def prefix_name(prefix: str, key: str) -> str:
    """Where the object ``key`` (which starts with ``prefix``) lands under its channel.

    A key below the prefix taken as a folder keeps its path under that folder
    (``data/train`` or ``data/train/``: ``data/train/a.csv`` is ``a.csv``). Any other match
    (the object the prefix names, or a key that only extends the prefix's last segment)
    keeps its name relative to the prefix's last '/'-delimited folder, as SageMaker does:
    ``p/a.txt`` gives ``a.txt`` and ``a.txt.bak``, never ``.bak``. Empty and '.' segments
    (``a//b``) are dropped, so every name is a plain relative path.
    """
    rest = key[len(prefix) :]
    if prefix and not prefix.endswith("/"):
        rest = rest[1:] if rest.startswith("/") else posixpath.basename(prefix) + rest
    return "/".join(p for p in rest.split("/") if p not in ("", "."))


def _prefix_objects(store: ObjectStore, uri: S3Uri, where: str) -> list[ChannelObject]:
    found = store.list_objects(uri.bucket, uri.key)
    objects = []
    for obj in found:
        if obj.key.endswith("/"):
            continue
        rel = relative_path(
            prefix_name(uri.key, obj.key), what=f"{where}: object s3://{uri.bucket}/{obj.key}"
        )
        objects.append(ChannelObject(uri.bucket, obj.key, rel, obj.size))
    return objects


def _manifest_objects(store: ObjectStore, uri: S3Uri, where: str) -> list[ChannelObject]:
    raw = store.get_bytes(uri.bucket, uri.key)
    try:
        doc: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{where}: manifest {uri} is not JSON: {exc}") from exc
    if (
        not isinstance(doc, list)
        or not doc
        or not isinstance(doc[0], dict)
        or not isinstance(doc[0].get("prefix"), str)
    ):
        raise ValidationError(
            f"{where}: manifest {uri} must be a JSON array whose first element is "
            '{"prefix": "s3://bucket/prefix/"} followed by keys relative to it'
        )
    prefix = confined_uri(doc[0]["prefix"], f"{where}: manifest {uri} prefix")
    # One listing of the prefix gives every entry's size (one request per page, not per key).
    sizes = {o.key: o.size for o in store.list_objects(prefix.bucket, prefix.key)}
    objects = []
    for i, entry in enumerate(doc[1:], start=1):
        if not isinstance(entry, str) or not entry:
            raise ValidationError(
                f"{where}: manifest {uri} entry {i} is not a key string: {entry!r}"
            )
        rel = relative_path(entry, what=f"{where}: manifest {uri} entry {i} {entry!r}")
        key = prefix.key + entry
        if key not in sizes:
            raise ValidationError(
                f"{where}: manifest {uri} entry {i} names s3://{prefix.bucket}/{key}, "
                "which does not exist"
            )
        objects.append(ChannelObject(prefix.bucket, key, rel, sizes[key]))
    return objects


def resolve_channel(store: ObjectStore, channel: ChannelSpec) -> list[ChannelObject]:
    """Every object of a channel, in key (or manifest) order; never empty.

    A manifest may list an object more than once (to weight it). A Pipe channel streams it
    as often as listed; a File or FastFile channel holds it once, at its one path."""
    where = f"channel {channel.name!r}"
    uri = S3Uri.parse(channel.s3_uri, field=f"{where} S3Uri")
    if channel.s3_data_type == "ManifestFile":
        objects = _manifest_objects(store, uri, where)
    else:
        objects = _prefix_objects(store, uri, where)
    if not objects:
        raise ValidationError(
            f'No S3 objects found under S3 URL "{channel.s3_uri}" given in input data '
            f"source ({where}); put the data there first (in the {store.description})"
        )
    seen: dict[str, str] = {}
    distinct = []
    for obj in objects:
        if obj.rel_path not in seen:
            seen[obj.rel_path] = obj.key
            distinct.append(obj)
        elif seen[obj.rel_path] != obj.key:
            raise ValidationError(
                f"{where}: objects {seen[obj.rel_path]!r} and {obj.key!r} would both land at "
                f"{obj.rel_path!r}"
            )
    return objects if channel.input_mode == "Pipe" else distinct


@dataclass(frozen=True)
class ManifestLine:
    """One line of an augmented manifest: its records, one per attribute in
    ``AttributeNames`` order. A ``-ref`` attribute's record is the referenced object
    (an :class:`S3Uri` to fetch); any other is the value itself (a string as its UTF-8,
    any other JSON value as compact JSON text)."""

    manifest: str
    line_no: int  # 1-based, as editors count
    records: tuple[tuple[str, S3Uri | bytes], ...]

    @property
    def key(self) -> str:
        return f"{self.manifest}#{self.line_no:012d}"


def _attribute_record(attribute: str, value: Any, where: str) -> tuple[str, S3Uri | bytes]:
    if attribute.endswith("-ref"):
        if not isinstance(value, str):
            raise ValidationError(f"{where}: attribute {attribute!r} must be an S3 URI string")
        return attribute, confined_uri(value, f"{where} attribute {attribute!r}")
    if isinstance(value, str):
        return attribute, value.encode("utf-8")
    return attribute, json.dumps(value, separators=(",", ":")).encode("utf-8")


def resolve_augmented_manifest(store: ObjectStore, channel: ChannelSpec) -> list[ManifestLine]:
    """Every line of an AugmentedManifestFile channel, parsed and checked before training:
    a line that is not a JSON object or lacks one of ``AttributeNames`` is an error naming
    the manifest and the line. Blank lines are skipped."""
    where = f"channel {channel.name!r}"
    uri = S3Uri.parse(channel.s3_uri, field=f"{where} S3Uri")
    raw = store.get_bytes(uri.bucket, uri.key)
    lines = []
    for line_no, text in enumerate(raw.split(b"\n"), start=1):
        if not text.strip():
            continue
        at = f"{where}: augmented manifest {uri} line {line_no}"
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValidationError(f"{at} is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ValidationError(f"{at} is not a JSON object")
        missing = [a for a in channel.attribute_names if a not in doc]
        if missing:
            raise ValidationError(
                f"{at} lacks attribute(s) {', '.join(map(repr, missing))} named in "
                "AttributeNames; add them to the line or remove the line"
            )
        records = tuple(_attribute_record(a, doc[a], at) for a in channel.attribute_names)
        lines.append(ManifestLine(str(uri), line_no, records))
    if not lines:
        raise ValidationError(f"{where}: augmented manifest {uri} has no lines")
    return lines


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...


_T = TypeVar("_T", bound=_Keyed)


def object_order(objects: Sequence[_T], seed: int | None, epoch: int) -> list[_T]:
    """The channel's object (or augmented-manifest line) order: as listed, or shuffled as a
    pure function of (seed, epoch, object list), identical on every host and every rerun."""
    ordered = sorted(objects, key=lambda o: o.key) if seed is not None else list(objects)
    if seed is not None:
        random.Random(f"{seed}:{epoch}").shuffle(ordered)
    return ordered


def shard(objects: Sequence[_T], distribution: str, host_index: int, host_count: int) -> list[_T]:
    """The objects host ``host_index`` of ``host_count`` gets: all of them when fully
    replicated; with ShardedByS3Key every ``host_count``-th, so shards are disjoint,
    cover the channel and differ in size by at most one object."""
    if not 0 <= host_index < host_count:
        raise ValueError(f"host index {host_index} outside 0..{host_count - 1}")
    if distribution != "ShardedByS3Key" or host_count == 1:
        return list(objects)
    return [o for i, o in enumerate(objects) if i % host_count == host_index]


def stage_file_channel(
    store: ObjectStore,
    objects: Sequence[ChannelObject],
    dest: Path,
    *,
    workers: int,
    progress: bool = False,
    label: str = "download",
    on_progress: Progress | None = None,
) -> TransferStats:
    dest.mkdir(parents=True, exist_ok=True)
    items = [Transfer(o.bucket, o.key, dest / o.rel_path, o.size) for o in objects]
    return download_all(
        store, items, workers=workers, label=label, progress=progress, on_progress=on_progress
    )
