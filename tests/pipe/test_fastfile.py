"""FastFile mode: a lazily fetched FUSE view (only the opened object is read, seeks read by
range), a FastFile job, and the File-mode fallback where FUSE cannot mount."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import put, python_job, require, wait_for
from tests.pipe.conftest import CountingStore, require_fuse
from trainport.config import load_settings
from trainport.host import fastfile
from trainport.host.agent import HostAgent, HostPlan
from trainport.host.channels import resolve_channel
from trainport.host.events import HostEvent, StatusChanged
from trainport.jobs.service import JobService
from trainport.jobs.status import Phase
from trainport.runners.process import ProcessRunner
from trainport.runners.sandbox import sandbox_problem
from trainport.spec import ChannelSpec, parse_request


def fastfile_channel(uri: str = "s3://data/ff/") -> ChannelSpec:
    return ChannelSpec("ff", "S3Prefix", uri, "FullyReplicated", "FastFile")


def test_reading_one_file_fetches_only_that_object(tmp_path: Path) -> None:
    require_fuse()
    store = CountingStore(tmp_path / "store")
    big = os.urandom(5 << 20)
    for key, data in {"ff/a.bin": big, "ff/sub/b.bin": b"bee", "ff/c.bin": b"sea"}.items():
        path = tmp_path / "store" / "data" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    objects = resolve_channel(store, fastfile_channel())
    mount = fastfile.mount_channel(store, objects, tmp_path / "view", label="channel ff")
    try:
        view = tmp_path / "view"
        assert sorted(os.listdir(view)) == ["a.bin", "c.bin", "sub"]
        assert (view / "a.bin").stat().st_size == len(big)
        assert sum(store.reads.values()) == 0  # listing and stat fetch nothing
        # Read in another process, as training code would.
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; print(open(sys.argv[1],'rb').read().decode())",
                str(view / "sub" / "b.bin"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == "bee"
        assert dict(store.reads) == {"ff/sub/b.bin": 1}, store.ranges
        # A seek reads by range: one small ranged read at the offset, not the object.
        before = len(store.ranges)
        offset = 3 << 20
        with open(view / "a.bin", "rb", buffering=0) as f:
            f.seek(offset)
            assert f.read(100) == big[offset : offset + 100]
        ranges = [r for r in store.ranges[before:] if r[0] == "ff/a.bin"]
        assert ranges and all(start >= offset - (128 << 10) for _, start, _ in ranges)
        assert sum(end - start for _, start, end in ranges) <= 2 << 20
        # Whole-file read is byte exact, in a handful of growing blocks.
        before = len(store.ranges)
        assert (view / "a.bin").read_bytes() == big
        assert len(store.ranges) - before <= 8
        with pytest.raises(OSError), open(view / "c.bin", "wb"):
            pass  # read-only
    finally:
        mount.close()
    assert not os.path.ismount(tmp_path / "view")
    # libfuse's teardown resets SIGPIPE to "terminate"; the mount puts "ignore" back.
    sig_ign = next(
        ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("SigIgn:")
    )
    assert int(sig_ign.split()[1], 16) & (1 << (signal.SIGPIPE - 1))


_READ_FASTFILE = r"""
import hashlib, json, os
base = os.environ["SAGEMAKER_BASE_DIR"]
root = f"{base}/input/data/ff"
found = {}
for dirpath, _, names in os.walk(root):
    for n in names:
        p = os.path.join(dirpath, n)
        found[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
print("FOUND", json.dumps(found, sort_keys=True))
"""


def ff_request(name: str, runner: str = "process") -> dict[str, object]:
    return python_job(
        name,
        _READ_FASTFILE.replace('os.environ["SAGEMAKER_BASE_DIR"]', '"/opt/ml"')
        if runner == "sandbox"
        else _READ_FASTFILE,
        InputDataConfig=[
            {
                "ChannelName": "ff",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/ff/"}
                },
                "InputMode": "FastFile",
            }
        ],
        Tags=[{"Key": "trainport:runner", "Value": runner}],
    )


def expected_hashes(files: dict[str, bytes]) -> str:
    import hashlib
    import json

    return json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in files.items()}, sort_keys=True)


FILES = {"a.bin": b"alpha" * 1000, "d/b.bin": b"beta"}


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_fastfile_job_reads_the_channel(home: Path, service: JobService, runner: str) -> None:
    require_fuse()
    if runner == "sandbox":
        require(sandbox_problem() is None, f"sandbox unavailable: {sandbox_problem()}")
    for key, data in FILES.items():
        put(home, "data", f"ff/{key}", data)
    service.create(ff_request("ff-job", runner))
    record = wait_for(service, "ff-job")
    log = (home / "jobs" / "ff-job" / "logs" / "algo-1.log").read_text()
    assert record.status == "Completed", (record.failure_reason, log)
    assert f"FOUND {expected_hashes(FILES)}" in log
    assert not any("FastFile unavailable" in t.message for t in record.transitions)
    channel_dir = home / "jobs" / "ff-job" / "hosts" / "algo-1" / "input" / "data" / "ff"
    assert not os.path.ismount(channel_dir)  # unmounted after training


def test_without_fuse_the_channel_falls_back_to_file_mode(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, data in FILES.items():
        put(home, "data", f"ff/{key}", data)
    monkeypatch.setattr(fastfile, "fuse_problem", lambda: "no /dev/fuse here (test)")
    settings = load_settings()
    spec = parse_request(ff_request("ff-fallback"))
    events: list[HostEvent] = []
    plan = HostPlan(spec, "arn:test", "algo-1", ("algo-1",), settings.jobs_dir / spec.name)
    agent = HostAgent(
        plan,
        store=CountingStore(settings.store_root),
        runner=ProcessRunner(),
        settings=settings,
        report=events.append,
    )
    finished = agent.run()
    assert finished.exit_code == 0, finished
    log = plan.log_path.read_text()
    assert f"FOUND {expected_hashes(FILES)}" in log
    messages = [
        e.change.message
        for e in events
        if isinstance(e, StatusChanged) and isinstance(e.change, Phase)
    ]
    note = "FastFile unavailable (no /dev/fuse here (test)); channel ff staged in File mode"
    assert note in messages
    assert any(m.startswith("Training in progress") and note in m for m in messages)
