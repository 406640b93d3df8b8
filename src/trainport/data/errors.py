"""Errors raised by :mod:`trainport.data`.

``trainport.data`` runs inside training code, possibly in real SageMaker where the rest of
trainport is absent, so it keeps its own small tree instead of importing
``trainport.errors``::

    DataError                 anything this package raises on purpose
    ├── CorruptRecordError    a record failed its checksum or framing (names source and offset)
    └── ChannelWaitTimeout    a Pipe FIFO did not appear within the configured wait

Foreign errors (OSError, botocore errors) are translated at the boundary with
``raise ... from exc`` so the message can name the channel, file or object involved.
"""

from __future__ import annotations

__all__ = ["ChannelWaitTimeout", "CorruptRecordError", "DataError"]


class DataError(Exception):
    """Root of every error trainport.data raises on purpose."""


class CorruptRecordError(DataError):
    """A record whose framing or checksum is wrong.

    ``source`` is the file, object or channel FIFO being read and ``offset`` the byte offset
    (from the start of that source) where the bad record begins.
    """

    def __init__(self, fmt: str, source: str, offset: int, reason: str) -> None:
        self.format = fmt
        self.source = source
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"corrupt {fmt} record in {source} at byte offset {offset}: {reason}; "
            "set max_corrupt to skip a bounded number of bad records"
        )


class ChannelWaitTimeout(DataError):
    """The next epoch's FIFO of a Pipe channel did not appear in time."""
