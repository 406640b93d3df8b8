"""The object-store contract shared by the local store and S3-compatible endpoints."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from trainport.errors import ValidationError

__all__ = ["ObjectInfo", "ObjectStore", "S3Uri"]

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{0,254}$")


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str, *, field: str = "S3Uri") -> S3Uri:
        """Parse ``s3://bucket/key``; the error names the field that held ``uri``."""
        if not isinstance(uri, str) or not uri.startswith("s3://"):
            raise ValidationError(
                f"{field}: {uri!r} is not an S3 URI; write it as s3://bucket/prefix "
                "(with the embedded store that is the folder $TRAINPORT_HOME/store/bucket/prefix)"
            )
        bucket, _, key = uri[len("s3://") :].partition("/")
        if not _BUCKET.match(bucket):
            raise ValidationError(
                f"{field}: {uri!r} has no valid bucket name; bucket names are 1-255 "
                "lowercase letters, digits, '.', '-' or '_'"
            )
        return cls(bucket, key)

    def child(self, name: str) -> S3Uri:
        base = self.key if not self.key or self.key.endswith("/") else self.key + "/"
        return S3Uri(self.bucket, base + name)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


class ObjectStore(ABC):
    """A flat namespace of buckets and keys, as S3 has it."""

    #: Names the store in error messages ("local store /x/store", "S3 endpoint http://...").
    description: str

    @abstractmethod
    def list_objects(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a string prefix, as in S3), sorted."""

    @abstractmethod
    def download(self, bucket: str, key: str, dest: Path) -> int:
        """Copy one object into ``dest`` (parents created); returns the bytes written."""

    @abstractmethod
    def upload(self, src: Path, bucket: str, key: str) -> None:
        """Store the file ``src`` as one object; readers never see a partial object."""

    @abstractmethod
    def get_bytes(self, bucket: str, key: str) -> bytes: ...

    @abstractmethod
    def put_bytes(self, bucket: str, key: str, data: bytes) -> None: ...

    @abstractmethod
    def open_stream(self, bucket: str, key: str) -> BinaryIO:
        """A readable stream over one object, for streaming without staging."""

    @abstractmethod
    def read_range(self, bucket: str, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of one object."""

    @abstractmethod
    def delete(self, bucket: str, key: str) -> None: ...

    def exists(self, bucket: str, key: str) -> bool:
        return any(o.key == key for o in self.list_objects(bucket, key))

    def local_path(self, bucket: str, key: str) -> Path | None:
        """The object as a plain file on this machine, where the store keeps it so (the
        embedded store does); ``None`` otherwise. Pipe mode splices such a file into its FIFO
        in the kernel instead of reading it into memory."""
        return None

    def iter_chunks(self, bucket: str, key: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        with self.open_stream(bucket, key) as stream:
            while block := stream.read(chunk):
                yield block
