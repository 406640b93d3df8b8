"""Each host of a job gets its own share of the machine's GPUs.

The split is pure (:func:`share`); the job test plays a 4-GPU machine through the
supervisor's ``CUDA_VISIBLE_DEVICES`` (what a machine lends is read from there first), so it
runs without a GPU and checks what every rank of every host is told.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import put, wait_for
from tests.test_script_mode_job import script_job
from trainport.errors import ValidationError
from trainport.host.gpus import machine_gpus, parse_tag, share
from trainport.jobs.service import JobService

GPUS = ("0", "1", "2", "3")


def test_default_split_gives_each_host_its_own_gpus() -> None:
    assert [share(GPUS, 2, k, None).devices for k in range(2)] == [("0", "1"), ("2", "3")]
    assert [share(GPUS, 4, k, None).devices for k in range(4)] == [("0",), ("1",), ("2",), ("3",)]
    assert share(GPUS, 1, 0, None).devices == GPUS
    assert share(GPUS, 2, 0, None).note is None


def test_uneven_split_leaves_gpus_unused_and_says_so() -> None:
    three = ("0", "1", "2")
    assert [share(three, 2, k, None).devices for k in range(2)] == [("0",), ("1",)]
    assert share(three, 2, 0, None).note == "1 of 3 GPUs unused (2 hosts)"


def test_fewer_gpus_than_hosts_share_them_in_turn() -> None:
    assert [share(("0", "1"), 3, k, None).devices for k in range(3)] == [("0",), ("1",), ("0",)]
    note = share(("0",), 2, 1, None).note
    assert note is not None and "share 1 GPU" in note


def test_the_tag_sets_the_share() -> None:
    assert [share(GPUS, 2, k, parse_tag("1")).devices for k in range(2)] == [("0",), ("1",)]
    assert share(GPUS, 2, 1, parse_tag("all")).devices == GPUS
    cpu_only = share(GPUS, 2, 1, parse_tag("0"))
    assert cpu_only.devices == () and cpu_only.environment() == {"CUDA_VISIBLE_DEVICES": ""}
    over = share(GPUS, 3, 2, parse_tag("2"))
    assert over.devices == ("0", "1") and over.note is not None


def test_no_gpus_changes_nothing() -> None:
    assert share((), 2, 1, None).environment() == {}
    assert share((), 2, 1, parse_tag("2")).devices == ()


def test_bad_tag_values_are_refused() -> None:
    with pytest.raises(ValidationError, match="trainport:gpus-per-host='two'"):
        parse_tag("two")
    with pytest.raises(ValidationError, match="this machine has 4 GPUs"):
        share(GPUS, 2, 0, 5)


def test_machine_gpus_from_the_environment_or_dev(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidia10", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert machine_gpus({}, tmp_path) == ("0", "1", "10")
    assert machine_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, tmp_path) == ("2", "3")
    assert machine_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == ()


def test_a_bad_tag_is_refused_at_submission(home: Path, service: JobService) -> None:
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(home, "gpus-bad", {"p.py": "print(1)"}, "p.py")
    body["Tags"] = [{"Key": "trainport:gpus-per-host", "Value": "many"}]
    with pytest.raises(ValidationError, match="gpus-per-host"):
        service.create(body)


PROBE = """
import json, os
print("PROBE " + json.dumps({
    "host": os.environ["SM_CURRENT_HOST"],
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "sm_num_gpus": os.environ["SM_NUM_GPUS"],
    "local_world_size": os.environ.get("LOCAL_WORLD_SIZE"),
}), flush=True)
"""


def test_two_hosts_on_a_four_gpu_machine_split_the_gpus(
    home: Path, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each host sees 2 GPUs of its own; SM_NUM_GPUS and torchrun's process count follow."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(GPUS))
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(home, "gpus-split", {"probe.py": PROBE}, "probe.py")
    body["ResourceConfig"] = {
        "InstanceType": "ml.p3.8xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    body["Tags"] = [{"Key": "trainport:distribution", "Value": "torchrun"}]
    service.create(body, runner="process")
    record = wait_for(service, "gpus-split", timeout=180)
    assert record.status == "Completed", record.failure_reason
    seen: dict[str, list[dict[str, str]]] = {}
    for host in ("algo-1", "algo-2"):
        for _, text in service.logs("gpus-split", host=host):
            # Two ranks write to one log: lines may arrive joined.
            for raw in re.findall(r"PROBE (\{[^}]*\})", text):
                doc = json.loads(raw)
                seen.setdefault(doc["host"], []).append(doc)
    expected = {"algo-1": "0,1", "algo-2": "2,3"}
    assert sorted(seen) == ["algo-1", "algo-2"]
    for host, docs in seen.items():
        assert len(docs) == 2  # two ranks per host: one per GPU of its share
        for doc in docs:
            assert doc["visible"] == expected[host]
            assert doc["sm_num_gpus"] == "2"
            assert doc["local_world_size"] == "2"


def test_two_hosts_on_a_one_gpu_machine_share_it_and_the_status_says_so(
    home: Path, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(home, "gpus-shared", {"probe.py": PROBE}, "probe.py")
    body["ResourceConfig"] = {
        "InstanceType": "ml.p3.2xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    service.create(body, runner="process")
    record = wait_for(service, "gpus-shared", timeout=180)
    assert record.status == "Completed", record.failure_reason
    for host in ("algo-1", "algo-2"):
        (raw,) = [
            m
            for _, t in service.logs("gpus-shared", host=host)
            for m in re.findall(r"PROBE (\{[^}]*\})", t)
        ]
        doc = json.loads(raw)
        assert doc["visible"] == "0" and doc["sm_num_gpus"] == "1"
    assert any("2 hosts share 1 GPU" in t.message for t in record.transitions), record.transitions
