"""``ChannelDataset``: a PyTorch ``IterableDataset`` of the records of one channel.

The same object reads a Pipe channel (FIFOs, one per epoch), a File or FastFile channel (a
directory) or an ``s3://`` prefix, yields the same records in the same order for the same
data, and gives each record of an epoch to exactly one (rank, DataLoader worker) reader
(see :mod:`trainport.data.sharding` for the rules and why Pipe channels need per-worker
pipes to read in parallel).

Epochs. Each ``iter()`` reads one epoch: the dataset's current epoch from its current
position. When the iteration ends, or is abandoned early (the generator is closed, which
on a Pipe closes the FIFO so the producer ends that epoch cleanly), the dataset moves on to
the next epoch. DataLoader workers iterate *copies* of the dataset: with
``persistent_workers=True`` their copies advance by themselves; otherwise call
:meth:`ChannelDataset.set_epoch` before each epoch, as with ``DistributedSampler``.

Checkpoints. :meth:`~ChannelDataset.state_dict` describes the position after the last
record handed out; :meth:`~ChannelDataset.load_state_dict` makes the next ``iter()`` resume
there, so a restarted job sees the identical next records:

- listed channels (files, S3) store (epoch, object index, byte offset) and resume by seeking
  (an S3 range request), not by re-reading;
- Pipe channels cannot seek: a restarted job's FIFOs start again at ``<channel>_0`` with the
  producer replaying the epoch, so the dataset discards as many records as were consumed.
  The FIFO index is process-local and therefore not part of the state.

The state is per reader. With DataLoader workers, use a loader that checkpoints each
worker's dataset (``torchdata.stateful_dataloader.StatefulDataLoader`` calls these methods
in every worker, and a fresh loader restored from its state sees every record of the epoch
exactly once, for listed and per-worker Pipe channels alike), or ``num_workers=0``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainport.data.channel import (
    FileChannel,
    ListedChannel,
    ObjectStream,
    PipeChannel,
)
from trainport.data.errors import DataError
from trainport.data.formats import iter_objects, parser_for
from trainport.data.framing import ByteStream, CorruptionPolicy
from trainport.data.meter import ThroughputMeter
from trainport.data.s3 import S3Channel
from trainport.data.sharding import (
    ShardBy,
    epoch_order,
    keeps_record,
    objects_for_reader,
    pipe_series_for,
    resolve_shard_by,
)
from trainport.data.topology import ReaderSlot, current_slot

if TYPE_CHECKING:
    from torch.utils.data import IterableDataset as _DatasetBase
else:
    try:
        from torch.utils.data import IterableDataset as _DatasetBase
    except ImportError:  # the readers and writers work without torch
        _DatasetBase = object

__all__ = ["ChannelDataset"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1


class ChannelDataset(_DatasetBase):
    """The records of one channel, sharded over (rank, DataLoader worker) readers.

    ``source`` is a :class:`PipeChannel` or a listed channel (:class:`FileChannel`,
    :class:`S3Channel`); the constructors :meth:`from_channel` and :meth:`from_uri` build it
    from a SageMaker channel name or a path/URI. ``record_format`` is ``tfrecord``,
    ``recordio`` or ``object`` (each file/object one record; not for Pipe channels).
    ``shard_by`` and ``shuffle_seed`` apply to listed channels only: a Pipe channel's order
    and host-level sharding are the producer's. ``max_corrupt`` corrupt records are logged
    and skipped before one raises :class:`~trainport.data.errors.CorruptRecordError`.
    ``transform`` maps each record's bytes before it is yielded (in the worker process).
    ``slot`` pins the reader's place instead of reading it from torch and the environment.
    """

    def __init__(
        self,
        source: PipeChannel | ListedChannel,
        *,
        record_format: str = "tfrecord",
        shard_by: ShardBy | str = ShardBy.AUTO,
        shuffle_seed: int | None = None,
        max_corrupt: int = 0,
        transform: Callable[[bytes], Any] | None = None,
        meter: ThroughputMeter | None = None,
        slot: ReaderSlot | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.record_format = record_format.lower()
        self._parser = parser_for(self.record_format)
        if isinstance(source, PipeChannel) and self._parser is iter_objects:
            raise DataError(
                f"record_format 'object' cannot split {source.describe()}: a FIFO carries the "
                "concatenation of the objects; use tfrecord or recordio framing"
            )
        self.shard_by = ShardBy(shard_by)
        self.shuffle_seed = shuffle_seed
        self.transform = transform
        self.meter = meter
        self.slot = slot
        self._policy = CorruptionPolicy(max_corrupt)
        self._objects: list[Any] | None = None
        self._epoch = 0
        self._reset_position()
        self._fifo_epoch = 0  # process-local: a restarted job's FIFOs begin at 0 again
        self._told_idle = False

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def from_uri(cls, uri: str | os.PathLike[str], **options: Any) -> ChannelDataset:
        """A dataset over an ``s3://`` prefix, or a local directory or file."""
        text = os.fspath(uri)
        source: ListedChannel = S3Channel(text) if text.startswith("s3://") else FileChannel(text)
        return cls(source, **options)

    @classmethod
    def from_channel(
        cls,
        channel: str,
        *,
        input_dir: str | os.PathLike[str] | None = None,
        record_format: str | None = None,
        pipe_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> ChannelDataset:
        """The dataset of a SageMaker input channel, in whatever mode the job gave it.

        The mode and record wrapping come from ``<input_dir>/config/inputdataconfig.json``;
        ``input_dir`` defaults to ``SM_INPUT_DIR`` or ``/opt/ml/input``. Without that file,
        a directory ``data/<channel>`` means File mode and a FIFO ``data/<channel>_0``
        Pipe mode. ``record_format`` defaults to ``recordio`` for a channel with
        ``RecordWrapperType: RecordIO`` and to ``tfrecord`` otherwise.
        """
        base = Path(input_dir or os.environ.get("SM_INPUT_DIR") or "/opt/ml/input")
        data_dir = base / "data"
        config: dict[str, Any] = {}
        config_path = base / "config" / "inputdataconfig.json"
        if config_path.exists():
            try:
                config = json.loads(config_path.read_text()).get(channel, {})
            except (OSError, ValueError) as exc:
                raise DataError(f"cannot read {config_path}: {exc}") from exc
        mode = config.get("TrainingInputMode")
        if mode is None:
            mode = "File" if (data_dir / channel).is_dir() else "Pipe"
        if record_format is None:
            wrapped = config.get("RecordWrapperType", "None") == "RecordIO"
            record_format = "recordio" if wrapped else "tfrecord"
        source: PipeChannel | ListedChannel
        if mode == "Pipe":
            source = PipeChannel(channel, data_dir, **(pipe_options or {}))
        else:
            source = FileChannel(data_dir / channel)
        return cls(source, record_format=record_format, **options)

    # -- epochs and state -----------------------------------------------------------------

    def _reset_position(self) -> None:
        self._yielded = 0  # records handed out this epoch by this reader
        self._object = 0  # listed: index into this reader's objects of the epoch
        self._offset = 0  # listed: byte offset in that object after the last record read
        self._seen = 0  # listed, record sharding: records read this epoch (kept or not)
        self._discard = 0  # pipe: records to drop after a restore

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` reads."""
        return self._epoch

    @property
    def corrupt_skipped(self) -> int:
        """How many corrupt records this process has skipped so far."""
        return self._policy.skipped

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` read ``epoch`` from its beginning."""
        if epoch < 0:
            raise DataError(f"epoch must be >= 0, got {epoch}")
        self._epoch = epoch
        self._reset_position()

    def state_dict(self) -> dict[str, Any]:
        """The position after the last record this reader handed out (JSON-serialisable)."""
        slot = self._slot()
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "records": self._yielded,
            "object": self._object,
            "offset": self._offset,
            "seen": self._seen,
            "shard": [slot.shard, slot.num_shards],
            "corrupt_skipped": self._policy.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s output: the next ``iter()`` continues there."""
        if state.get("version") != _STATE_VERSION:
            raise DataError(f"unsupported ChannelDataset state version {state.get('version')!r}")
        slot = self._slot()
        if isinstance(self.source, ListedChannel) and list(state["shard"]) != [
            slot.shard,
            slot.num_shards,
        ]:
            raise DataError(
                f"checkpoint was taken by reader {state['shard'][0]} of {state['shard'][1]}, "
                f"this is reader {slot.shard} of {slot.num_shards}: resuming mid-epoch needs "
                "the same number of ranks and DataLoader workers"
            )
        self._epoch = int(state["epoch"])
        self._reset_position()
        self._yielded = int(state["records"])
        self._policy.skipped = int(state.get("corrupt_skipped", 0))
        if isinstance(self.source, PipeChannel):
            self._discard = self._yielded
        else:
            self._object = int(state["object"])
            self._offset = int(state["offset"])
            self._seen = int(state["seen"])

    # -- iteration ------------------------------------------------------------------------

    def _slot(self) -> ReaderSlot:
        return self.slot if self.slot is not None else current_slot()

    def __iter__(self) -> Generator[Any, None, None]:
        slot = self._slot()
        if isinstance(self.source, PipeChannel):
            return self._iter_pipe(self.source, slot)
        return self._iter_listed(self.source, slot)

    def _emit(self, record: bytes, stream: ByteStream) -> Any:
        self._yielded += 1
        if self.meter is not None:
            self.meter.add(1, len(record), stream.waited)
            stream.waited = 0.0
        return self.transform(record) if self.transform is not None else record

    def _finish_epoch(self, completed: bool) -> None:
        logger.debug(
            "epoch %d of %s %s after %d records",
            self._epoch,
            self.source.describe(),
            "done" if completed else "closed early",
            self._yielded,
        )
        self._epoch += 1
        self._reset_position()

    def _iter_listed(self, source: ListedChannel, slot: ReaderSlot) -> Generator[Any, None, None]:
        if self._objects is None:
            self._objects = source.list_objects()
            if not self._objects:
                raise DataError(f"no objects found in {source.describe()}")
        objects = self._objects
        policy = resolve_shard_by(self.shard_by, len(objects), slot.num_shards)
        order = epoch_order(len(objects), self._epoch, self.shuffle_seed)
        if policy is ShardBy.OBJECT:
            order = objects_for_reader(order, slot.shard, slot.num_shards)
        completed = False
        try:
            while self._object < len(order):
                obj = objects[order[self._object]]
                raw = source.open_object(obj, self._offset)
                stream = ByteStream(raw, source=source.describe(obj), start=self._offset)
                try:
                    for record in self._parser(stream, self._policy):
                        self._offset = stream.offset
                        if policy is ShardBy.RECORD:
                            index = self._seen
                            self._seen += 1
                            if not keeps_record(index, slot.shard, slot.num_shards):
                                continue
                        yield self._emit(record, stream)
                finally:
                    _close(raw)
                    if self.meter is not None and stream.waited:
                        self.meter.add_stall(stream.waited)
                self._object += 1
                self._offset = 0
            completed = True
        finally:
            self._finish_epoch(completed)

    def _iter_pipe(self, source: PipeChannel, slot: ReaderSlot) -> Generator[Any, None, None]:
        fifo_epoch = self._fifo_epoch
        series = pipe_series_for(slot, source.num_series(fifo_epoch))
        if not series and not self._told_idle:
            self._told_idle = True
            logger.info(
                "%s: reader (local rank %d, worker %d) has no FIFO to read; only one process "
                "can read a FIFO, so give the job per-worker pipes to read in parallel",
                source.describe(),
                slot.local_rank,
                slot.worker,
            )
        completed = False
        pending = list(series)
        try:
            while pending:
                path = source.fifo_path(fifo_epoch, pending[0])
                if self.meter is not None:
                    began = time.perf_counter()
                    raw = source.open_fifo(path)
                    self.meter.add_stall(time.perf_counter() - began)
                else:
                    raw = source.open_fifo(path)
                pending.pop(0)
                stream = ByteStream(raw, source=str(path))
                try:
                    for record in self._parser(stream, self._policy):
                        if self._discard:
                            self._discard -= 1
                            continue
                        yield self._emit(record, stream)
                finally:
                    _close(raw)
                    if self.meter is not None and stream.waited:
                        self.meter.add_stall(stream.waited)
            completed = True
        finally:
            # A producer makes epoch k+1 of a series only once epoch k was opened and closed,
            # so series this reader never reached (closed early) are opened and closed now.
            for rest in pending:
                path = source.fifo_path(fifo_epoch, rest)
                _close(source.open_fifo(path))
            self._fifo_epoch = fifo_epoch + 1
            self._finish_epoch(completed)


def _close(raw: ObjectStream) -> None:
    try:
        raw.close()
    except OSError as exc:  # a FIFO whose writer vanished; nothing left to read anyway
        logger.debug("closing input stream failed: %s", exc)
