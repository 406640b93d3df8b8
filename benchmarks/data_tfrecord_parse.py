"""TFRecord parsing speed: trainport.data's reader beside the ``tfrecord`` package (PyPI).

Writes one file of ``--size-mib`` MiB per record size (default 1 KiB and 1 MiB records),
then reads it end to end with each reader, alternating the order between repetitions, and
prints MB/s (decimal) and the ratio. The file is read once before timing so both readers
see it in the page cache: the figure is parsing cost, not disk speed.

trainport verifies both CRC-32C checksums of every record and hands out ``bytes``; the
``tfrecord`` package checks no checksum and hands out a ``memoryview`` into a buffer it
reuses, so it does strictly less work per record. A third column adds to the ``tfrecord``
package what it skips (the data checksum, with a C CRC reading its buffer in place when the
``crc32c`` package is installed), for a like-for-like figure.

Below the table it prints what bounds the large-record figure: the cost of one CRC-32C pass
over a 1 MiB buffer already in cache, for each installed C implementation. The ``tfrecord``
package's whole cost per MiB is one copy from the page cache; a reader that checks the data
checksum and returns each record as its own ``bytes`` does that same copy plus the CRC pass,
so its speed relative to the package is at most ``package / (package + CRC)``.

    python benchmarks/data_tfrecord_parse.py --size-mib 256 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainport.data import ByteStream, encode_tfrecord, iter_tfrecords
from trainport.data.crc import crc_implementation


def write_file(path: Path, record_size: int, total: int) -> int:
    record = os.urandom(record_size)
    count = max(1, total // record_size)
    encoded = encode_tfrecord(record)
    with open(path, "wb") as f:
        for _ in range(count):
            f.write(encoded)
    return count


def read_trainport(path: Path) -> int:
    n = 0
    with open(path, "rb", buffering=0) as raw:
        for record in iter_tfrecords(ByteStream(raw, source=str(path))):
            n += len(record)
    return n


def read_tfrecord_package(path: Path) -> int:
    from tfrecord.reader import tfrecord_iterator

    n = 0
    for record in tfrecord_iterator(str(path)):
        n += len(record)
    return n


def read_tfrecord_package_verified(path: Path) -> int:
    from tfrecord.reader import tfrecord_iterator

    # The package gives no access to the stored checksums, so this is a lower bound on the
    # cost of verifying: one CRC over each record's data, compared with nothing. The
    # package's records are views into a writable buffer, which the ``crc32c`` package
    # reads in place; google-crc32c takes only read-only buffers, so it needs a copy.
    crc: Callable[[memoryview], int]
    try:
        from crc32c import crc32c as crc
    except ImportError:
        from google_crc32c import value

        def crc(data: memoryview) -> int:
            return int(value(bytes(data)))

    n = 0
    for record in tfrecord_iterator(str(path)):
        crc(record)
        n += len(record)
    return n


def crc_costs(repeat: int = 200) -> dict[str, float]:
    """Seconds per MiB of CRC-32C over one cached 1 MiB buffer, per installed C package."""
    functions: dict[str, Callable[[bytes], int]] = {}
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            functions["google-crc32c"] = google_crc32c.value
    except ImportError:
        pass
    try:
        import crc32c as crc32c_pkg

        functions["crc32c"] = crc32c_pkg.crc32c
    except ImportError:
        pass
    buf = os.urandom(1 << 20)
    costs: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(5):  # interleaved rounds, so load on the machine hits both alike
        for name, fn in functions.items():
            fn(buf)
            t0 = time.perf_counter()
            for _ in range(repeat):
                fn(buf)
            costs[name].append((time.perf_counter() - t0) / repeat)
    return {name: statistics.median(times) for name, times in costs.items()}


def timed(read: Callable[[Path], int], path: Path) -> float:
    t0 = time.perf_counter()
    read(path)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--record-sizes", default="1024,1048576")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    total = args.size_mib << 20
    print(f"CRC-32C via {crc_implementation()}; {args.size_mib} MiB per file")
    print(
        f"{'record':>9} {'trainport MB/s':>15} {'tfrecord MB/s':>14} {'ratio':>6} "
        f"{'tfrecord+crc MB/s':>18} {'ratio':>6}"
    )
    per_mib: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.record_sizes.split(",")):
            path = Path(tmp) / f"r{size}.tfrecord"
            write_file(path, size, total)
            file_bytes = path.stat().st_size
            read_trainport(path)  # warm the page cache
            ours: list[float] = []
            theirs: list[float] = []
            verified: list[float] = []
            for i in range(args.repeat):
                order = [
                    (ours, read_trainport),
                    (theirs, read_tfrecord_package),
                    (verified, read_tfrecord_package_verified),
                ]
                for times, read in order if i % 2 == 0 else order[::-1]:
                    times.append(timed(read, path))
            ours_mb, theirs_mb, verified_mb = (
                file_bytes / 1e6 / statistics.median(t) for t in (ours, theirs, verified)
            )
            print(
                f"{size:>9} {ours_mb:>15.0f} {theirs_mb:>14.0f} {ours_mb / theirs_mb:>5.2f}x "
                f"{verified_mb:>18.0f} {ours_mb / verified_mb:>5.2f}x"
            )
            per_mib[size] = (1e6 / ours_mb * 1.048576, 1e6 / theirs_mb * 1.048576)
            path.unlink()
    print()
    crc = crc_costs()
    for name, seconds in crc.items():
        print(
            f"CRC-32C of a cached 1 MiB buffer via {name}: {seconds * 1e6:.1f} us "
            f"({1.048576e-3 / seconds:.1f} GB/s)"
        )
    crc_us = min(crc.values()) * 1e6
    for size, (ours_us, theirs_us) in per_mib.items():
        if size >= 1 << 18:
            print(
                f"{size}-byte records, us per MiB: trainport {ours_us:.1f}, "
                f"tfrecord {theirs_us:.1f}; bound for a verifying reader: "
                f"{theirs_us:.1f} / ({theirs_us:.1f} + {crc_us:.1f}) "
                f"= {theirs_us / (theirs_us + crc_us):.2f}x"
            )


if __name__ == "__main__":
    main()
