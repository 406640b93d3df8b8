"""Throughput and latency of the trainport server: DescribeTrainingJob and ListTrainingJobs
with 1,000 jobs in the store, beside a trivial operation of the same server (the ceiling).

With ``--jobs 1000,100000`` every call, every ListTrainingJobs filter and sort among them,
runs against a store of each size (a server each, all serving at once), and each call's
rate at each size is printed beside its rate at the first size, as a ratio.

The server runs as ``trainport server`` in its own process, with SigV4 on. Clients are
threads of this process, each with one keep-alive connection, replaying requests signed
once by botocore (a signature stays valid for 15 minutes), so the client side costs as
little as possible and all three operations pay the same protocol, signature check and
HTTP costs. ``Trainport.Ping`` returns ``{}`` after exactly those costs.

With ``--ref REF`` this tree's server and the server of git commit ``REF`` (a detached
worktree, first on its ``PYTHONPATH``) serve copies of one store at the same time, and each
call's rate is printed for both with their ratio: a change measured in one run.

    python benchmarks/server_throughput.py [--seconds 3] [--clients 1,8,32] [--jobs 1000]
        [--ref REF]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
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
SPACING = 10.0  # seconds between two jobs' creation
BATCH = 5000  # jobs per insert transaction


def job_name(i: int) -> str:
    return f"bench-{i:06d}"


def fill(db: JobDB, settings_region: str, jobs: int = JOBS) -> None:
    base = time.time() - SPACING * jobs
    batch: list[JobRecord] = []
    for i in range(jobs):
        name = job_name(i)
        t0 = base + SPACING * i
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
        batch.append(
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
        if len(batch) == BATCH or i == jobs - 1:
            db.insert_many(batch)
            batch = []


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


def list_calls(jobs: int) -> dict[str, dict[str, object]]:
    """Every ListTrainingJobs filter and sort, as a client would ask (100 per page)."""
    last_hour = time.time() - 3600
    return {
        "List StatusEquals": {"StatusEquals": "Completed"},
        "List StatusEquals, SortBy Name": {"StatusEquals": "Failed", "SortBy": "Name"},
        "List SortBy Name": {"SortBy": "Name", "SortOrder": "Ascending"},
        "List SortBy Status": {"SortBy": "Status"},
        "List NameContains (most jobs)": {"NameContains": "bench-0"},
        "List NameContains (ten jobs)": {"NameContains": "bench-00004"},
        "List CreationTimeAfter (last hour)": {"CreationTimeAfter": last_hour},
        "List CreationTimeBefore (first half)": {
            "CreationTimeBefore": time.time() - SPACING * jobs / 2
        },
        "List LastModifiedTimeAfter (last hour)": {"LastModifiedTimeAfter": last_hour},
        "List LastModifiedTimeAfter, oldest first": {
            "LastModifiedTimeAfter": last_hour,
            "SortOrder": "Ascending",
        },
        "List CreationTimeAfter, SortBy Name": {"CreationTimeAfter": last_hour, "SortBy": "Name"},
        "List CreationTimeBefore, SortBy Status": {
            "CreationTimeBefore": time.time() - SPACING * jobs / 2,
            "SortBy": "Status",
        },
        "List LastModifiedTimeBefore (first half)": {
            "LastModifiedTimeBefore": time.time() - SPACING * jobs / 2
        },
    }


def middle_token(port: int, params: dict[str, object], jobs: int) -> str:
    """The NextToken of the page halfway through a 100-per-page listing."""
    token = ""
    for _ in range(jobs // 200):
        body, headers = signed(
            port, "SageMaker.ListTrainingJobs", {**params, "NextToken": token} if token else params
        )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/", body=body, headers=headers)
        token = json.loads(conn.getresponse().read())["NextToken"]
        conn.close()
    return token


def operations(port: int, jobs: int) -> dict[str, list[tuple[bytes, dict[str, str]]]]:
    list_op = "SageMaker.ListTrainingJobs"
    ops = {
        "Ping (trivial)": [signed(port, "Trainport.Ping", {})],
        "DescribeTrainingJob": [
            signed(port, "SageMaker.DescribeTrainingJob", {"TrainingJobName": job_name(i)})
            for i in range(0, jobs, max(1, jobs // 50))
        ],
        "ListTrainingJobs (10/page)": [signed(port, list_op, {})],
        "ListTrainingJobs (100/page, filter)": [
            signed(port, list_op, {"MaxResults": 100, "StatusEquals": "Completed"})
        ],
    }
    for label, params in list_calls(jobs).items():
        ops[label] = [signed(port, list_op, {"MaxResults": 100, **params})]
    middle = {"MaxResults": 100}
    ops["List a middle page (NextToken)"] = [
        signed(port, list_op, {**middle, "NextToken": middle_token(port, middle, jobs)})
    ]
    return ops


Cell = tuple[float, float, float, int]


def start_server(env: dict[str, str], home: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``trainport server`` (with ``env``) on a free port, once it accepts connections."""
    port = free_port()
    log = home / "server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "trainport.cli", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, port
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                print(log.read_text(), file=sys.stderr)
                raise SystemExit(1) from None
            time.sleep(0.1)


