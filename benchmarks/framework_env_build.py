"""A framework image's environment: its first build beside the cached start, in one run.

Runs the same script-mode job (named by the SKLearn 1.2-1 image URI, or with
``--framework tensorflow`` the TensorFlow 2.14.1 one; no requirements.txt) ``--repeat`` + 1
times in one fresh TRAINPORT_HOME: the first job builds the environment from the package
index, the others reuse it. Beside them, the same script's job with a PyTorch image (no
layer: trainport's own interpreter), minus the framework's imports, is the floor. Prints,
for each, the submit-to-Completed time and the time from submission to the script's first
line (read from the job's log), the first build's ratio to the cached start, and the size
of the built environment.

    python benchmarks/framework_env_build.py --repeat 5 [--runner sandbox] [--framework sklearn]
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

SKLEARN_IMAGE = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"
TF_IMAGE = "763104351884.dkr.ecr.us-west-2.amazonaws.com/tensorflow-training:2.14.1-cpu-py310"
# The image, its label in the table, and what the script imports from its environment.
FRAMEWORKS = {
    "sklearn": (SKLEARN_IMAGE, "sklearn 1.2-1", "import joblib, numpy, pandas, scipy, sklearn"),
    "tensorflow": (
        TF_IMAGE,
        "tensorflow 2.14.1",
        "import tensorflow, horovod.tensorflow\nfrom sagemaker_tensorflow import PipeModeDataset",
    ),
}
PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-cpu-py311"
SCRIPT = """\
import time
print("FIRST %.6f" % time.time(), flush=True)
{imports}
print("DONE", flush=True)
"""


def run_job(service, home: Path, name: str, image: str, imports: str, runner: str) -> dict:  # type: ignore[no-untyped-def]
    from trainport.host.script_mode import pack_sourcedir

    src = home.parent / f"src-{name}"
    src.mkdir()
    (src / "train.py").write_text(SCRIPT.format(imports=imports))
    target = home / "store" / "code" / name / "sourcedir.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(pack_sourcedir(src, "train.py"))
    body = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/bench",
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": f'"s3://code/{name}/sourcedir.tar.gz"',
        },
        "OutputDataConfig": {"S3OutputPath": "s3://out/bench"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 1800},
    }
    start = time.time()
    service.create(body, runner=runner)
    while (record := service.get(name)).status not in ("Completed", "Failed", "Stopped"):
        time.sleep(0.05)
    total = time.time() - start
    if record.status != "Completed":
        raise SystemExit(f"{name}: {record.status}: {record.failure_reason}")
    first = next(
        float(text.split()[1]) for _, text in service.logs(name) if text.startswith("FIRST ")
    )
    return {"total": total, "first_line": first - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runner", default="sandbox")
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="sklearn")
    args = parser.parse_args()
    image, label, imports = FRAMEWORKS[args.framework]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load} at start, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        home = Path(tmp) / "home"
        os.environ["TRAINPORT_HOME"] = str(home)
        from trainport.config import load_settings
        from trainport.jobs.service import JobService

        service = JobService(load_settings())
        first = run_job(service, home, "build", image, imports, args.runner)
        cached, floor = [], []
        for i in range(args.repeat):  # interleaved: drift hits both columns alike
            cached.append(run_job(service, home, f"cached-{i}", image, imports, args.runner))
            floor.append(run_job(service, home, f"floor-{i}", PYTORCH_IMAGE, "", args.runner))
        files = (f for f in (home / "envs").rglob("*") if f.is_file() and not f.is_symlink())
        built = sum(f.stat().st_size for f in files)

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    rows = [
        (f"first build ({label})", first["first_line"], first["total"]),
        (f"cached start ({label})", median(cached, "first_line"), median(cached, "total")),
        ("no layer (PyTorch image)", median(floor, "first_line"), median(floor, "total")),
    ]
    print(f"Python {sys.version.split()[0]}, runner {args.runner}, medians of {args.repeat}")
    print(f"{'job':32} {'submit -> first line':>22} {'submit -> Completed':>20}")
    for label, line, total in rows:
        print(f"{label:32} {line:>20.2f} s {total:>18.2f} s")
    ratio = first["total"] / median(cached, "total")
    print(f"first build / cached start (whole job): {ratio:.1f}x")
    over = median(cached, "first_line") - median(floor, "first_line")
    print(f"cached start over no layer (to the first line): {over * 1000:+.0f} ms")
    print(f"environment on disk: {built / (1 << 20):.0f} MiB")
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at end")
    print(json.dumps({"first": first, "cached": cached, "floor": floor}))


if __name__ == "__main__":
    main()
