"""The TensorFlow framework environment: a job named only by a TensorFlow 2.14 image URI,
with no requirements.txt, gets TensorFlow of that release, PipeModeDataset and Horovod,
and a PipeModeDataset script written for SageMaker's container runs unchanged over a
TFRecord Pipe channel."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.conftest import put, require, wait_for
from tests.test_framework_envs import failed_layer_message
from tests.test_script_mode_job import script_job
from trainport.data import encode_tfrecord
from trainport.host import envbuild, framework_envs
from trainport.host.frameworks import parse_image_uri
from trainport.jobs.service import JobService

TF_IMAGE = (
    "763104351884.dkr.ecr.us-west-2.amazonaws.com/"
    "tensorflow-training:2.14.1-cpu-py310-ubuntu20.04-sagemaker"
)
RECORDS = 48
BATCH = 8


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def example(data: bytes, label: int) -> bytes:
    """A ``tf.train.Example`` with a bytes feature ``data`` and an int64 feature
    ``labels``, encoded by hand (the test process has no TensorFlow)."""
    data_feature = _field(1, _field(1, data))  # Feature.bytes_list.value
    label_feature = _field(3, _field(1, _varint(label)))  # Feature.int64_list.value, packed
    features = _field(1, _field(1, b"data") + _field(2, data_feature))
    features += _field(1, _field(1, b"labels") + _field(2, label_feature))
    return _field(1, features)  # Example.features


def tfrecord_objects(home: Path, bucket: str, prefix: str, count: int, *, seed: int = 0) -> None:
    """``count`` Examples of four float64 values each, in two TFRecord objects."""
    for part in range(2):
        records = []
        for i in range(part, count, 2):
            values = [float((i + seed) % 5), float(i % 3), 1.0, float(i % 2)]
            records.append(encode_tfrecord(example(struct.pack("<4d", *values), i % 2)))
        put(home, bucket, f"{prefix}part-{part}.tfrecord", b"".join(records))


# The reference Pipe-mode example's loop as a script for the TensorFlow container writes it:
# PipeModeDataset over the channel, parse, batch, two epochs of training.
PIPE_SCRIPT = """
import json, os, sys
import tensorflow as tf
from sagemaker_tensorflow import PipeModeDataset

features = {"data": tf.io.FixedLenFeature([], tf.string),
            "labels": tf.io.FixedLenFeature([], tf.int64)}

def parse(record):
    parsed = tf.io.parse_single_example(record, features)
    data = tf.reshape(tf.io.decode_raw(parsed["data"], tf.float64), [4])
    return {"data": data}, parsed["labels"]

ds = PipeModeDataset(channel="train", record_format="TFRecord")
ds = ds.map(parse)
ds = ds.batch(8)
ds = ds.prefetch(2)