def run_store(jobs: int, levels: list[int], seconds: float) -> dict[tuple[str, int], Cell]:
    """Fill a store with ``jobs`` jobs, serve it, and measure each operation."""
    results: dict[tuple[str, int], Cell] = {}
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        env = {
            **os.environ,
            "TRAINPORT_HOME": tmp,
            "TRAINPORT_SERVER_KEYS": f"{KEY_ID}:{SECRET}",
        }
        settings = load_settings(env)
        fill(JobDB(settings.db_path), settings.region, jobs)
        server, port = start_server(env, Path(tmp))
        try:
            ops = operations(port, jobs)
            ops = {k: v for k, v in ops.items() if not k.startswith("List ")}
            for reqs in ops.values():  # warm up every path
                measure(port, reqs, 2, 0.3)
            print(f"{jobs} jobs in the store; {seconds:.0f} s per cell; {os.cpu_count()} CPUs")
            header = f"{'operation':42} {'clients':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
            print(header + f" {'vs trivial':>10}")
            ceiling: dict[int, float] = {}
            for label, reqs in ops.items():
                for clients in levels:
                    cell = measure(port, reqs, clients, seconds)
                    rate, p50, p99, errors = cell
                    results[label, clients] = cell
                    if label.startswith("Ping"):
                        ceiling[clients] = rate
                    ratio = rate / ceiling[clients] if ceiling.get(clients) else 0.0
                    note = f"  ({errors} errors)" if errors else ""
                    print(
                        f"{label:42} {clients:7d} {rate:9.0f} {p50:8.2f} {p99:8.2f} "
                        f"{ratio:9.2f}x{note}",
                        flush=True,
                    )
        finally:
            server.terminate()
            server.wait(timeout=10)
    return results


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) the process ``pid`` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worktree(ref: str, where: Path) -> Path:
    """This repository at ``ref``, checked out (detached) at ``where``."""
    repo = Path(__file__).resolve().parent.parent
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", "--force", str(where), ref],
        check=True,
        capture_output=True,
    )
    return where


def drop_worktree(where: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "remove", "--force", str(where)], capture_output=True
    )


def compare(ref: str, jobs: int, levels: list[int], seconds: float) -> None:
    """This tree's server beside the server of commit ``ref``, cell by cell.

    Both serve copies of one store at once; each cell is measured old, new, new, old and
    each server's two rates averaged, so a machine that grows busier or quieter during the
    run weighs on both alike. Each server's CPU time per request is printed too: on a
    machine other work keeps busy, the rates also measure how much of the CPU each server's
    threads win from that work, and the CPU time is what a request costs."""
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        homes = {"new": Path(tmp) / "new", "old": Path(tmp) / "old"}
        base = {**os.environ, "TRAINPORT_SERVER_KEYS": f"{KEY_ID}:{SECRET}"}
        settings = load_settings({**base, "TRAINPORT_HOME": str(homes["new"])})
        fill(JobDB(settings.db_path), settings.region, jobs)
        shutil.copytree(homes["new"], homes["old"])
        code = worktree(ref, Path(tmp) / "code")
        envs = {
            "new": {**base, "TRAINPORT_HOME": str(homes["new"])},
            "old": {
                **base,
                "TRAINPORT_HOME": str(homes["old"]),
                "PYTHONPATH": str(code / "src"),
            },
        }
        servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            for which, env in envs.items():
                servers[which] = start_server(env, homes[which])
            ops = {which: operations(port, jobs) for which, (_, port) in servers.items()}
            for which, (_, port) in servers.items():
                for reqs in ops[which].values():  # warm up every path
                    measure(port, reqs, 2, 0.3)
            print(
                f"{jobs} jobs in the store; this tree (new) beside {ref} (old); "
                f"{seconds:.0f} s per cell, each measured twice; {os.cpu_count()} CPUs"
            )
            print(
                f"{'operation':42} {'clients':>7} {'new req/s':>10} {'old req/s':>10} "
                f"{'new/old':>8} {'new p50':>8} {'old p50':>8} {'new p99':>8} {'old p99':>8} "
                f"{'new CPU us':>10} {'old CPU us':>10} {'new/old':>8}"
            )
            for label in ops["new"]:
                if label.startswith("List "):
                    continue
                for clients in levels:
                    cells: dict[str, list[Cell]] = {"new": [], "old": []}
                    used = {"new": 0.0, "old": 0.0}
                    served = {"new": 0.0, "old": 0.0}
                    for which in ("old", "new", "new", "old"):
                        server, port = servers[which]
                        before = cpu_seconds(server.pid)
                        cell = measure(port, ops[which][label], clients, seconds)
                        used[which] += cpu_seconds(server.pid) - before
                        served[which] += cell[0] * seconds
                        cells[which].append(cell)
                    rate = {w: statistics.mean(c[0] for c in cells[w]) for w in cells}
                    p50 = {w: statistics.mean(c[1] for c in cells[w]) for w in cells}
                    p99 = {w: statistics.mean(c[2] for c in cells[w]) for w in cells}
                    cpu = {w: 1e6 * used[w] / served[w] if served[w] else 0.0 for w in cells}
                    errors = sum(c[3] for w in cells for c in cells[w])
                    note = f"  ({errors} errors)" if errors else ""
                    print(
                        f"{label:42} {clients:7d} {rate['new']:10.0f} {rate['old']:10.0f} "
                        f"{rate['new'] / rate['old'] if rate['old'] else 0.0:7.2f}x "
                        f"{p50['new']:8.2f} {p50['old']:8.2f} {p99['new']:8.2f} "
                        f"{p99['old']:8.2f} {cpu['new']:10.0f} {cpu['old']:10.0f} "
                        f"{cpu['new'] / cpu['old'] if cpu['old'] else 0.0:7.2f}x{note}",
                        flush=True,
                    )
        finally:
            for server, _ in servers.values():
                server.terminate()
                server.wait(timeout=10)
            drop_worktree(code)


