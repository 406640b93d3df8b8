"""Any S3-compatible endpoint, through boto3 and the standard AWS configuration chain.

Connection failures become :class:`StoreError` naming the endpoint, so "unreachable store"
is one clear line rather than a botocore traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import boto3
import botocore.config
import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from trainport.errors import StoreError
from trainport.store.api import ObjectInfo, ObjectStore

__all__ = ["S3Store"]

# Objects below this size are fetched with one GET; larger ones in parallel ranged parts.
_MULTIPART = 16 << 20


class S3Store(ObjectStore):
    def __init__(self, *, endpoint_url: str | None, region: str, max_connections: int = 20) -> None:
        self.endpoint_url = endpoint_url
        self.description = f"S3 endpoint {endpoint_url or 'AWS default (' + region + ')'}"
        config = botocore.config.Config(
            max_pool_connections=max_connections,
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
        )
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )
        self._transfer = TransferConfig(
            multipart_threshold=_MULTIPART, multipart_chunksize=8 << 20, max_concurrency=8
        )

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except botocore.exceptions.EndpointConnectionError as exc:
            raise StoreError(
                f"cannot reach the {self.description} while {what}: {exc}. "
                "Check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and that the server is running"
            ) from exc
        except botocore.exceptions.NoCredentialsError as exc:
            raise StoreError(
                f"no AWS credentials for the {self.description} while {what}; set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or an AWS profile"
            ) from exc
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "?")
            raise StoreError(f"the {self.description} refused {what}: {code}: {exc}") from exc

    def list_objects(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        with self._errors(f"listing s3://{bucket}/{prefix}"):
            paginator = self.client.get_paginator("list_objects_v2")
            try:
                for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                    for obj in page.get("Contents", []):
                        found.append(ObjectInfo(obj["Key"], int(obj["Size"])))
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":
                    return []
                raise
        found.sort(key=lambda o: o.key)
        return found

    def download(self, bucket: str, key: str, dest: Path) -> int:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._errors(f"downloading s3://{bucket}/{key}"):
            resp = self.client.get_object(Bucket=bucket, Key=key)
            size = int(resp["ContentLength"])
            if size >= _MULTIPART:
                resp["Body"].close()
                self.client.download_file(bucket, key, str(dest), Config=self._transfer)
                return size
            body = resp["Body"]
            written = 0
            with open(dest, "wb") as f:
                while block := body.read(1 << 20):
                    f.write(block)
                    written += len(block)
            return written
        raise AssertionError("unreachable")  # pragma: no cover

    def upload(self, src: Path, bucket: str, key: str) -> None:
        with self._errors(f"uploading to s3://{bucket}/{key}"):
            self._ensure_bucket(bucket)
            self.client.upload_file(str(src), bucket, key, Config=self._transfer)

    def _ensure_bucket(self, bucket: str) -> None:
        # S3-compatible servers used on one's own hardware often start empty; creating the
        # output bucket on first write is what a user of the embedded store expects too.
        try:
            self.client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
                self.client.create_bucket(Bucket=bucket)
            else:
                raise

    def get_bytes(self, bucket: str, key: str) -> bytes:
        with self._errors(f"reading s3://{bucket}/{key}"):
            return cast(bytes, self.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        raise AssertionError("unreachable")  # pragma: no cover

    def put_bytes(self, bucket: str, key: str, data: bytes) -> None:
        with self._errors(f"writing s3://{bucket}/{key}"):
            self._ensure_bucket(bucket)
            self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def open_stream(self, bucket: str, key: str) -> BinaryIO:
        with self._errors(f"reading s3://{bucket}/{key}"):
            return cast(BinaryIO, self.client.get_object(Bucket=bucket, Key=key)["Body"])
        raise AssertionError("unreachable")  # pragma: no cover

    def read_range(self, bucket: str, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        with self._errors(f"reading s3://{bucket}/{key}"):
            resp: dict[str, Any] = self.client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
            )
            return cast(bytes, resp["Body"].read())
        raise AssertionError("unreachable")  # pragma: no cover

    def delete(self, bucket: str, key: str) -> None:
        with self._errors(f"deleting s3://{bucket}/{key}"):
            self.client.delete_object(Bucket=bucket, Key=key)

    def exists(self, bucket: str, key: str) -> bool:
        with self._errors(f"checking s3://{bucket}/{key}"):
            try:
                self.client.head_object(Bucket=bucket, Key=key)
                return True
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise
        raise AssertionError("unreachable")  # pragma: no cover
