"""Confined tarball extraction, with Python's extraction filters and without them (3.11.0-3.11.3)."""

from __future__ import annotations

import io
import os
import stat
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainport.errors import ValidationError
from trainport.host.sourcedir import unpack_sourcedir
from trainport.host.tarball import extract_within


def _without_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this interpreter's tarfile look like 3.11.0-3.11.3's: no filter API at all."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    monkeypatch.delattr(tarfile, "FilterError", raising=False)
    for method in ("extract", "extractall"):
        original = getattr(tarfile.TarFile, method)
        monkeypatch.setattr(tarfile.TarFile, method, _refusing_filter(original, method))


def _refusing_filter(original: Callable[..., Any], method: str) -> Callable[..., Any]:
    def call(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> Any:
        if "filter" in kwargs:
            raise TypeError(f"{method}() got an unexpected keyword argument 'filter'")
        return original(self, *args, **kwargs)

    return call


@pytest.fixture(params=["this-python", "no-filters"])
def tarfile_api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "no-filters":
        _without_filters(monkeypatch)
    return str(request.param)


def _tarball(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    return info


def _extract(blob: bytes, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        extract_within(tar, tar.getmembers(), root)


def test_safe_members_are_written_with_data_modes(tmp_path: Path, tarfile_api: str) -> None:
    blob = _tarball(
        (_info("pkg", tarfile.DIRTYPE, mode=0o700), b""),
        (_info("pkg/run.sh", mode=0o775), b"#!/bin/sh\n"),
        (_info("pkg/setuid", mode=0o4777), b"x"),
        (_info("pkg/plain", mode=0o066), b"y"),
        (_info("pkg/same", tarfile.LNKTYPE, "pkg/plain"), b""),
        (_info("top", tarfile.SYMTYPE, "pkg/run.sh"), b""),
    )
    root = tmp_path / "code"
    _extract(blob, root)
    assert (root / "pkg" / "run.sh").read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE((root / "pkg" / "run.sh").stat().st_mode) == 0o755
    # setuid and group/other write are dropped; the owner can always read and write.
    assert stat.S_IMODE((root / "pkg" / "setuid").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "pkg" / "plain").stat().st_mode) == 0o644
    assert os.path.samefile(root / "pkg" / "same", root / "pkg" / "plain")
    assert os.readlink(root / "top") == "pkg/run.sh"


REFUSED = {
    "dotdot-name": (_info("../x"),),
    "absolute-symlink": (_info("ln", tarfile.SYMTYPE, "/etc/passwd"),),
    "symlink-up": (_info("sub/ln", tarfile.SYMTYPE, "../../x"),),
    "hardlink-up": (_info("hl", tarfile.LNKTYPE, "../outside.txt"),),
    "device": (_info("dev", tarfile.CHRTYPE),),
    "fifo": (_info("pipe", tarfile.FIFOTYPE),),
    # Each name is harmless on its own; together "x/y" is the folder above the root.
    "link-chain": (
        _info("x", tarfile.SYMTYPE, "."),
        _info("x/y", tarfile.SYMTYPE, ".."),
        _info("x/y/escaped.txt"),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_escaping_members_are_refused(tmp_path: Path, tarfile_api: str, case: str) -> None:
    (tmp_path / "outside.txt").write_text("keep")
    blob = _tarball(*[(info, b"bad") for info in REFUSED[case]])
    root = tmp_path / "root" / "code"
    root.mkdir(parents=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValidationError, match="tarball member"):
        _extract(blob, root)
    # Nothing was written beside the root, nor through a link out of it.
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["code"]
    assert (tmp_path / "outside.txt").read_text() == "keep"
    assert not (tmp_path / "root" / "escaped.txt").exists()


def test_a_sourcedir_link_chain_is_refused_naming_the_folder(
    tmp_path: Path, tarfile_api: str
) -> None:
    """The lexical check passes a link chain; extraction must still refuse it."""
    blob = _tarball(*[(info, b"bad") for info in REFUSED["link-chain"]])
    code = tmp_path / "job" / "code"
    with pytest.raises(ValidationError, match=f"refused while extracting into {code}"):
        unpack_sourcedir(blob, code)
    assert not (tmp_path / "job" / "escaped.txt").exists()


def test_an_absolute_name_lands_inside_the_root(tmp_path: Path, tarfile_api: str) -> None:
    root = tmp_path / "code"
    _extract(_tarball((_info("/abs-x"), b"inside")), root)
    assert (root / "abs-x").read_bytes() == b"inside"


def test_this_interpreter_takes_the_matching_path() -> None:
    """Filters exist from 3.11.4 on; before that the fallback is what runs."""
    assert hasattr(tarfile, "data_filter") == (sys.version_info >= (3, 11, 4))
