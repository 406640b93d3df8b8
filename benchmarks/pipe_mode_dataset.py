"""PipeModeDataset over trainport's Pipe mode inside a real job, beside
``tf.data.TFRecordDataset`` on the same files on local disk, in one job.

One script-mode job named by the TensorFlow 2.14.1 image URI (no requirements.txt: the
image's environment gives TensorFlow and PipeModeDataset) gets, for each record size
(default 1 KiB and 64 KiB records, ``--size-mib`` MiB of TFRecord data in ``--objects``
objects in the embedded store), the same objects twice:

- ``p<K>k``, a Pipe channel: ``PipeModeDataset(channel, record_format="TFRecord")`` reads
  one epoch's FIFO per round, as a SageMaker script does;
- ``f<K>k``, a File channel: the same objects staged on the job's local disk, read by
  ``tf.data.TFRecordDataset(files)`` (page cache warm after the first round).

Each round reads both, one after the other, counting records inside TensorFlow
(``Dataset.reduce``, no Python per record); the first round is a warm-up. Prints records/s
and MiB/s (medians, min-max) and the per-round ratio PipeModeDataset / TFRecordDataset.

    python benchmarks/pipe_mode_dataset.py [--size-mib 256] [--record-kib 1 64] [--repeat 5]
        [--envs-dir DIR]  # an environments folder to reuse (else the first build is timed too)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

TF_IMAGE = "763104351884.dkr.ecr.us-west-2.amazonaws.com/tensorflow-training:2.14.1-cpu-py310"

SCRIPT = """
import glob, json, os, time
import tensorflow as tf
from sagemaker_tensorflow import PipeModeDataset

hps = json.loads(os.environ["SM_HPS"])
sizes, rounds = [int(k) for k in str(hps["sizes"]).split(",")], int(hps["rounds"])
count = lambda ds: int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
for kib in sizes:
    files = sorted(glob.glob(os.path.join(os.environ[f"SM_CHANNEL_F{kib}K"], "*")))
    pipe = PipeModeDataset(channel=f"p{kib}k", record_format="TFRecord")
    disk = tf.data.TFRecordDataset(files)
    for r in range(rounds):
        took = {}
        for name, ds in (("PipeModeDataset", pipe), ("TFRecordDataset", disk)):
            began = time.perf_counter()
            n = count(ds)
            took[name] = [n, time.perf_counter() - began]
        print("ROUND " + json.dumps({"kib": kib, "round": r, **took}), flush=True)
"""


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_objects(store: Path, prefix: str, kib: int, size_mib: int, objects: int) -> int:
    from trainport.data import encode_tfrecord

    folder = store / "bench" / prefix
    folder.mkdir(parents=True)
    encoded = encode_tfrecord(os.urandom(kib << 10))
    per_object = max(1, (size_mib << 20) // objects // len(encoded))
    for i in range(objects):
        (folder / f"part-{i:05d}.tfrecord").write_bytes(encoded * per_object)
    return per_object * objects


def job(home: Path, sizes: list[int], rounds: int) -> dict[str, Any]:
    from trainport.host.script_mode import pack_sourcedir

    src = home.parent / "src"
    src.mkdir()
    (src / "bench.py").write_text(SCRIPT)
    code = home / "store" / "code" / "bench" / "sourcedir.tar.gz"
    code.parent.mkdir(parents=True, exist_ok=True)
    code.write_bytes(pack_sourcedir(src, "bench.py"))
    channels = []
    for kib in sizes:
        for name, mode in ((f"p{kib}k", "Pipe"), (f"f{kib}k", "File")):
            uri = f"s3://bench/rec{kib}k/"
            source = {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri}}
            channels.append({"ChannelName": name, "InputMode": mode, "DataSource": source})
    return {
        "TrainingJobName": "pipe-mode-dataset",
        "RoleArn": "arn:aws:iam::000000000000:role/bench",
        "AlgorithmSpecification": {"TrainingImage": TF_IMAGE, "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": '"bench.py"',
            "sagemaker_submit_directory": '"s3://code/bench/sourcedir.tar.gz"',
        },
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": "s3://out/bench"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 8},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--record-kib", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runner", default="sandbox")
    parser.add_argument("--envs-dir", type=Path, default=None)
    args = parser.parse_args()
    print(f"{load()} at start, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        home = Path(tmp) / "home"
        os.environ["TRAINPORT_HOME"] = str(home)
        if args.envs_dir:
            os.environ["TRAINPORT_ENVS_DIR"] = str(args.envs_dir.resolve())
        from trainport.config import load_settings
        from trainport.jobs.service import JobService

        counts = {
            kib: write_objects(home / "store", f"rec{kib}k", kib, args.size_mib, args.objects)
            for kib in args.record_kib
        }
        service = JobService(load_settings())
        body = job(home, args.record_kib, args.repeat + 1)
        body["HyperParameters"]["sizes"] = ",".join(map(str, args.record_kib))
        body["HyperParameters"]["rounds"] = str(args.repeat + 1)
        started = time.time()
        service.create(body, runner=args.runner)
        while (record := service.get("pipe-mode-dataset")).status not in (
            "Completed",
            "Failed",
            "Stopped",
        ):
            time.sleep(0.5)
        lines = [text for _, text in service.logs("pipe-mode-dataset")]
        if record.status != "Completed":
            raise SystemExit(
                f"job {record.status}: {record.failure_reason}\n" + "\n".join(lines[-30:])
            )
        rounds = [json.loads(t[len("ROUND ") :]) for t in lines if t.startswith("ROUND ")]
    print(f"job: {time.time() - started:.0f} s from submission to Completed")
    for kib in args.record_kib:
        mine = [r for r in rounds if r["kib"] == kib and r["round"] > 0]
        count = counts[kib]
        mib = count * (kib << 10) / (1 << 20)
        for r in mine:
            for name in ("PipeModeDataset", "TFRecordDataset"):
                if r[name][0] != count:
                    raise SystemExit(f"{name} read {r[name][0]} records, expected {count}")
        print(
            f"\n{count} records of {kib} KiB ({mib:.0f} MiB of payload) in {args.objects} "
            f"objects, median of {len(mine)} rounds"
        )
        head = ("reader", "records/s", "(min-max)", "MiB/s", "Pipe/disk", "(min-max)")
        print(f"{head[0]:<17}{head[1]:>11}{head[2]:>22}{head[3]:>8}{head[4]:>11}{head[5]:>14}")
        ratios = [r["TFRecordDataset"][1] / r["PipeModeDataset"][1] for r in mine]
        for name in ("PipeModeDataset", "TFRecordDataset"):
            seconds = [r[name][1] for r in mine]
            rates = [count / s for s in seconds]
            pipe = name == "PipeModeDataset"
            ratio = f"{statistics.median(ratios):.2f}x" if pipe else ""
            spread = f"({min(ratios):.2f}-{max(ratios):.2f})" if pipe else ""
            print(
                f"{name:<17}{statistics.median(rates):>11.0f}"
                f"{f'({min(rates):.0f}-{max(rates):.0f})':>22}"
                f"{mib / statistics.median(seconds):>8.0f}{ratio:>11}{spread:>14}"
            )
    print(f"{load()} at end")


if __name__ == "__main__":
    main()
