"""Pipe-mode throughput from an S3 endpoint, beside plain clients reading the same objects.

moto's server mode runs as a subprocess on 127.0.0.1 (a real S3 endpoint over HTTP). For
each object size (default 1 MiB and 64 MiB objects, 256 MiB per size) the same objects are
read by:

- plain clients, parallel ranged GETs into memory, bodies discarded: boto3 (one client,
  ``T`` threads, parts of 8 MiB or the whole object if smaller) and urllib3 (presigned
  URLs made once per key, then bare GETs on one connection pool: the least client work per
  byte). Each at 8
  and 16 threads; the best median of these is the baseline;
- ``Pipe mode``: trainport's channel server on the same endpoint
  (:class:`~trainport.store.s3.S3Store`, the ``PipeOptions`` the host agent uses with
  ``TRAINPORT_DOWNLOAD_WORKERS``), one epoch into a FIFO read by a separate process with
  1 MiB reads, timed from the server's start to the reader's EOF (a fresh server each
  round, so fetching ahead while the FIFO waits for its reader is on the clock; the
  channel's listing, once per job, is not).

Rounds are interleaved after one warm-up round; medians with min-max over rounds. The best
client is the one with the highest median; each row's ratio is the median (min-max) of its
per-round ratios to that client in the same round, which cancels load that changes between
rounds. The load average is printed before and after.
With 2 CPUs, moto, the client and the FIFO reader share them, so these figures compare
clients on this endpoint, not S3 itself. Usage::

    python benchmarks/pipe_s3_throughput.py [--size-mib 256] [--object-mib 1 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import botocore.config
import urllib3

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipe_throughput import Fifos, load, pipe_row
from staging_throughput import moto_server

from trainport.config import load_settings
from trainport.host.pipe import PipeOptions
from trainport.store.s3 import S3Store

BUCKET = "bench"
PART = 8 << 20

Ranges = list[tuple[str, int, int]]  # key, start, end (exclusive)


def ranges(keys: list[str], size: int) -> Ranges:
    return [(k, s, min(s + PART, size)) for k in keys for s in range(0, size, PART)]


def boto3_client(url: str, threads: int) -> Callable[[Ranges], None]:
    config = botocore.config.Config(max_pool_connections=threads + 4)
    client = boto3.session.Session().client(
        "s3", endpoint_url=url, region_name="us-east-1", config=config
    )

    def get(r: tuple[str, int, int]) -> int:
        key, start, end = r
        body = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end - 1}")
        return len(body["Body"].read())

    def run(parts: Ranges) -> None:
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(get, parts):
                pass

    return run


def urllib3_client(url: str, threads: int, keys: list[str]) -> Callable[[Ranges], None]:
    # Presigned once per key (the Range header is not part of the signature), so each GET
    # costs the client nothing but HTTP.
    signer = boto3.session.Session().client("s3", endpoint_url=url, region_name="us-east-1")
    urls = {
        k: signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k})
        for k in keys
    }
    pool_manager = urllib3.PoolManager(maxsize=threads + 4)

    def get(r: tuple[str, int, int]) -> int:
        key, start, end = r
        resp = pool_manager.request("GET", urls[key], headers={"Range": f"bytes={start}-{end - 1}"})
        if resp.status != 206 and resp.status != 200:
            raise SystemExit(f"GET {key}: HTTP {resp.status}")
        return len(resp.data)

    def run(parts: Ranges) -> None:
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(get, parts):
                pass

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--object-mib", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        os.environ.pop(var, None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    print(f"{load()} at start, {os.cpu_count()} CPUs")
    settings = load_settings(dict(os.environ))
    with moto_server() as url, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fifos = Fifos(work)
        store = S3Store(
            endpoint_url=url, region="us-east-1", max_connections=settings.download_workers + 4
        )
        store.client.create_bucket(Bucket=BUCKET)
        for object_mib in args.object_mib:
            size = object_mib << 20
            count = max(1, args.size_mib // object_mib)
            keys = [f"obj{object_mib}/part-{i:05d}" for i in range(count)]
            block = os.urandom(size)
            for key in keys:
                store.client.put_object(Bucket=BUCKET, Key=key, Body=block)
            total = size * count
            parts = ranges(keys, size)
            clients = {}
            for threads in args.threads:
                clients[f"boto3, {threads} threads"] = boto3_client(url, threads)
                clients[f"urllib3, {threads} threads"] = urllib3_client(url, threads, keys)
            pipe = pipe_row(
                store,
                fifos,
                f"obj{object_mib}",
                f"s3://{BUCKET}/obj{object_mib}/",
                total,
                PipeOptions(fetchers=settings.download_workers),
            )
            seconds: dict[str, list[float]] = {name: [] for name in [*clients, "Pipe mode"]}
            for attempt in range(args.repeat + 1):
                for name, client in clients.items():
                    began = time.perf_counter()
                    client(parts)
                    took = time.perf_counter() - began
                    if attempt:
                        seconds[name].append(took)
                took = pipe(attempt)  # from the server's start to the reader's EOF
                if attempt:
                    seconds["Pipe mode"].append(took)
            rates = {n: [total / (1 << 20) / s for s in v] for n, v in seconds.items()}
            best = max(clients, key=lambda n: statistics.median(rates[n]))
            print(
                f"\n{count} objects of {object_mib} MiB ({total >> 20} MiB), "
                f"{settings.download_workers} Pipe fetchers, median of {args.repeat} rounds; "
                f"baseline: {best}"
            )
            head = ("reader", "MiB/s median", "(min-max)", "vs best", "(min-max)")
            print(f"{head[0]:<24}{head[1]:>14}{head[2]:>14}{head[3]:>10}{head[4]:>14}")
            for name, values in rates.items():
                ratios = [v / b for v, b in zip(values, rates[best], strict=True)]
                print(
                    f"{name:<24}{statistics.median(values):>14.0f}"
                    f"{f'({min(values):.0f}-{max(values):.0f})':>14}"
                    f"{statistics.median(ratios):>9.2f}x"
                    f"{f'({min(ratios):.2f}-{max(ratios):.2f})':>14}"
                )
            for key in keys:
                store.client.delete_object(Bucket=BUCKET, Key=key)
    print(f"{load()} at end")


if __name__ == "__main__":
    main()
