"""``trainport demo``: a real PyTorch job on a generated dataset, on the embedded default.

It writes a two-class "two moons" style dataset as CSV into the embedded store (or the
configured S3 endpoint), submits a script-mode job through the jobs service exactly as
``trainport run --entry-point`` would, streams its logs, and prints status, final metrics
and where the model artifact is.
"""

from __future__ import annotations

import importlib.util
import io
import math
import random
import sys
import time
from pathlib import Path

from trainport.config import load_settings
from trainport.errors import ValidationError

__all__ = ["make_dataset", "run_demo"]

BUCKET = "trainport-demo"


def make_dataset(rows: int, seed: int) -> bytes:
    """Two interleaved half circles with noise, as CSV rows ``x1,x2,label``."""
    rng = random.Random(seed)
    out = io.StringIO()
    for i in range(rows):
        label = i % 2
        angle = rng.uniform(0, math.pi)
        x = math.cos(angle) + (1.0 if label else 0.0) + rng.gauss(0, 0.15)
        y = math.sin(angle) * (-1 if label else 1) + (0.5 if label else 0.0) + rng.gauss(0, 0.15)
        out.write(f"{x:.5f},{y:.5f},{label}\n")
    return out.getvalue().encode()


def run_demo(*, epochs: int = 5, runner: str | None = None) -> int:
    from trainport.follow import follow_job, summary
    from trainport.jobfile import build_request
    from trainport.jobs.service import JobService

    _require_torch(runner or load_settings().runner)
    service = JobService()
    store = service.store
    for part in range(4):
        store.put_bytes(BUCKET, f"data/train/part-{part}.csv", make_dataset(1000, seed=part))
    store.put_bytes(BUCKET, "data/validation/part-0.csv", make_dataset(1000, seed=99))
    request = build_request(
        None,
        name=f"demo-{time.strftime('%Y%m%d-%H%M%S')}",
        entry_point=str(Path(__file__).with_name("train.py")),
        source_dir=None,
        image=None,
        hps=(f"epochs={epochs}", "lr=0.05", "hidden=32"),
        channels=(f"train=s3://{BUCKET}/data/train/", f"validation=s3://{BUCKET}/data/validation/"),
        output=f"s3://{BUCKET}/output",
        metrics=("train_loss=train_loss=([0-9.]+)", "val_accuracy=val_accuracy=([0-9.]+)"),
        env=(),
        checkpoint=None,
        max_run=600,
        stop_grace=None,
        store=store,
    )
    service.create(request, runner=runner)
    record = follow_job(service, request["TrainingJobName"])
    print(summary(record))
    return 0 if record.status == "Completed" else 1


def _require_torch(runner: str) -> None:
    """Refuse the demo before anything is stored or submitted when its job could not import
    torch, naming what to install (instead of a ModuleNotFoundError inside the job's log).

    A script-mode job runs with the interpreter that submits it, except on the ray runner,
    whose hosts use their Ray nodes' interpreter; that one cannot be asked from here.
    """
    if runner == "ray" or importlib.util.find_spec("torch") is not None:
        return
    raise ValidationError(
        f"the demo trains a PyTorch model, and torch is not installed for {sys.executable}, "
        "the interpreter its job runs with; install it with: pip install 'trainport[torch]'"
    )
