"""Time to first record and to the end of one epoch: Pipe mode against File mode, same data.

One channel (default 1 GiB: 64 TFRecord objects of 16 MiB, each record 1 MiB with its
framing) sits in the embedded local store. The same training script runs as a real trainport
job once per mode (``TrainingInputMode`` File, then Pipe, alternating the order each
repetition): File mode stages the whole channel under ``/opt/ml/input/data/train/`` before
the script starts; Pipe mode starts the script at once and streams the objects through the
FIFO ``train_0``. The script parses every record with trainport.data (both CRCs checked) and
reports wall-clock times, which the benchmark turns into seconds since it submitted the job:

- **script start**: the first line of the training script;
- **imports done**: trainport.data (and with it PyTorch) imported, as any script would;
- **first record**: the first record parsed (what a training loop waits for);
- **epoch end**: the last record of the epoch parsed;
- **job done**: the job record says Completed (model upload and teardown included).

Medians over ``--repeat`` runs of each mode, after one warm-up job per mode (so the
objects are in the page cache: the figure is trainport's, not the disk's). Usage::

    python benchmarks/pipe_vs_file.py [--size-mib 1024] [--objects 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainport.data import TFRecordWriter

# The training script: argv[1] is the input mode. Prints one RESULT line with wall times.
TRAIN = r"""
import json, os, sys, time
began = time.time()
from trainport.data import ByteStream, iter_tfrecords
ready = time.time()
mode = sys.argv[1]
data = os.path.join(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"), "input", "data")

def streams():
    if mode == "Pipe":
        path = os.path.join(data, "train_0")
        while not os.path.exists(path):
            time.sleep(0.001)
        yield path
    else:
        root = os.path.join(data, "train")
        for dirpath, _, files in sorted(os.walk(root)):
            for name in sorted(files):
                yield os.path.join(dirpath, name)

first = None
records = size = 0
for path in streams():
    with open(path, "rb", buffering=0) as f:
        for record in iter_tfrecords(ByteStream(f, source=path)):
            if first is None:
                first = time.time()
            records += 1
            size += len(record)
end = time.time()
print("RESULT " + json.dumps({"start": began, "ready": ready, "first": first, "end": end,
                              "records": records, "bytes": size}), flush=True)
"""

COLUMNS = ("start", "ready", "first", "end", "done")


def write_channel(store: Path, size_mib: int, objects: int, record_kib: int) -> tuple[int, int]:
    """``objects`` TFRecord files of ``size_mib`` MiB in all; returns (records, data bytes).

    Each record takes ``record_kib`` KiB with its 16 bytes of framing, so the objects hold
    exactly the size asked for."""
    per_object = (size_mib << 20) // objects
    record = os.urandom((record_kib << 10) - 16)
    count = max(1, per_object // (record_kib << 10))
    root = store / "bench" / "train"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(objects):
        with open(root / f"part-{i:05d}.tfrecord", "wb") as f:
            writer = TFRecordWriter(f)
            for _ in range(count):
                writer.write(record)
    return count * objects, count * objects * len(record)


def job_request(name: str, mode: str, script: Path, runner: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/trainport-bench",
        "AlgorithmSpecification": {
            "TrainingInputMode": mode,
            "ContainerEntrypoint": [sys.executable, "-u", str(script), mode],
        },
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bench/train/"}
                },
                "InputMode": mode,
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bench-out/jobs"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 50},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Tags": [{"Key": "trainport:runner", "Value": runner}],
    }


def run_job(service: Any, home: Path, name: str, mode: str, script: Path, runner: str) -> dict:
    submitted = time.time()
    service.create(job_request(name, mode, script, runner))
    while True:
        record = service.get(name)
        if record.status in ("Completed", "Failed", "Stopped"):
            break
        time.sleep(0.01)
    done = time.time()
    log = (home / "jobs" / name / "logs" / "algo-1.log").read_text()
    if record.status != "Completed":
        raise SystemExit(f"{name}: {record.status}: {record.failure_reason}\n{log}")
    line = next((x for x in log.splitlines() if "RESULT " in x), None)
    if line is None:
        raise SystemExit(f"{name}: no RESULT line in the log:\n{log}")
    line = line[line.index("RESULT ") :]
    result = json.loads(line[len("RESULT ") :])
    times = {k: result[k] - submitted for k in ("start", "ready", "first", "end")}
    times["done"] = done - submitted
    return {**times, "records": result["records"], "bytes": result["bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--record-kib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runner", default="process", choices=("process", "sandbox"))
    parser.add_argument("--dir", default=None, help="where TRAINPORT_HOME goes (default: tmp)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        home = Path(tmp) / "home"
        os.environ["TRAINPORT_HOME"] = str(home)
        for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "TRAINPORT_STORE"):
            os.environ.pop(var, None)
        from trainport.config import load_settings
        from trainport.jobs.service import JobService

        records, data_bytes = write_channel(
            home / "store", args.size_mib, args.objects, args.record_kib
        )
        script = Path(tmp) / "train.py"
        script.write_text(TRAIN)
        service = JobService(load_settings())
        results: dict[str, list[dict]] = {"File": [], "Pipe": []}
        for attempt in range(args.repeat + 1):  # the first round is a warm-up
            modes = ["File", "Pipe"] if attempt % 2 == 0 else ["Pipe", "File"]
            for mode in modes:
                result = run_job(
                    service, home, f"{mode.lower()}-{attempt}", mode, script, args.runner
                )
                if (result["records"], result["bytes"]) != (records, data_bytes):
                    raise SystemExit(f"{mode}: read {result}, expected {records} records")
                if attempt:
                    results[mode].append(result)

    mib = data_bytes / (1 << 20)
    print(
        f"channel: {args.size_mib} MiB in {args.objects} TFRecord objects, {records} records "
        f"of {args.record_kib} KiB framed ({mib:.0f} MiB of record data), local store, "
        f"{args.runner} runner, median of {args.repeat}"
    )
    print("seconds since the job was submitted:")
    print(
        f"{'mode':<6}{'script start':>14}{'imports done':>14}{'first record':>14}"
        f"{'epoch end':>11}{'job done':>10}{'MiB/s first->end':>18}"
    )
    med = {
        mode: {c: statistics.median(r[c] for r in runs) for c in COLUMNS}
        for mode, runs in results.items()
    }
    for mode, m in med.items():
        print(
            f"{mode:<6}{m['start']:>14.2f}{m['ready']:>14.2f}{m['first']:>14.2f}"
            f"{m['end']:>11.2f}{m['done']:>10.2f}{mib / (m['end'] - m['first']):>18.0f}"
        )
    f, p = med["File"], med["Pipe"]
    print(
        f"Pipe/File: first record {p['first'] / f['first']:.2f}x, "
        f"epoch end {p['end'] / f['end']:.2f}x, job done {p['done'] / f['done']:.2f}x"
    )


if __name__ == "__main__":
    main()