def compare_sizes(sizes: list[int], levels: list[int], seconds: float, rounds: int) -> None:
    """Every call against a store of each size, served at once, cell by cell.

    Each cell is measured in ``rounds`` rounds, on the sizes in turn and then in reverse
    (1,000, 100,000, 100,000, 1,000, ...), and each size keeps its best round: other work
    on the machine only ever slows a round down, so the best is the least disturbed, and
    the turns make a machine that grows busier or quieter weigh on every size alike."""
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        servers: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            for jobs in sizes:
                home = Path(tmp) / str(jobs)
                env = {
                    **os.environ,
                    "TRAINPORT_HOME": str(home),
                    "TRAINPORT_SERVER_KEYS": f"{KEY_ID}:{SECRET}",
                }
                settings = load_settings(env)
                fill(JobDB(settings.db_path), settings.region, jobs)
                servers[jobs] = start_server(env, home)
            ops = {jobs: operations(port, jobs) for jobs, (_, port) in servers.items()}
            for jobs, (_, port) in servers.items():
                for reqs in ops[jobs].values():  # warm up every path
                    measure(port, reqs, 2, 0.3)
            first = sizes[0]
            print(
                f"jobs in the store: {', '.join(map(str, sizes))}, served at once; "
                f"{seconds:g} s per round, best of {rounds} rounds; {os.cpu_count()} CPUs"
            )
            columns = [f"{n} req/s" for n in sizes] + [f"{n}/{first}" for n in sizes[1:]]
            columns += [f"{n} p50 ms" for n in sizes]
            print(f"{'operation':42} {'clients':>7} " + " ".join(f"{c:>13}" for c in columns))
            for label in ops[first]:
                for clients in levels:
                    cells: dict[int, list[Cell]] = {n: [] for n in sizes}
                    for turn in range(rounds):
                        for jobs in sizes if turn % 2 == 0 else reversed(sizes):
                            port = servers[jobs][1]
                            cells[jobs].append(measure(port, ops[jobs][label], clients, seconds))
                    rate = {n: max(c[0] for c in cells[n]) for n in sizes}
                    p50 = {n: min(c[1] for c in cells[n]) for n in sizes}
                    errors = sum(c[3] for n in sizes for c in cells[n])
                    note = f"  ({errors} errors)" if errors else ""
                    ratios = [rate[n] / rate[first] if rate[first] else 0.0 for n in sizes[1:]]
                    values = [f"{rate[n]:13.0f}" for n in sizes]
                    values += [f"{r:12.2f}x" for r in ratios]
                    values += [f"{p50[n]:13.2f}" for n in sizes]
                    print(f"{label:42} {clients:7d} " + " ".join(values) + note, flush=True)
        finally:
            for server, _ in servers.values():
                server.terminate()
                server.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument(
        "--jobs",
        default=str(JOBS),
        help="jobs in the store, or several sizes (1000,100000) to compare each call's rate",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="with several --jobs sizes: rounds per cell, each size keeping its best",
    )
    parser.add_argument(
        "--ref",
        help="also serve the store with trainport as of this git commit, and print each "
        "call's rate beside this tree's",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    sizes = [int(n) for n in args.jobs.split(",")]
    if args.ref:
        for jobs in sizes:
            compare(args.ref, jobs, levels, args.seconds)
        return 0
    if len(sizes) > 1:
        compare_sizes(sizes, levels, args.seconds, args.rounds)
        return 0
    run_store(sizes[0], levels, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
