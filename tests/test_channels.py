"""Pure channel decisions: key -> path, shuffle order, ShardedByS3Key assignment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import put
from trainport.errors import ValidationError
from trainport.host.channels import (
    ChannelObject,
    object_order,
    prefix_name,
    relative_path,
    resolve_channel,
    shard,
)
from trainport.spec import ChannelSpec
from trainport.store.local import LocalStore


def objs(n: int) -> list[ChannelObject]:
    return [ChannelObject("b", f"p/{i:03d}", f"{i:03d}", 1) for i in range(n)]


@pytest.mark.parametrize("hosts", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("count", [0, 1, 5, 10, 101])
def test_sharded_by_key_is_disjoint_complete_and_balanced(hosts: int, count: int) -> None:
    objects = objs(count)
    shards = [shard(objects, "ShardedByS3Key", i, hosts) for i in range(hosts)]
    keys = [o.key for s in shards for o in s]
    assert sorted(keys) == sorted(o.key for o in objects)
    assert len(keys) == len(set(keys))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_fully_replicated_gives_every_host_everything() -> None:
    objects = objs(5)
    assert all(shard(objects, "FullyReplicated", i, 3) == objects for i in range(3))


def test_shuffle_is_a_pure_function_of_seed_epoch_and_objects() -> None:
    objects = objs(50)
    first = object_order(objects, 7, 0)
    assert first == object_order(list(reversed(objects)), 7, 0)  # listing order irrelevant
    assert first != object_order(objects, 7, 1)
    assert first != object_order(objects, 8, 0)
    assert sorted(first, key=lambda o: o.key) == objects
    assert object_order(objects, None, 0) == objects


def test_shuffled_sharding_changes_membership_across_epochs() -> None:
    objects = objs(40)
    e0 = {o.key for o in shard(object_order(objects, 1, 0), "ShardedByS3Key", 0, 2)}
    e1 = {o.key for o in shard(object_order(objects, 1, 1), "ShardedByS3Key", 0, 2)}
    assert e0 != e1


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "/etc/passwd", "a/..", ".."])
def test_paths_outside_the_channel_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="outside the channel directory"):
        relative_path(bad, what="x")


def test_keys_are_kept_relative_to_the_prefix(home: Path) -> None:
    put(home, "bkt", "data/train/a.csv", "a")
    put(home, "bkt", "data/train/sub/b.csv", "b")
    put(home, "bkt", "data/trainer/c.csv", "c")  # a string prefix matches this too, as in S3
    store = LocalStore(home / "store")
    got = resolve_channel(store, _channel("s3://bkt/data/train/"))
    assert [o.rel_path for o in got] == ["a.csv", "sub/b.csv"]
    got = resolve_channel(store, _channel("s3://bkt/data/train"))
    # data/trainer/ only extends the prefix's last segment: it keeps its own folder name.
    assert [o.rel_path for o in got] == ["a.csv", "sub/b.csv", "trainer/c.csv"]
    single = resolve_channel(store, _channel("s3://bkt/data/train/a.csv"))
    assert [o.rel_path for o in single] == ["a.csv"]


def test_an_object_uri_keeps_every_match_under_its_own_name(home: Path) -> None:
    put(home, "data", "p/a.txt", "a")
    put(home, "data", "p/a.txt.bak", "b")
    got = resolve_channel(LocalStore(home / "store"), _channel("s3://data/p/a.txt"))
    assert [(o.key, o.rel_path) for o in got] == [
        ("p/a.txt", "a.txt"),
        ("p/a.txt.bak", "a.txt.bak"),
    ]


@pytest.mark.parametrize(
    ("prefix", "key", "name"),
    [
        ("p/a.txt", "p/a.txt", "a.txt"),
        ("p/a.txt", "p/a.txt.bak", "a.txt.bak"),
        ("a.txt", "a.txt.bak", "a.txt.bak"),
        ("p/", "p/x/y", "x/y"),
        ("p", "p/x", "x"),
        ("p", "pq/x", "pq/x"),
        ("", "x/y", "x/y"),
        ("p/", "p//x/./y", "x/y"),
    ],
)
def test_prefix_names(prefix: str, key: str, name: str) -> None:
    assert prefix_name(prefix, key) == name


def _channel(uri: str, kind: str = "S3Prefix") -> ChannelSpec:
    return ChannelSpec("train", kind, uri, "FullyReplicated", "File")


def test_manifest_file(home: Path) -> None:
    put(home, "bkt", "d/x/1.txt", "1")
    put(home, "bkt", "d/x/2.txt", "22")
    put(home, "bkt", "m.json", '[{"prefix": "s3://bkt/d/"}, "x/2.txt", "x/1.txt"]')
    got = resolve_channel(LocalStore(home / "store"), _channel("s3://bkt/m.json", "ManifestFile"))
    assert [(o.key, o.rel_path, o.size) for o in got] == [
        ("d/x/2.txt", "x/2.txt", 2),
        ("d/x/1.txt", "x/1.txt", 1),
    ]


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ('{"prefix": "s3://bkt/d/"}', "JSON array"),
        ('["x/1.txt"]', "JSON array"),
        ("not json", "not JSON"),
        ('[{"prefix": "s3://bkt/d/"}, "../escape"]', "outside the channel directory"),
        ('[{"prefix": "s3://bkt/d/"}, "x/missing"]', "does not exist"),
        ('[{"prefix": "/tmp/d/"}, "x"]', "not an S3 URI"),
    ],
)
def test_bad_manifests_are_refused(home: Path, manifest: str, message: str) -> None:
    put(home, "bkt", "d/x/1.txt", "1")
    put(home, "bkt", "m.json", manifest)
    with pytest.raises(ValidationError, match=message):
        resolve_channel(LocalStore(home / "store"), _channel("s3://bkt/m.json", "ManifestFile"))


def test_empty_prefix_is_refused(home: Path) -> None:
    with pytest.raises(ValidationError, match="No S3 objects found under S3 URL"):
        resolve_channel(LocalStore(home / "store"), _channel("s3://nothing/here/"))
