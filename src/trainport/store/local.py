"""The embedded store: ``s3://bucket/key`` is the file ``<root>/bucket/key``.

Objects are plain files so users can put data in with ``cp``. Writes go to a temporary file
in the same directory and are renamed into place, so a reader sees the old object or the new
one, never half of one. Copies out use ``copy_file_range`` (the kernel copies, and on
filesystems with reflinks it shares blocks), never hard links: a job that writes into its
staged input must not change the stored object.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from trainport.errors import StoreError, ValidationError
from trainport.store.api import ObjectInfo, ObjectStore

__all__ = ["LocalStore", "copy_file"]

_COPY_CHUNK = 1 << 30


def copy_file(src: Path, dest: Path) -> int:
    """Copy ``src`` to ``dest`` in the kernel; returns the bytes copied."""
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        copied = 0
        try:
            while copied < size:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), min(_COPY_CHUNK, size - copied))
                if n == 0:
                    break
                copied += n
        except OSError:
            # Some filesystems (overlay on old kernels, FUSE) refuse copy_file_range.
            fin.seek(copied)
            fout.seek(copied)
            while block := fin.read(8 << 20):
                fout.write(block)
                copied += len(block)
        return copied


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _write_failed(exc: OSError, path: Path, what: str) -> StoreError:
    """A failed write of ``what`` to ``path`` as a StoreError that says where and why."""
    if exc.errno in _NO_SPACE:
        return StoreError(f"no space left on the device writing {path} (copying {what})")
    return StoreError(f"cannot write {path} (copying {what}): {exc.strerror or exc}")


class LocalStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.description = f"local store {self.root}"

    def _missing(self, bucket: str, key: str) -> StoreError:
        return StoreError(f"s3://{bucket}/{key} does not exist in the {self.description}")

    def _path(self, bucket: str, key: str) -> Path:
        parts = key.split("/")
        if any(p in ("..", ".") for p in parts) or key.startswith("/"):
            raise ValidationError(
                f"object key {key!r} in bucket {bucket!r} has '.' or '..' segments; "
                "the embedded store cannot hold it"
            )
        return self.root / bucket / key

    def list_objects(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        bucket_dir = self.root / bucket
        if not bucket_dir.is_dir():
            return []
        # Walk only the deepest folder the prefix names, then filter by string prefix.
        folder, _, _ = prefix.rpartition("/")
        start = self._path(bucket, folder) if folder else bucket_dir
        if not start.is_dir():
            return []
        found: list[ObjectInfo] = []
        base_len = len(str(bucket_dir)) + 1
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".trainport-tmp")]
            for name in filenames:
                if name.startswith(".trainport-tmp"):
                    continue
                full = os.path.join(dirpath, name)
                key = full[base_len:]
                if key.startswith(prefix):
                    found.append(ObjectInfo(key, os.stat(full).st_size))
        found.sort(key=lambda o: o.key)
        return found

    def download(self, bucket: str, key: str, dest: Path) -> int:
        src = self._path(bucket, key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            return copy_file(src, dest)
        except FileNotFoundError as exc:
            raise StoreError(
                f"s3://{bucket}/{key} does not exist in the {self.description}"
            ) from exc
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise _write_failed(exc, dest, f"s3://{bucket}/{key}") from exc
            raise

    def _atomic_target(self, bucket: str, key: str) -> tuple[Path, int, str]:
        target = self._path(bucket, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".trainport-tmp", dir=target.parent)
        return target, fd, tmp

    def upload(self, src: Path, bucket: str, key: str) -> None:
        try:
            target, fd, tmp = self._atomic_target(bucket, key)
        except OSError as exc:
            raise _write_failed(exc, self._path(bucket, key), str(src)) from exc
        os.close(fd)
        try:
            copy_file(src, Path(tmp))
            os.replace(tmp, target)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
                raise _write_failed(exc, target, str(src)) from exc
            raise

    def get_bytes(self, bucket: str, key: str) -> bytes:
        try:
            return self._path(bucket, key).read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(
                f"s3://{bucket}/{key} does not exist in the {self.description}"
            ) from exc

    def put_bytes(self, bucket: str, key: str, data: bytes) -> None:
        try:
            target, fd, tmp = self._atomic_target(bucket, key)
        except OSError as exc:
            raise _write_failed(exc, self._path(bucket, key), f"{len(data)} bytes") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
                raise _write_failed(exc, target, f"{len(data)} bytes") from exc
            raise

    def open_stream(self, bucket: str, key: str) -> BinaryIO:
        try:
            return open(self._path(bucket, key), "rb")
        except FileNotFoundError as exc:
            raise StoreError(
                f"s3://{bucket}/{key} does not exist in the {self.description}"
            ) from exc

    def read_range(self, bucket: str, key: str, start: int, end: int) -> bytes:
        with self.open_stream(bucket, key) as f:
            f.seek(start)
            return f.read(max(0, end - start))

    def delete(self, bucket: str, key: str) -> None:
        self._path(bucket, key).unlink(missing_ok=True)

    def exists(self, bucket: str, key: str) -> bool:
        return self._path(bucket, key).is_file()

    def local_path(self, bucket: str, key: str) -> Path | None:
        return self._path(bucket, key)
