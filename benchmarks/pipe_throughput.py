"""Pipe-mode throughput from the local store, beside the pipe's own limit in the same run.

Every row moves the same bytes through a FIFO to the same reader process, which sets a
1 MiB pipe buffer, reads 1 MiB at a time and counts bytes. Rows of the plain section
(default 512 MiB in 64 objects of 8 MiB):

- ``splice -> FIFO`` : the limit. A separate process moves the object files into the FIFO
  with ``os.splice`` (no copy through user memory), 1 MiB pipe buffer. Every ratio is to
  this row, taken in the same round;
- ``dd -> FIFO``     : ``dd bs=1M`` of the same bytes (two copies through user memory);
- ``read files``     : ``cat`` of the objects into /dev/null (the page-cache read rate);
- ``Pipe mode``      : trainport's channel server, one epoch (files spliced in the kernel);
- ``Pipe, no splice``: the same with ``PipeOptions(splice=False)``: store reads into
  memory, read-ahead threads, ``write()`` (the design before splicing, and still the path
  for S3, Gzip and RecordIO).

``--codecs`` runs a section on compressible text instead (default 256 MiB decompressed, in
64 objects): the plain channel, the same objects gzipped as a ``Gzip`` channel, ``zcat`` of
those ``.gz`` files into a FIFO, and the plain objects as a ``RecordIO`` channel (each
object one record). Ratios there are to ``zcat``.

Clocks: a baseline row is timed by the reader, from its open() returning to EOF. A Pipe row
starts a fresh channel server for each round with the reader already waiting, and is timed
from the server's start (mkfifo, thread, fetching ahead) to the reader's EOF (the same
CLOCK_MONOTONIC): the server fetches ahead while its FIFO waits for the reader, and that
work must count. Listing the channel (once per job) is not timed.

Rounds are interleaved (each runs every row once) after one unmeasured warm-up round that
puts the objects in the page cache. The table gives median MiB/s with min-max over rounds,
and each row's ratio to the baseline as the median (min-max) of per-round ratios. The load
average is printed before and after. Usage::

    python benchmarks/pipe_throughput.py [--size-mib 512] [--objects 64] [--repeat 7]
    python benchmarks/pipe_throughput.py --codecs [--codec-size-mib 256]
"""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainport.host.pipe import PipeChannelServer, PipeOptions, resolve_items
from trainport.spec import ChannelSpec
from trainport.store.api import ObjectStore
from trainport.store.local import LocalStore

_READER = r"""
import fcntl, os, sys, time
path = sys.argv[1]
while not os.path.exists(path):
    time.sleep(0.00005)
fd = os.open(path, os.O_RDONLY)
try:  # a 1 MiB pipe buffer, as trainport.data's reader asks for, for every writer alike
    fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
except OSError:
    pass
began = time.perf_counter()  # CLOCK_MONOTONIC: the parent's clock too
total = 0
while True:
    n = len(os.read(fd, 1 << 20))
    if not n:
        break
    total += n
print(total, began, time.perf_counter())
"""

# The limit's writer: the object files spliced into the FIFO, nothing else.
_SPLICER = r"""
import fcntl, os, sys
fifo = os.open(sys.argv[1], os.O_WRONLY)
fcntl.fcntl(fifo, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
for name in sys.argv[2:]:
    src = os.open(name, os.O_RDONLY)
    while os.splice(src, fifo, 16 << 20):
        pass
    os.close(src)
"""

