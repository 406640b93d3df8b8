"""trainport.data: read training data the way SageMaker delivers it, from PyTorch code.

Imports nothing else of trainport, so training scripts can use it inside real SageMaker too.

- Record formats: :func:`encode_tfrecord`, :class:`TFRecordWriter`,
  :func:`iter_tfrecords`; :func:`encode_recordio`, :class:`RecordIOWriter`,
  :func:`iter_recordio` (multi-part records split and rejoined); CRC-32C in C (:func:`crc32c`).
- Channels: :class:`PipeChannel` (FIFOs ``<channel>_<epoch>``, optionally per-worker
  ``<channel>_w<k>_<epoch>``), :class:`FileChannel` (a directory), :class:`S3Channel`.
- :class:`ChannelDataset`: a PyTorch ``IterableDataset`` over any channel, each record to
  exactly one (rank, DataLoader worker) per epoch, with ``state_dict`` resume.
- :class:`WeightedMixer`: weighted mixing with weights changeable during training.
- :class:`ThroughputMeter`: records/s, MB/s and time stalled on input.
"""

from __future__ import annotations

from trainport.data.channel import ChannelObject, FileChannel, ListedChannel, PipeChannel
from trainport.data.crc import crc32c, masked_crc32c
from trainport.data.dataset import ChannelDataset
from trainport.data.errors import ChannelWaitTimeout, CorruptRecordError, DataError
from trainport.data.framing import ByteStream, CorruptionPolicy
from trainport.data.meter import Throughput, ThroughputMeter
from trainport.data.mixing import OnExhausted, WeightedMixer
from trainport.data.recordio import RecordIOWriter, encode_recordio, iter_recordio
from trainport.data.s3 import S3Channel
from trainport.data.sharding import ShardBy
from trainport.data.tfrecord import TFRecordWriter, encode_tfrecord, iter_tfrecords
from trainport.data.topology import ReaderSlot

__all__ = [
    "ByteStream",
    "ChannelDataset",
    "ChannelObject",
    "ChannelWaitTimeout",
    "CorruptRecordError",
    "CorruptionPolicy",
    "DataError",
    "FileChannel",
    "ListedChannel",
    "OnExhausted",
    "PipeChannel",
    "ReaderSlot",
    "RecordIOWriter",
    "S3Channel",
    "ShardBy",
    "TFRecordWriter",
    "Throughput",
    "ThroughputMeter",
    "WeightedMixer",
    "crc32c",
    "encode_recordio",
    "encode_tfrecord",
    "iter_recordio",
    "iter_tfrecords",
    "masked_crc32c",
]
