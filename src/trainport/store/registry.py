"""The stores by kind: the one place that knows every implementation of
:class:`~trainport.store.api.ObjectStore`, so the contract imports none of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainport.store.api import ObjectStore

if TYPE_CHECKING:
    from trainport.config import Settings

__all__ = ["open_store"]


def open_store(settings: Settings) -> ObjectStore:
    """The store the settings select: the embedded local store or an S3-compatible endpoint."""
    if settings.store_kind == "s3":
        from trainport.store.s3 import S3Store

        return S3Store(
            endpoint_url=settings.s3_endpoint_url,
            region=settings.region,
            max_connections=settings.download_workers + 4,
        )
    from trainport.store.local import LocalStore

    return LocalStore(settings.store_root)
