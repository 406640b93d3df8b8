"""File-mode staging throughput: trainport's channel download beside cp / aws s3 cp.

For each object size (default 1 MiB and 64 MiB) it writes ``--size-mib`` of random bytes as
objects of that size, then stages them into an empty folder through trainport's real code
path, :func:`trainport.host.channels.resolve_channel` then
:func:`trainport.host.channels.stage_file_channel` with the store and worker count
:func:`trainport.config.load_settings` selects (what the host agent calls for a File-mode
channel), and times the same copy by the baseline in the same run:

- local store (``$TRAINPORT_HOME/store``): ``cp -r`` of the object folder;
- S3 endpoint (moto's server mode, started as a subprocess on 127.0.0.1 so it does not share
  this process's GIL): ``aws s3 cp --recursive``.

Each repetition drops the page cache first (``sync; echo 3 > /proc/sys/vm/drop_caches``)
when this process may (root); otherwise it says so. The order of trainport and the baseline
alternates between repetitions; each figure is the median.

    python benchmarks/staging_throughput.py --size-mib 1024 --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainport.config import load_settings
from trainport.host.channels import resolve_channel, stage_file_channel
from trainport.spec import ChannelSpec
from trainport.store.api import ObjectStore
from trainport.store.registry import open_store

GOAL_RATIO = 0.9
BUCKET = "bench"
MiB = 1 << 20


@dataclass(frozen=True)
class Row:
    store: str
    object_mib: int
    objects: int
    ours_s: float
    base_s: float
    baseline: str

    def mib_s(self, seconds: float, total_mib: float) -> float:
        return total_mib / seconds if seconds > 0 else 0.0


def drop_caches() -> bool:
    """Empty the page cache so each copy reads from disk; False if not allowed here."""
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def write_objects(folder: Path, total_mib: int, object_mib: int) -> int:
    """``total_mib`` of random bytes as ``object_mib``-sized files; returns the count."""
    folder.mkdir(parents=True, exist_ok=True)
    count = max(1, total_mib // object_mib)
    block = os.urandom(object_mib * MiB)
    for i in range(count):
        # Each object differs in its first bytes, so no layer can deduplicate them.
        with open(folder / f"part-{i:05d}", "wb") as f:
            f.write(i.to_bytes(8, "little"))
            f.write(memoryview(block)[8:])
    return count


def stage_with_trainport(store: ObjectStore, prefix: str, dest: Path, workers: int) -> None:
    channel = ChannelSpec(
        name="train",
        s3_data_type="S3Prefix",
        s3_uri=f"s3://{BUCKET}/{prefix}",
        distribution="FullyReplicated",
        input_mode="File",
    )
    objects = resolve_channel(store, channel)
    stage_file_channel(store, objects, dest, workers=workers)


def measure(
    ours: Callable[[Path], None],
    base: Callable[[Path], None],
    scratch: Path,
    repeat: int,
    can_drop: bool,
) -> tuple[float, float]:
    ours_s: list[float] = []
    base_s: list[float] = []
    for i in range(repeat):
        pair: list[tuple[list[float], Callable[[Path], None]]] = [(ours_s, ours), (base_s, base)]
        if i % 2:
            pair.reverse()
        for sink, fn in pair:
            dest = scratch / "dest"
            shutil.rmtree(dest, ignore_errors=True)
            if can_drop:
                drop_caches()
            else:
                subprocess.run(["sync"], check=True)
            start = time.perf_counter()
            fn(dest)
            sink.append(time.perf_counter() - start)
            shutil.rmtree(dest, ignore_errors=True)
    return statistics.median(ours_s), statistics.median(base_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    port = free_port()
    exe = shutil.which("moto_server") or "moto_server"
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"moto_server did not start on {url}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def run_local(args: argparse.Namespace, work: Path, can_drop: bool) -> list[Row]:
    env = {**os.environ, "TRAINPORT_HOME": str(work / "home")}
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "TRAINPORT_STORE"):
        env.pop(var, None)
    settings = load_settings(env)
    store = open_store(settings)
    rows = []
    for object_mib in args.object_mib:
        prefix = f"obj-{object_mib}mib"
        src = settings.store_root / BUCKET / prefix
        count = write_objects(src, args.size_mib, object_mib)

        def ours(dest: Path, p: str = prefix) -> None:
            stage_with_trainport(store, p, dest, settings.download_workers)

        def base(dest: Path, s: Path = src) -> None:
            subprocess.run(["cp", "-r", str(s), str(dest)], check=True)

        ours_s, base_s = measure(
            ours,
            base,
            work,
            args.repeat,
            can_drop,
        )
        rows.append(Row("local", object_mib, count, ours_s, base_s, "cp -r"))
        shutil.rmtree(src)
    return rows


def run_s3(args: argparse.Namespace, work: Path, can_drop: bool) -> list[Row]:
    rows = []
    with moto_server() as url:
        env = {
            **os.environ,
            "TRAINPORT_HOME": str(work / "home"),
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        env.pop("AWS_ENDPOINT_URL_S3", None)
        env.pop("TRAINPORT_STORE", None)
        settings = load_settings(env)
        saved = dict(os.environ)
        os.environ.update(env)  # boto3 reads credentials from the process environment
        try:
            store = open_store(settings)
            subprocess.run(
                ["aws", "s3", "mb", f"s3://{BUCKET}"], env=env, check=True, capture_output=True
            )
            for object_mib in args.object_mib:
                prefix = f"obj-{object_mib}mib"
                src = work / "upload" / prefix
                count = write_objects(src, args.size_mib, object_mib)
                subprocess.run(
                    [
                        "aws",
                        "s3",
                        "cp",
                        "--recursive",
                        "--quiet",
                        str(src),
                        f"s3://{BUCKET}/{prefix}/",
                    ],
                    env=env,
                    check=True,
                )
                shutil.rmtree(src)

                def baseline(dest: Path, p: str = prefix) -> None:
                    subprocess.run(
                        [
                            "aws",
                            "s3",
                            "cp",
                            "--recursive",
                            "--quiet",
                            f"s3://{BUCKET}/{p}/",
                            str(dest),
                        ],
                        env=env,
                        check=True,
                    )

                def ours(dest: Path, p: str = prefix) -> None:
                    stage_with_trainport(store, p, dest, settings.download_workers)

                ours_s, base_s = measure(
                    ours,
                    baseline,
                    work,
                    args.repeat,
                    can_drop,
                )
                rows.append(Row("s3 (moto)", object_mib, count, ours_s, base_s, "aws s3 cp"))
                subprocess.run(
                    ["aws", "s3", "rm", "--recursive", "--quiet", f"s3://{BUCKET}/{prefix}/"],
                    env=env,
                    check=True,
                )
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return rows


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="data per case (MiB)")
    parser.add_argument(
        "--object-mib",
        type=_sizes,
        default=[1, 64],
        help="comma-separated object sizes in MiB (default: 1,64)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument(
        "--stores", default="local,s3", help="comma-separated: local, s3 (default: both)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="scratch folder (default: a tmp dir)"
    )
    args = parser.parse_args()
    stores = {s.strip() for s in args.stores.split(",")}

    work = Path(tempfile.mkdtemp(prefix="trainport-bench-staging-", dir=args.dir))
    can_drop = drop_caches()
    rows: list[Row] = []
    try:
        if "local" in stores:
            rows += run_local(args, work, can_drop)
        if "s3" in stores:
            rows += run_s3(args, work, can_drop)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    workers = load_settings().download_workers
    cache = (
        "dropped before every copy" if can_drop else "NOT dropped (not permitted); order alternates"
    )
    print(
        f"File-mode staging of {args.size_mib} MiB, median of {args.repeat}; "
        f"goal: >= {GOAL_RATIO:.1f}x the baseline"
    )
    print(f"  {os.cpu_count()} CPUs, {workers} download workers, page cache {cache}")
    header = (
        f"{'store':<11}{'objects':>14}{'trainport MiB/s':>17}{'(s)':>7}"
        f"{'baseline':>12}{'MiB/s':>8}{'(s)':>7}{'ratio':>8}{'goal':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        total = r.objects * r.object_mib
        ours, base = r.mib_s(r.ours_s, total), r.mib_s(r.base_s, total)
        ratio = ours / base if base else 0.0
        ok = "ok" if ratio >= GOAL_RATIO else "MISS"
        objects = f"{r.objects} x {r.object_mib} MiB"
        print(
            f"{r.store:<11}{objects:>14}{ours:>17.0f}{r.ours_s:>7.2f}"
            f"{r.baseline:>12}{base:>8.0f}{r.base_s:>7.2f}{ratio:>7.2f}x{ok:>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
