"""Object stores: where channels come from and artifacts and checkpoints go.

:mod:`trainport.store.api` holds the contract (:class:`ObjectStore`, :class:`S3Uri`,
:class:`ObjectInfo`); :mod:`~trainport.store.local` is the embedded default (a directory
under ``TRAINPORT_HOME``) and :mod:`~trainport.store.s3` any S3-compatible endpoint.
:mod:`~trainport.store.transfer` moves many objects in parallel with a progress display.
"""

from __future__ import annotations

from trainport.store.api import ObjectInfo, ObjectStore, S3Uri, open_store

__all__ = ["ObjectInfo", "ObjectStore", "S3Uri", "open_store"]
