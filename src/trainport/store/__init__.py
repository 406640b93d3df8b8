"""Object stores: where channels come from and artifacts and checkpoints go.

:mod:`trainport.store.api` holds the contract (:class:`ObjectStore`, :class:`S3Uri`,
:class:`ObjectInfo`) and :mod:`~trainport.store.registry` opens the store the settings name:
:mod:`~trainport.store.local`, the embedded default (a directory under ``TRAINPORT_HOME``), or
:mod:`~trainport.store.s3`, any S3-compatible endpoint.
:mod:`~trainport.store.transfer` moves many objects in parallel with a progress display.
"""

from __future__ import annotations

from trainport.store.api import ObjectInfo, ObjectStore, S3Uri
from trainport.store.registry import open_store

__all__ = ["ObjectInfo", "ObjectStore", "S3Uri", "open_store"]
