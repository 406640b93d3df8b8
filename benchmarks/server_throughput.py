"""Throughput and latency of the trainport server: DescribeTrainingJob and ListTrainingJobs
with 1,000 jobs in the store, beside a trivial operation of the same server (the ceiling).

The server runs as ``trainport server`` in its own process, with SigV4 on. Clients are
threads of this process, each with one keep-alive connection, replaying requests signed
once by botocore (a signature stays valid for 15 minutes), so the client side costs as
little as possible and all three operations pay the same protocol, signature check and
HTTP costs. ``Trainport.Ping`` returns ``{}`` after exactly those costs.

    python benchmarks/server_throughput.py [--seconds 3] [--clients 1,8,32]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from trainport.config import load_settings
from trainport.jobs.db import JobDB
from trainport.jobs.records import JobRecord, MetricPoint, Transition

KEY_ID, SECRET = "TPAKBENCHMARK0000001", "benchmark-secret"
JOBS = 1000


def fill(db: JobDB, settings_region: str) -> None:
    base = time.time() - 10 * JOBS
    for i in range(JOBS):
        name = f"bench-{i:04d}"
        t0 = base + 10 * i
        status = ("Completed", "Failed", "Stopped")[i % 3]
        request = {
            "TrainingJobName": name,
            "RoleArn": "arn:aws:iam::000000000000:role/bench",
            "AlgorithmSpecification": {
                "TrainingImage": "trainport/python",
                "TrainingInputMode": "File",
                "MetricDefinitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
            },
            "HyperParameters": {f"hp{k}": str(k) for k in range(10)},
            "InputDataConfig": [
                {
                    "ChannelName": "train",
                    "DataSource": {
                        "S3DataSource": {
                            "S3DataType": "S3Prefix",
                            "S3Uri": "s3://data/train/",
                            "S3DataDistributionType": "FullyReplicated",
                        }
                    },
                }
            ],
            "OutputDataConfig": {"S3OutputPath": "s3://out/models"},
            "ResourceConfig": {
                "InstanceType": "ml.m5.large",
                "InstanceCount": 1,
                "VolumeSizeInGB": 1,
            },
        }
        steps = ["Starting", "Downloading", "Training", "Uploading", status]
        transitions = tuple(
            Transition(s, t0 + k, t0 + k + 1, f"{s} message") for k, s in enumerate(steps)
        )
        db.insert(
            JobRecord(
                name=name,
                arn=f"arn:aws:sagemaker:{settings_region}:000000000000:training-job/{name}",
                request=request,
                creation_time=t0,
                status=status,
                secondary_status=status,
                last_modified_time=t0 + 5,
                transitions=transitions,
                training_start_time=t0 + 2,
                training_end_time=t0 + 5,
                model_artifacts=f"s3://out/models/{name}/output/model.tar.gz",
                final_metrics=(MetricPoint("loss", 0.1, t0 + 4),),
            )
        )


def signed(port: int, target: str, body: dict[str, object]) -> tuple[bytes, dict[str, str]]:
    data = json.dumps(body).encode()
    req = AWSRequest(
        method="POST",
        url=f"http://127.0.0.1:{port}/",
        data=data,
        headers={"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": target},
    )
    SigV4Auth(Credentials(KEY_ID, SECRET), "sagemaker", "us-east-1").add_auth(req)
    return data, dict(req.headers.items())


def measure(
    port: int, requests: list[tuple[bytes, dict[str, str]]], clients: int, seconds: float
) -> tuple[float, float, float, int]:
    """(requests/s, p50 ms, p99 ms, errors) for ``clients`` concurrent connections."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start_gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = latencies[i]
        n = i
        start_gate.wait()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                break
            body, headers = requests[n % len(requests)]
            n += 1
            conn.request("POST", "/", body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors[i] += 1
            mine.append(time.perf_counter() - t0)
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds + 1e9  # placeholder until the gate opens
    start_gate.wait()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    every = sorted(x for lat in latencies for x in lat)
    if not every:
        return 0.0, 0.0, 0.0, sum(errors)
    p50 = statistics.median(every) * 1000
    p99 = every[min(len(every) - 1, int(len(every) * 0.99))] * 1000
    return len(every) / elapsed, p50, p99, sum(errors)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,8,32")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        env = {
            **os.environ,
            "TRAINPORT_HOME": tmp,
            "TRAINPORT_SERVER_KEYS": f"{KEY_ID}:{SECRET}",
        }
        settings = load_settings(env)
        fill(JobDB(settings.db_path), settings.region)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "trainport.cli", "server", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(Path(tmp) / "server.log", "wb"),  # noqa: SIM115
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        print((Path(tmp) / "server.log").read_text(), file=sys.stderr)
                        return 1
                    time.sleep(0.1)
            ops = {
                "Ping (trivial)": [signed(port, "Trainport.Ping", {})],
                "DescribeTrainingJob": [
                    signed(
                        port,
                        "SageMaker.DescribeTrainingJob",
                        {"TrainingJobName": f"bench-{i:04d}"},
                    )
                    for i in range(0, JOBS, 20)
                ],
                "ListTrainingJobs (10/page)": [signed(port, "SageMaker.ListTrainingJobs", {})],
                "ListTrainingJobs (100/page, filter)": [
                    signed(
                        port,
                        "SageMaker.ListTrainingJobs",
                        {"MaxResults": 100, "StatusEquals": "Completed"},
                    )
                ],
            }
            for reqs in ops.values():  # warm up every path
                measure(port, reqs, 2, 0.3)
            print(f"{JOBS} jobs in the store; {args.seconds:.0f} s per cell; {os.cpu_count()} CPUs")
            header = f"{'operation':38} {'clients':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
            print(header + f" {'vs trivial':>10}")
            ceiling: dict[int, float] = {}
            for label, reqs in ops.items():
                for clients in levels:
                    rate, p50, p99, errors = measure(port, reqs, clients, args.seconds)
                    if label.startswith("Ping"):
                        ceiling[clients] = rate
                    ratio = rate / ceiling[clients] if ceiling.get(clients) else 0.0
                    note = f"  ({errors} errors)" if errors else ""
                    print(
                        f"{label:38} {clients:7d} {rate:9.0f} {p50:8.2f} {p99:8.2f} "
                        f"{ratio:9.2f}x{note}"
                    )
        finally:
            server.terminate()
            server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
