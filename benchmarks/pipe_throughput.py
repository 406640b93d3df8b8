"""Pipe-mode throughput from the local store, beside the raw limit measured in the same run.

Three ways to move the same channel (default 1 GiB in 64 objects) through a FIFO to the
same reader process (which sets a 1 MiB pipe buffer, reads 1 MiB at a time and counts
bytes):

- ``read files``  : ``cat`` of the objects into /dev/null (the storage/page-cache limit);
- ``dd -> FIFO``  : the same bytes (one file) written into a FIFO by ``dd bs=1M`` (the raw
  FIFO limit: no store, no fetching);
- ``Pipe mode``   : trainport's channel server (store -> read-ahead -> FIFO), one epoch.

Each is run ``--repeat`` times after one warm-up (the objects sit in the page cache, as a
re-read dataset would); the best run counts. Usage::

    python benchmarks/pipe_throughput.py [--size-mib 1024] [--objects 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainport.host.pipe import PipeOptions, serve_channel
from trainport.spec import ChannelSpec
from trainport.store.local import LocalStore

_READER = r"""
import fcntl, os, sys, time
path = sys.argv[1]
while not os.path.exists(path):
    time.sleep(0.001)
fd = os.open(path, os.O_RDONLY)
try:  # a 1 MiB pipe buffer, as trainport.data's reader asks for, for every writer alike
    fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
except OSError:
    pass
began = time.perf_counter()
total = 0
while True:
    n = len(os.read(fd, 1 << 20))
    if not n:
        break
    total += n
print(total, time.perf_counter() - began)
"""


def reader(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], expect: int) -> float:
    out, _ = proc.communicate(timeout=600)
    total, seconds = out.split()
    if int(total) != expect:
        raise SystemExit(f"reader got {total} bytes, expected {expect}")
    return float(seconds)


def run_cat(files: list[Path]) -> float:
    began = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def run_dd(whole: Path, work: Path, size: int) -> float:
    """``dd bs=1M`` of the same bytes (one file holding the objects back to back) into a
    FIFO: the raw limit of a FIFO on this machine, without any store or fetching."""
    fifo = work / "dd.fifo"
    os.mkfifo(fifo)
    proc = reader(fifo)
    subprocess.run(["dd", f"if={whole}", f"of={fifo}", "bs=1M", "status=none"], check=True)
    seconds = finish(proc, size)
    fifo.unlink()
    return seconds


def run_pipe(work: Path, size: int, epoch: int) -> float:
    proc = reader(work / "data" / f"train_{epoch}")
    return finish(proc, size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to put the store (default: tmp)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        store = LocalStore(work / "store")
        per_object = (args.size_mib << 20) // args.objects
        files = []
        block = os.urandom(1 << 20)
        for i in range(args.objects):
            path = work / "store" / "bench" / "train" / f"part-{i:05d}"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                for _ in range(per_object >> 20):
                    f.write(block)
                f.write(block[: per_object & ((1 << 20) - 1)])
            files.append(path)
        size = per_object * args.objects
        whole = work / "whole"
        with open(whole, "wb") as out:
            for path in files:
                out.write(path.read_bytes())
        channel = ChannelSpec("train", "S3Prefix", "s3://bench/train/", "FullyReplicated", "Pipe")
        server = serve_channel(store, channel, work / "data", opts=PipeOptions())
        results: dict[str, list[float]] = {"read files": [], "dd -> FIFO": [], "Pipe mode": []}
        epoch = 0
        try:
            for attempt in range(args.repeat + 1):  # the first round warms the page cache
                timings = {
                    "read files": run_cat(files),
                    "dd -> FIFO": run_dd(whole, work, size),
                    "Pipe mode": run_pipe(work, size, epoch),
                }
                epoch += 1
                if attempt:
                    for name, seconds in timings.items():
                        results[name].append(seconds)
        finally:
            server.close()

    mib = size / (1 << 20)
    best = {name: mib / min(times) for name, times in results.items()}
    print(f"channel: {mib:.0f} MiB in {args.objects} objects, local store, best of {args.repeat}")
    print(f"{'path':<14}{'MiB/s':>10}{'vs dd->FIFO':>14}")
    for name, rate in best.items():
        print(f"{name:<14}{rate:>10.0f}{rate / best['dd -> FIFO']:>13.2f}x")


if __name__ == "__main__":
    main()
