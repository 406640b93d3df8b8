"""An ``s3://`` prefix read directly with boto3, as a listed channel.

boto3 is imported only when an S3 channel is used, so training code that reads FIFOs or
files does not need it. The endpoint honours ``AWS_ENDPOINT_URL_S3`` and
``AWS_ENDPOINT_URL`` (read when the client is made), so the same code reads AWS, MinIO, or
trainport's own store. Clients are not picklable, so each DataLoader worker makes its own.
"""

from __future__ import annotations

import io
import os
from typing import Any

from trainport.data.channel import ChannelObject, ListedChannel, ObjectStream
from trainport.data.errors import DataError

__all__ = ["S3Channel", "split_s3_uri"]


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    if not uri.startswith("s3://"):
        raise DataError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise DataError(f"S3 URI {uri!r} has no bucket")
    return bucket, prefix


class S3Channel(ListedChannel):
    """Every object whose key starts with the prefix of ``uri`` (keys ending in ``/`` skipped)."""

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.uri = uri
        self.bucket, self.prefix = split_s3_uri(uri)
        self.endpoint_url = endpoint_url
        self.client_kwargs = dict(client_kwargs or {})
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise DataError("reading s3:// channels needs boto3: pip install boto3") from None
            endpoint = (
                self.endpoint_url
                or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL")
                or None
            )
            self._client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint, **self.client_kwargs
            )
        return self._client

    def describe(self, obj: ChannelObject | None = None) -> str:
        if obj is None:
            return self.uri
        return f"s3://{self.bucket}/{self.prefix}{obj.name}"

    def list_objects(self) -> list[ChannelObject]:
        from botocore.exceptions import BotoCoreError, ClientError

        found = []
        try:
            pages = (
                self.client()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=self.bucket, Prefix=self.prefix)
            )
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"]
                    if key.endswith("/"):
                        continue
                    found.append(ChannelObject(key[len(self.prefix) :], int(item["Size"])))
        except (BotoCoreError, ClientError) as exc:
            raise DataError(f"cannot list {self.uri}: {exc}") from exc
        return sorted(found, key=lambda o: o.name)

    def open_object(self, obj: ChannelObject, offset: int = 0) -> ObjectStream:
        from botocore.exceptions import BotoCoreError, ClientError

        if offset >= obj.size:
            # S3 answers a range starting at the end with 416, so resuming there reads nothing.
            return io.BytesIO(b"")
        request: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + obj.name}
        if offset:
            request["Range"] = f"bytes={offset}-"
        try:
            body: ObjectStream = self.client().get_object(**request)["Body"]
        except (BotoCoreError, ClientError) as exc:
            raise DataError(f"cannot read {self.describe(obj)}: {exc}") from exc
        return body
