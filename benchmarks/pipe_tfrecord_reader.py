"""The reader side: trainport.data's TFRecord reader over a Pipe channel, beside the same
records read from the files on disk.

For each record size (default 1 KiB and 64 KiB records, ``--size-mib`` MiB of TFRecord data
in ``--objects`` objects in the local store, page cache warm) a reader process iterates a
``ChannelDataset`` (both CRC-32C checks, one ``bytes`` per record, no DataLoader) over:

- ``files``: the object files themselves, as a File-mode channel would have them
  (``ChannelDataset.from_uri(folder)``), timed from the first ``iter()`` to the end;
- ``Pipe``: ``PipeChannel`` on a FIFO fed by trainport's channel server (a fresh server
  each round, its FIFO made before the reader starts, as in a job), timed the same way.

Rounds alternate the two after one warm-up round; medians with min-max, records/s and
MiB/s, and the per-round ratio Pipe / files. Usage::

    python benchmarks/pipe_tfrecord_reader.py [--size-mib 256] [--record-kib 1 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from trainport.data import encode_tfrecord
from trainport.host.pipe import serve_channel
from trainport.spec import ChannelSpec
from trainport.store.local import LocalStore

_READER = r"""
import sys, time
from trainport.data import ChannelDataset, PipeChannel, ReaderSlot
mode, where = sys.argv[1], sys.argv[2]
if mode == "pipe":
    dataset = ChannelDataset(PipeChannel("train", where, pipes=0), slot=ReaderSlot())
else:
    dataset = ChannelDataset.from_uri(where, slot=ReaderSlot())
print("ready", flush=True)
began = time.perf_counter()  # CLOCK_MONOTONIC, as the parent's clock
count = size = 0
for record in dataset:
    count += 1
    size += len(record)
print(count, size, began, time.perf_counter(), flush=True)
"""


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_reader(mode: str, where: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, mode, str(where)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":  # imports (torch) done, off the clock
        raise SystemExit(f"{mode} reader failed to start")
    return proc


def finish(proc: subprocess.Popen[str], expect: int) -> float:
    out, _ = proc.communicate(timeout=600)
    count, _size, began, ended = out.split()
    if int(count) != expect:
        raise SystemExit(f"reader got {count} records, expected {expect}")
    return float(ended) - float(began)


def run_files(folder: Path, expect: int) -> float:
    return finish(start_reader("file", folder), expect)


def run_pipe(store: LocalStore, spec: ChannelSpec, data_dir: Path, expect: int) -> float:
    # The FIFO exists before the reader starts, as in a job: trainport.data's reader then
    # opens it at once rather than polling for it.
    server = serve_channel(store, spec, data_dir)
    try:
        return finish(start_reader("pipe", data_dir), expect)
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--record-kib", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"{load()} at start, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = LocalStore(work / "store")
        for kib in args.record_kib:
            prefix = f"rec{kib}k"
            folder = work / "store" / "bench" / prefix
            folder.mkdir(parents=True)
            encoded = encode_tfrecord(os.urandom(kib << 10))
            per_object = max(1, (args.size_mib << 20) // args.objects // len(encoded))
            for i in range(args.objects):
                (folder / f"part-{i:05d}.tfrecord").write_bytes(encoded * per_object)
            count = per_object * args.objects
            mib = count * (kib << 10) / (1 << 20)
            spec = ChannelSpec(
                "train", "S3Prefix", f"s3://bench/{prefix}/", "FullyReplicated", "Pipe"
            )
            seconds: dict[str, list[float]] = {"files": [], "Pipe": []}
            for attempt in range(args.repeat + 1):
                took = {
                    "files": run_files(folder, count),
                    "Pipe": run_pipe(store, spec, work / f"data-{prefix}-{attempt}", count),
                }
                if attempt:
                    for name, value in took.items():
                        seconds[name].append(value)
            print(
                f"\n{count} records of {kib} KiB ({mib:.0f} MiB of payload) in {args.objects} "
                f"objects, median of {args.repeat} rounds"
            )
            head = ("reader", "records/s", "(min-max)", "MiB/s", "Pipe/files", "(min-max)")
            print(f"{head[0]:<8}{head[1]:>12}{head[2]:>22}{head[3]:>9}{head[4]:>12}{head[5]:>14}")
            ratios = [f / p for f, p in zip(seconds["files"], seconds["Pipe"], strict=True)]
            for name, values in seconds.items():
                rates = [count / s for s in values]
                ratio = f"{statistics.median(ratios):.2f}x" if name == "Pipe" else ""
                spread = f"({min(ratios):.2f}-{max(ratios):.2f})" if name == "Pipe" else ""
                print(
                    f"{name:<8}{statistics.median(rates):>12.0f}"
                    f"{f'({min(rates):.0f}-{max(rates):.0f})':>22}"
                    f"{mib / statistics.median(values):>9.0f}{ratio:>12}{spread:>14}"
                )
    print(f"{load()} at end")


if __name__ == "__main__":
    main()
