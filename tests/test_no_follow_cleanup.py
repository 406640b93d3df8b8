"""The platform never follows a link a job made when it removes or packs the job's tree.

Written as an attacker would: the job plants links to a folder of the machine's (one the
test made, holding files) in its data folder, in place of its data folder, and in the other
folders the platform cleans or packs; then the platform makes room, cleans up or archives.
The outside folder and its files must survive, and nothing of them may be archived.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import python_job, require
from trainport.config import load_settings
from trainport.errors import DatabaseError
from trainport.host import diskspace, jobtree
from trainport.host.artifacts import _add, pack_dir, pack_merged
from trainport.jobs.service import JobService
from trainport.runners.sandbox import sandbox_problem


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder of the machine's that no job owns."""
    folder = tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    (folder / "keep.txt").write_text("the machine's")
    (folder / "sub" / "deep.txt").write_text("the machine's too")
    return folder


def intact(folder: Path) -> bool:
    return (folder / "keep.txt").read_text() == "the machine's" and (
        folder / "sub" / "deep.txt"
    ).read_text() == "the machine's too"


def staged(tmp_path: Path, outside: Path) -> Path:
    """A host's data folder with a channel, and links to ``outside`` planted in it."""
    data = tmp_path / "host" / "input" / "data"
    (data / "train" / "nested").mkdir(parents=True)
    (data / "train" / "part-0").write_text("staged")
    (data / "train" / "evil").symlink_to(outside)
    (data / "train" / "nested" / "file-link").symlink_to(outside / "keep.txt")
    (data / "link").symlink_to(outside)
    return data


def test_make_room_removes_links_not_what_they_name(tmp_path: Path, outside: Path) -> None:
    data = staged(tmp_path, outside)
    assert diskspace.make_room(data) == 2
    assert list(data.iterdir()) == []
    assert intact(outside)


def test_make_room_does_not_follow_a_link_in_place_of_the_data_folder(
    tmp_path: Path, outside: Path
) -> None:
    data = tmp_path / "host" / "input" / "data"
    data.parent.mkdir(parents=True)
    data.symlink_to(outside)
    assert diskspace.make_room(data) == 0
    assert intact(outside)
    # A link further up (the job replaced input) is not followed either.
    (outside / "data").mkdir()
    (outside / "data" / "x").write_text("x")
    data.unlink()
    data.parent.rmdir()
    data.parent.symlink_to(outside)
    assert diskspace.make_room(data) == 0
    assert intact(outside) and (outside / "data" / "x").exists()


def test_make_room_leaves_a_mount_point(tmp_path: Path, outside: Path) -> None:
    require(os.geteuid() == 0, "mounting a tmpfs as a FastFile view's stand-in needs root")
    data = staged(tmp_path, outside)
    view = data / "view"
    view.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(view)], check=True)
    try:
        (view / "object").write_text("served")
        diskspace.make_room(data)
        assert (view / "object").read_text() == "served"
        assert [p.name for p in data.iterdir()] == ["view"]
    finally:
        subprocess.run(["umount", "-l", str(view)], check=True)
    assert intact(outside)


def test_remove_tree_never_follows_and_goes_as_deep_as_a_job_made_it(
    tmp_path: Path, outside: Path
) -> None:
    hosts = tmp_path / "job" / "hosts"
    model = hosts / "algo-1" / "model"
    model.mkdir(parents=True)
    (model / "evil").symlink_to(outside)
    (model / "file-link").symlink_to(outside / "keep.txt")
    # Deeper than Python's recursion limit, and than PATH_MAX as one path.
    fd = os.open(model, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir("deeper-and-deeper", dir_fd=fd)
        nxt = os.open("deeper-and-deeper", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.symlink(str(outside), "at-the-bottom", dir_fd=fd)
    os.close(fd)
    assert jobtree.remove_tree(hosts)
    assert not hosts.exists() and intact(outside)
    # A path reached through a link is not removed at all.
    linked = tmp_path / "linked"
    linked.symlink_to(outside)
    assert not jobtree.remove_tree(linked / "sub")
    assert intact(outside)


def test_archives_hold_links_as_links(tmp_path: Path, outside: Path) -> None:
    model = tmp_path / "model"
    (model / "weights").mkdir(parents=True)
    (model / "weights" / "w.bin").write_bytes(b"w")
    (model / "evil").symlink_to(outside)
    (model / "weights" / "file-link").symlink_to(outside / "keep.txt")
    target = tmp_path / "model.tar.gz"
    pack_dir(model, target)
    with tarfile.open(target) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["evil"].issym() and members["weights/file-link"].issym()
        assert tar.extractfile("weights/w.bin").read() == b"w"  # type: ignore[union-attr]
    merged = tmp_path / "merged.tar.gz"
    pack_merged([("algo-1", model), ("algo-2", outside)], merged)
    with tarfile.open(merged) as tar:
        names = tar.getnames()
    assert "sub/deep.txt" in names  # algo-2's real folder is packed as it is
    (tmp_path / "linked-model").symlink_to(outside)
    pack_dir(tmp_path / "linked-model", target)
    with tarfile.open(target) as tar:
        assert tar.getnames() == []


def test_a_file_swapped_for_a_link_after_listing_is_not_read(tmp_path: Path, outside: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "w.bin").write_text("mine")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for rel, st, folder, name in jobtree.walk(model):
            (model / "w.bin").unlink()  # the job's last move, between listing and reading
            (model / "w.bin").symlink_to(outside / "keep.txt")
            _add(tar, rel, st, folder, name)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        assert tar.getnames() == []


# -- a job that fills the disk after planting its links ---------------------------------------

PLANT_AND_FILL = """
import os, shutil
base = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
outside = os.environ["OUTSIDE"]
data = base + "/input/data"
os.symlink(outside, data + "/train/evil")
os.rename(data, base + "/input/was-data")
os.symlink(outside, data)
os.symlink(outside, base + "/model/evil")
os.symlink(outside, base + "/output/data/evil")
with open(base + "/model/fill.bin", "wb") as f:
    while True:
        f.write(b"\\0" * (1 << 20))
"""


@pytest.fixture
def small_home(home: Path) -> Iterator[Path]:
    """TRAINPORT_HOME on an 8 MiB tmpfs of its own, removed after the test."""
    require(os.geteuid() == 0, "mounting a small tmpfs as TRAINPORT_HOME needs root")
    home.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(home)], check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=True)


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_a_job_that_fills_the_disk_cannot_make_the_platform_delete_through_its_links(
    small_home: Path, outside: Path, runner: str
) -> None:
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    (small_home / "store" / "data" / "train").mkdir(parents=True)
    (small_home / "store" / "data" / "train" / "part-0").write_text("staged")
    service = JobService(load_settings())
    name = f"plant-{runner}"
    body = python_job(
        name,
        PLANT_AND_FILL,
        Environment={"OUTSIDE": str(outside)},
        InputDataConfig=[
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/train/"}
                },
            }
        ],
    )
    service.create(body, runner=runner)
    deadline = time.monotonic() + 180
    while True:  # the database cannot be read while the disk is full: ask again
        with contextlib.suppress(DatabaseError):
            record = service.get(name)
            if record.status in ("Completed", "Failed", "Stopped"):
                break
        assert time.monotonic() < deadline, f"job {name} did not end"
        time.sleep(0.1)
    assert record.status == "Failed"
    assert "no space left on the device" in (record.failure_reason or ""), record.failure_reason
    assert intact(outside), sorted(p.name for p in outside.rglob("*"))