Row = Callable[[int], float]  # round number -> seconds


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class Fifos:
    """Fresh FIFO paths in a work folder, and the reader process that times one."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.count = 0

    def new(self) -> Path:
        self.count += 1
        path = self.work / f"bench-{self.count}.fifo"
        os.mkfifo(path)
        return path

    @staticmethod
    def reader(path: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, text=True
        )

    @staticmethod
    def finish(
        proc: subprocess.Popen[str], expect: int | None, since: float | None = None
    ) -> float:
        """Seconds from the reader's open() returning (or from ``since``, a
        ``time.perf_counter()`` of this process: the same clock) to its EOF."""
        out, _ = proc.communicate(timeout=600)
        total, opened, ended = out.split()
        if expect is not None and int(total) != expect:
            raise SystemExit(f"reader got {total} bytes, expected {expect}")
        return float(ended) - (float(opened) if since is None else since)

    def feed(self, writer: list[str], expect: int) -> float:
        """Time the reader on a fresh FIFO that the command ``writer`` fills (``{fifo}`` in
        its arguments is replaced by the FIFO's path)."""
        fifo = self.new()
        proc = self.reader(fifo)
        subprocess.run([a.replace("{fifo}", str(fifo)) for a in writer], check=True)
        seconds = self.finish(proc, expect)
        fifo.unlink()
        return seconds


class PipeRow:
    """A channel served by trainport: each call serves one epoch from a fresh server, timed
    from its start (mkfifo, fetching ahead, the FIFO's open) to the reader's EOF. Listing
    the channel, which a job does once, is done beforehand and not timed."""

    def __init__(
        self,
        store: ObjectStore,
        spec: ChannelSpec,
        opts: PipeOptions,
        fifos: Fifos,
        expect: int | None,
    ) -> None:
        self.store, self.spec, self.opts = store, spec, opts
        self.fifos, self.expect = fifos, expect
        self.items = resolve_items(store, spec)

    def __call__(self, round_: int) -> float:
        data_dir = self.fifos.work / f"data-{self.spec.name}-{round_}"
        proc = self.fifos.reader(data_dir / f"{self.spec.name}_0")
        time.sleep(0.2)  # the reader process is up and polling for the FIFO
        server = PipeChannelServer(self.store, self.spec, self.items, data_dir, opts=self.opts)
        began = time.perf_counter()
        server.start()
        try:
            return self.fifos.finish(proc, self.expect, since=began)
        finally:
            server.close()


def pipe_row(
    store: ObjectStore,
    fifos: Fifos,
    name: str,
    uri: str,
    expect: int | None,
    opts: PipeOptions | None = None,
    **channel: str,
) -> PipeRow:
    spec = ChannelSpec(name, "S3Prefix", uri, "FullyReplicated", "Pipe", **channel)
    return PipeRow(store, spec, opts or PipeOptions(), fifos, expect)


def measure(rows: dict[str, tuple[Row, int]], repeat: int, baseline: str) -> None:
    """Run every row once per round (after a warm-up round) and print the table."""
    seconds: dict[str, list[float]] = {name: [] for name in rows}
    for attempt in range(repeat + 1):
        for name, (row, _nbytes) in rows.items():
            took = row(attempt)
            if attempt:
                seconds[name].append(took)
    rates = {
        name: [nbytes / (1 << 20) / s for s in seconds[name]] for name, (_, nbytes) in rows.items()
    }
    print(f"{'path':<22}{'MiB/s median':>14}{'(min-max)':>16}{'vs baseline':>14}{'(min-max)':>17}")
    for name, values in rates.items():
        ratios = [v / b for v, b in zip(values, rates[baseline], strict=True)]
        print(
            f"{name:<22}{statistics.median(values):>14.0f}"
            f"{f'({min(values):.0f}-{max(values):.0f})':>16}"
            f"{statistics.median(ratios):>13.2f}x"
            f"{f'({min(ratios):.2f}-{max(ratios):.2f})':>17}"
        )


def write_objects(
    folder: Path, count: int, per_object: int, block: Callable[[int], bytes]
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(count):
        path = folder / f"part-{i:05d}"
        with open(path, "wb") as f:
            left, n = per_object, 0
            while left:
                data = block(n)[:left]
                f.write(data)
                left -= len(data)
                n += 1
        files.append(path)
    return files


def text_blocks(seed: int = 7) -> Callable[[int], bytes]:
    """1 MiB blocks of random words from a small vocabulary: gzip packs them about 2x."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(5000)]
    blocks = []
    for _ in range(16):
        text = " ".join(rng.choices(words, k=200_000)).encode()
        blocks.append((text * 2)[: 1 << 20])
    return lambda n: blocks[n % len(blocks)]


def _cat(names: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(["cat", *names], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def plain_section(work: Path, store: LocalStore, fifos: Fifos, args: argparse.Namespace) -> None:
    per_object = (args.size_mib << 20) // args.objects
    seed = os.urandom(1 << 20)
    folder = work / "store" / "bench" / "train"
    files = write_objects(folder, args.objects, per_object, lambda n: seed[n:] + seed[:n])
    size = per_object * args.objects
    whole = work / "whole"
    with open(whole, "wb") as out:
        for path in files:
            out.write(path.read_bytes())
    names = [str(f) for f in files]
    uri = "s3://bench/train/"
    splicer = [sys.executable, "-c", _SPLICER, "{fifo}", *names]
    dd = ["dd", f"if={whole}", "of={fifo}", "bs=1M", "status=none"]
    rows: dict[str, tuple[Row, int]] = {
        "splice -> FIFO": (lambda _: fifos.feed(splicer, size), size),
        "dd -> FIFO": (lambda _: fifos.feed(dd, size), size),
        "read files (cat)": (lambda _: _cat(names), size),
        "Pipe mode": (pipe_row(store, fifos, "train", uri, size), size),
        "Pipe, no splice": (
            pipe_row(store, fifos, "copied", uri, size, PipeOptions(splice=False)),
            size,
        ),
    }
    print(
        f"\nplain channel: {size >> 20} MiB in {args.objects} objects, local store, page cache "
        f"warm, median of {args.repeat} rounds; baseline: splice -> FIFO"
    )
    measure(rows, args.repeat, "splice -> FIFO")


def codec_section(work: Path, store: LocalStore, fifos: Fifos, args: argparse.Namespace) -> None:
    per_object = (args.codec_size_mib << 20) // args.objects
    folder = work / "store" / "bench" / "text"
    files = write_objects(folder, args.objects, per_object, text_blocks())
    size = per_object * args.objects
    gz_dir = work / "store" / "bench" / "textgz"
    gz_dir.mkdir()
    gz_names = []
    for path in files:
        target = gz_dir / (path.name + ".gz")
        target.write_bytes(gzip.compress(path.read_bytes(), compresslevel=6, mtime=0))
        gz_names.append(str(target))
    packed = sum(os.path.getsize(n) for n in gz_names)
    zcat = ["sh", "-c", 'zcat "$@" > "$0"', "{fifo}", *gz_names]
    text, textgz = "s3://bench/text/", "s3://bench/textgz/"
    rows: dict[str, tuple[Row, int]] = {
        "plain (spliced)": (pipe_row(store, fifos, "text", text, size), size),
        "plain, no splice": (
            pipe_row(store, fifos, "copied", text, size, PipeOptions(splice=False)),
            size,
        ),
        "Gzip channel": (pipe_row(store, fifos, "gz", textgz, size, compression="Gzip"), size),
        "zcat -> FIFO": (lambda _: fifos.feed(zcat, size), size),
        # Each object one record: the payload counts, not the 8-byte headers and padding.
        "RecordIO channel": (
            pipe_row(store, fifos, "rio", text, None, record_wrapper="RecordIO"),
            size,
        ),
    }
    print(
        f"\ncodecs: {size >> 20} MiB of text in {args.objects} objects ({packed >> 20} MiB "
        f"gzipped), MiB/s of decompressed bytes, median of {args.repeat} rounds; "
        "baseline: zcat -> FIFO"
    )
    measure(rows, args.repeat, "zcat -> FIFO")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--codecs", action="store_true", help="the gzip and RecordIO section")
    parser.add_argument("--codec-size-mib", type=int, default=256)
    parser.add_argument("--dir", default=None, help="where to put the store (default: tmp)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    pipe_max = Path("/proc/sys/fs/pipe-max-size").read_text().strip()
    print(f"{load()} at start, {os.cpu_count()} CPUs, pipe-max-size {pipe_max}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        store = LocalStore(work / "store")
        section = codec_section if args.codecs else plain_section
        section(work, store, Fifos(work), args)
    print(f"{load()} at end")


if __name__ == "__main__":
    main()
