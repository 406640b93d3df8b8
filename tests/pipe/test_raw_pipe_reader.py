"""A Pipe-mode reader that parses the raw FIFO itself, as users write them, reads trainport's
FIFOs.

The reader streams TFRecord files over a Pipe channel and parses the FIFO
``/opt/ml/input/data/<channel>_<epoch>`` with no library: ``open(path, "rb", buffering=0)``,
then ``struct.unpack("Q", read(8))`` for the length, 4 bytes of length CRC,
``read(length)``, 4 bytes of data CRC, until a read comes back empty. The two steps such
readers often leave out (checking the CRCs, and making sure ``length`` bytes really arrived)
are done here the way a careful user would do them, with no trainport import: a
table-driven CRC-32C and a loop over short reads (a FIFO returns at most what the writer has
put in so far). The objects are written with trainport.data's TFRecord writer;
every record of every epoch must arrive intact and in key order.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from tests.conftest import put, python_job, require, wait_for
from trainport.data import TFRecordWriter
from trainport.jobs.service import JobService
from trainport.runners.sandbox import sandbox_problem

# The user's training script. argv: channel name, number of epochs. Prints one line per
# epoch: the record count and a sha256 over (length, record) pairs in arrival order.
_RAW_PIPE_READER = r"""
import hashlib, os, struct, sys, time

data_dir = os.path.join(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"), "input", "data")

def _table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table

TABLE = _table()

def masked_crc(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def read_exact(fifo, n):
    # buffering=0: one read() is one read(2), which a FIFO may answer short
    parts, have = [], 0
    while have < n:
        part = fifo.read(n - have)
        if not part:
            break
        parts.append(part)
        have += len(part)
    return b"".join(parts)

def get_pipe_generator(channel_name, num_epochs=1):
    def generator():
        for epoch in range(num_epochs):
            fifo_path = "{0}/{1}_{2}".format(data_dir, channel_name, epoch)
            while not os.path.exists(fifo_path):
                time.sleep(0.005)
            with open(fifo_path, "rb", buffering=0) as fifo:
                while True:
                    header = read_exact(fifo, 8)
                    if not header:
                        break
                    recordLen = struct.unpack("Q", header)[0]
                    crcCheck = struct.unpack("I", read_exact(fifo, 4))[0]
                    if masked_crc(header) != crcCheck:
                        raise SystemExit(f"epoch {epoch}: bad length crc")
                    rec = read_exact(fifo, recordLen)
                    if len(rec) != recordLen:
                        raise SystemExit(f"epoch {epoch}: short record")
                    crcCheck = struct.unpack("I", read_exact(fifo, 4))[0]
                    if masked_crc(rec) != crcCheck:
                        raise SystemExit(f"epoch {epoch}: bad data crc")
                    yield epoch, rec
    return generator

channel, epochs = sys.argv[1], int(sys.argv[2])
digests = [hashlib.sha256() for _ in range(epochs)]
counts = [0] * epochs
for epoch, rec in get_pipe_generator(channel, epochs)():
    digests[epoch].update(struct.pack("<Q", len(rec)) + rec)
    counts[epoch] += 1
for epoch in range(epochs):
    print("EPOCH", epoch, counts[epoch], digests[epoch].hexdigest())
"""


def _objects(seed: int) -> dict[str, list[bytes]]:
    """Four TFRecord objects; records of mixed sizes, from empty to larger than a pipe buffer
    (64 KiB by default), so headers and data straddle the writer's chunks."""
    rng = random.Random(seed)
    sizes = [1, 7, 100, 1000, 4096, 65_535, 65_536, 150_001]
    objects = {}
    for i in range(4):
        records = [b""]  # an empty record: a header and two CRCs, no data
        for j in range(1, 20):
            size = sizes[j - 1] if j <= len(sizes) else rng.randrange(0, 5_000)
            records.append(f"obj{i}-rec{j}:".encode() + rng.randbytes(size))
        objects[f"tfr/part-{i:03d}.tfrecord"] = records
    return objects


def _encode(records: list[bytes], path: Path) -> bytes:
    with open(path, "wb") as f:
        writer = TFRecordWriter(f)
        for record in records:
            writer.write(record)
    return path.read_bytes()


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_a_raw_pipe_reader_reads_every_record(
    home: Path, service: JobService, tmp_path: Path, runner: str
) -> None:
    if runner == "sandbox":
        require(sandbox_problem() is None, f"sandbox unavailable: {sandbox_problem()}")
    objects = _objects(seed=3)
    for key, records in objects.items():
        put(home, "data", key, _encode(records, tmp_path / "object.tfrecord"))
    # No ShuffleConfig: every epoch delivers the objects in key order, each whole.
    expected = hashlib.sha256()
    count = 0
    for key in sorted(objects):
        for record in objects[key]:
            expected.update(len(record).to_bytes(8, "little") + record)
            count += 1
    epochs = 3
    name = f"raw-pipe-{runner}"
    job = python_job(
        name,
        _RAW_PIPE_READER,
        InputDataConfig=[
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/tfr/"}
                },
                "InputMode": "Pipe",
            }
        ],
        Tags=[{"Key": "trainport:runner", "Value": runner}],
    )
    job["AlgorithmSpecification"]["ContainerEntrypoint"] += ["train", str(epochs)]
    service.create(job)
    record = wait_for(service, name)
    log = (home / "jobs" / name / "logs" / "algo-1.log").read_text()
    assert record.status == "Completed", (record.failure_reason, log)
    for epoch in range(epochs):
        assert f"EPOCH {epoch} {count} {expected.hexdigest()}" in log, log
