"""Horovod on TensorFlow with one Pipe channel per rank, through the SageMaker Python SDK's
own ``TensorFlow`` estimator against a real trainport server: 2 hosts x 2 ranks,
``distribution={"mpi": ...}``, no requirements.txt. The script is written as for
SageMaker's TensorFlow container: ``PipeModeDataset(channel=f"train_{hvd.rank()}")``."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.server.test_sagemaker_sdk import run_session, sdk_server  # noqa: F401
from tests.test_framework_tensorflow import _index_reachable, example
from trainport.data import encode_tfrecord

pytestmark = pytest.mark.slow

RANKS = 4
PER_RANK = 16

HOROVOD_SCRIPT = """
import hashlib, json, os
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from sagemaker_tensorflow import PipeModeDataset

hvd.init()

features = {"data": tf.io.FixedLenFeature([], tf.string),
            "labels": tf.io.FixedLenFeature([], tf.int64)}

def parse(record):
    parsed = tf.io.parse_single_example(record, features)
    return ({"data": tf.reshape(tf.io.decode_raw(parsed["data"], tf.float64), [4])},
            parsed["labels"])

# For Horovod and Pipe mode, use the input channel allocated to this worker.
channel_name = "train_{}".format(hvd.rank())

ds = PipeModeDataset(channel=channel_name, record_format="TFRecord")
ds = ds.map(parse)
ds = ds.batch(4)
ds = ds.prefetch(10)

tf.random.set_seed(100 + hvd.rank())  # different starts: the broadcast must align them
inputs = tf.keras.Input(shape=(4,), name="data", dtype=tf.float64)
model = tf.keras.Model(inputs, tf.keras.layers.Dense(2, dtype=tf.float64)(inputs))
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size())

@tf.function
def step(features, labels, first):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(features, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    if first:
        hvd.broadcast_variables(model.variables, root_rank=0)
    return loss

seen = []
first = True
for epoch in range(2):
    count = 0
    for features_, labels in ds:
        loss = step(features_, labels, first)
        first = False
        count += int(labels.shape[0])
    seen.append(count)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
print("RANK " + json.dumps({"rank": hvd.rank(), "size": hvd.size(),
                            "host": os.environ["SM_CURRENT_HOST"], "seen": seen,
                            "digest": digest, "loss": float(loss)}), flush=True)
if hvd.rank() == 0:
    model.save(os.path.join(os.environ["SM_MODEL_DIR"], "model.keras"))
"""

FIT = """
from sagemaker.inputs import TrainingInput
from sagemaker.tensorflow import TensorFlow

inputs = {}
for rank in range(RANKS):
    uri = session.upload_data(f"data/{rank}", bucket=session.default_bucket(),
                              key_prefix=f"hvd-tf/{rank}")
    inputs[f"train_{rank}"] = TrainingInput(uri, input_mode="Pipe")
estimator = TensorFlow(
    entry_point="train.py",
    source_dir="src",
    role=ROLE,
    framework_version="2.14.1",
    py_version="py310",
    instance_type="ml.c5.xlarge",
    instance_count=2,
    distribution={"mpi": {"enabled": True, "processes_per_host": 2}},
    sagemaker_session=session,
    max_run=3600,
)
estimator.fit(inputs, logs="All")
print("JOB", estimator.latest_training_job.name, flush=True)
"""


@pytest.mark.timeout(3300)  # the first TensorFlow job builds its environment, Horovod included
def test_horovod_tensorflow_with_a_pipe_channel_per_rank_through_the_sdk(
    tf_envs: Path,
    sdk_server: Any,  # noqa: F811
    moto_endpoint: str,
    tmp_path: Path,
) -> None:
    require(
        shutil.which("mpirun") is not None, "OpenMPI is not installed (apt-get install openmpi-bin)"
    )
    require(_index_reachable(), "the package index cannot be reached")
    workdir = tmp_path / "work"
    (workdir / "src").mkdir(parents=True)
    (workdir / "src" / "train.py").write_text(HOROVOD_SCRIPT)
    for rank in range(RANKS):
        folder = workdir / "data" / str(rank)
        folder.mkdir(parents=True)
        records = [
            encode_tfrecord(example(struct.pack("<4d", rank, i % 3, 1.0, i % 2), i % 2))
            for i in range(PER_RANK)
        ]
        (folder / "part-0.tfrecord").write_bytes(b"".join(records))
    done = run_session(sdk_server, moto_endpoint, workdir, f"RANKS = {RANKS}\n" + FIT, timeout=3000)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
    assert "\nJOB " in done.stdout, done.stdout[-4000:]
    reports = sorted(
        (json.loads(raw) for raw in set(re.findall(r"RANK (\{.*\})", done.stdout))),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in reports] == list(range(RANKS)), done.stdout[-4000:]
    assert {r["size"] for r in reports} == {RANKS}
    # Two ranks on each host, rank r on host r // 2 (mpirun's by-slot map).
    assert [r["host"] for r in reports] == ["algo-1", "algo-1", "algo-2", "algo-2"]
    # Each rank read its own channel, whole, in both epochs.
    assert all(r["seen"] == [PER_RANK, PER_RANK] for r in reports)
    # Broadcast from rank 0, then averaged gradients: every rank ends with one model.
    assert len({r["digest"] for r in reports}) == 1