inputs = tf.keras.Input(shape=(4,), name="data", dtype=tf.float64)
model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))
model.compile(optimizer="sgd",
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

class Count(tf.keras.callbacks.Callback):
    batches = []
    def on_epoch_begin(self, epoch, logs=None):
        self.batches.append(0)
    def on_train_batch_end(self, batch, logs=None):
        self.batches[-1] += 1

history = model.fit(ds, epochs=2, callbacks=[Count()], verbose=0)
model.save(os.path.join(os.environ["SM_MODEL_DIR"], "model.keras"))
import numpy, sagemaker_tensorflow
print("TFJOB " + json.dumps({
    "tensorflow": tf.__version__, "numpy": numpy.__version__,
    "python": list(sys.version_info[:2]), "batches": Count.batches,
    "loss": history.history["loss"],
    "pipe_mode_dataset": sagemaker_tensorflow.__file__,
}), flush=True)
"""


def test_the_tensorflow_image_layers_its_release_pipe_mode_dataset_and_horovod() -> None:
    image = parse_image_uri(TF_IMAGE)
    assert image is not None and (image.version, image.python) == ("2.14.1", "3.10")
    env = framework_envs.environment_for(image, torch=None, python="3.11")
    assert env is not None
    assert env.requirements[:3] == ("tensorflow-cpu==2.14.1.*", "numpy<2", "pandas")
    # The index has PipeModeDataset 2.14 for the image's Python 3.10 only: its wheel for
    # that Python goes in as it is; on a job Python of 3.10 it is a plain requirement.
    assert env.requirements[3] == "# trainport: for-python 3.10 sagemaker-tensorflow==2.14.*"
    same = framework_envs.environment_for(image, torch=None, python="3.10")
    assert same is not None and same.requirements[3] == "sagemaker-tensorflow==2.14.*"
    steps = envbuild.layer_steps("\n".join(env.requirements))
    assert steps[0] == (
        "for-python",
        {},
        ["--no-deps", "--only-binary=:all:", "--python-version", "3.10",
         "sagemaker-tensorflow==2.14.*"],
    )  # fmt: skip
    kind, variables, args = steps[1]
    assert kind == "compile"
    assert args == ["--no-build-isolation", "--ignore-installed", "horovod==0.28.1"]
    assert variables["HOROVOD_WITH_TENSORFLOW"] == "1"
    assert variables["HOROVOD_WITHOUT_PYTORCH"] == "1"


def test_a_layer_step_trainport_does_not_know_stops_the_build() -> None:
    with pytest.raises(SystemExit, match="unknown layer step: # trainport: fetch x"):
        envbuild.layer_steps("numpy\n# trainport: fetch x\n")
    # Plain comments are pip's.
    assert envbuild.layer_steps("# pinned for the cluster\nnumpy\n") == []


def _index_reachable() -> bool:
    return framework_envs.available_versions("tensorflow-cpu") is not None


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first TensorFlow job builds its environment, Horovod included
def test_a_pipe_mode_dataset_script_runs_on_the_tensorflow_image_without_requirements(
    home: Path, tf_envs: Path, service: JobService
) -> None:
    require(_index_reachable(), "the package index cannot be reached")
    tfrecord_objects(home, "data", "train/", RECORDS)
    body = script_job(home, "tf-pipe", {"train.py": PIPE_SCRIPT}, "train.py")
    body["AlgorithmSpecification"] = {"TrainingImage": TF_IMAGE, "TrainingInputMode": "Pipe"}
    body["StoppingCondition"] = {"MaxRuntimeInSeconds": 1800}
    service.create(body)
    record = wait_for(service, "tf-pipe", timeout=1800)
    logs = [text for _, text in service.logs("tf-pipe")]
    assert record.status == "Completed", (record.failure_reason, logs[-40:])
    (line,) = [t for t in logs if t.startswith("TFJOB ")]
    report = json.loads(line[len("TFJOB ") :])
    assert report["tensorflow"].startswith("2.14.")
    assert report["numpy"].startswith("1.")
    # Both epochs read every record (the FIFOs train_0, then train_1).
    assert report["batches"] == [RECORDS // BATCH, RECORDS // BATCH]
    assert len(report["loss"]) == 2
    # The real PipeModeDataset, from the layer, not a stand-in.
    assert report["pipe_mode_dataset"].startswith(str(tf_envs))
    # The job's Python is not the image's: the status said so.
    said = " ".join(t.message for t in record.transitions)
    assert "ships Python 3.10; this job runs Python 3.11" in said


def test_a_sources_requirements_txt_gets_no_layer_steps(tmp_path: Path) -> None:
    from trainport.host import script_mode

    code = tmp_path / "code"
    code.mkdir()
    # Were it read as a step, this line would stop the build (unknown step).
    (code / "requirements.txt").write_text("# trainport: fetch x\n")
    said: list[str] = []
    python = script_mode.prepare_python(code, tmp_path / "envs", log=said.append)
    assert Path(python).exists()
    assert not [line for line in said if "layer step" in line]


def test_a_layer_that_compiles_and_fails_names_the_tools_it_needs(tmp_path: Path) -> None:
    step = "# trainport: compile HOROVOD_WITH_TENSORFLOW=1 trainport-no-such==1.0"
    message = failed_layer_message(tmp_path, step)
    assert "install cmake, g++ and OpenMPI's development files" in message
    assert "trainport-no-such==1.0" in message
