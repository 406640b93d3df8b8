"""Who runs what: hostile jobs against the root sandbox's boundary (runc, as root).

Each test is an attack a user with API keys can make with jobs of their own: a PATH of
fake launchers, a requirements package whose build writes outside, kernel settings and
setuid files through uid 0, an /etc key file, more memory or processes than the instance
has. Each proves a refusal, or that the attack's effect stayed inside.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import put, python_job, request, require, wait_for
from trainport.jobs.service import JobService
from trainport.runners import sandbox as sandbox_module
from trainport.runners.limits import JOB_UID_BASE


@pytest.fixture(autouse=True)
def runc_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    require(os.geteuid() == 0, "the root sandbox's boundary needs root")
    monkeypatch.delenv("TRAINPORT_SANDBOX", raising=False)
    problem = sandbox_module.sandbox_problem()
    require(problem is None, f"no sandbox here: {problem}")


def sandboxed(name: str, code: str, **overrides: object) -> dict[str, object]:
    tags = [{"Key": "trainport:runner", "Value": "sandbox"}]
    tags += overrides.pop("extra_tags", [])  # type: ignore[operator]
    return python_job(name, code, Tags=tags, **overrides)


def lines(service: JobService, name: str) -> list[str]:
    return [line for _, line in service.logs(name)]


FAKE_TOOL = """#!/bin/sh
echo "$0 ran as $(id -u)" >> {marker}
exec /usr/bin/false
"""


def test_a_path_of_fake_launchers_runs_nothing_outside(tmp_path: Path, service: JobService) -> None:
    """The request's PATH names a folder of the attacker's programs, named as every tool
    trainport might start outside the sandbox: none of them runs."""
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    marker = tmp_path / "ran-outside"
    for tool in ("runc", "tini", "bwrap", "unshare", "ip", "nsenter", "setpriv", "sh",
                 "mount", "pip", "python3"):  # fmt: skip
        path = fakes / tool
        path.write_text(FAKE_TOOL.format(marker=marker))
        path.chmod(0o755)
    body = sandboxed(
        "fake-path",
        "import os; print('path', os.environ['PATH'])",
        Environment={"PATH": f"{fakes}:/usr/bin:/bin"},
    )
    body["AlgorithmSpecification"]["ContainerEntrypoint"][0] = "/usr/bin/env"
    body["AlgorithmSpecification"]["ContainerEntrypoint"].insert(1, "python3")
    service.create(body)
    record = wait_for(service, "fake-path")
    assert not marker.exists(), marker.read_text()
    # Inside, the request's PATH is the job's own business: its fake python3 is not
    # visible there (the folder is not shown), so the job fails on its own terms.
    assert record.status in ("Completed", "Failed")


BACKEND = """
import base64, hashlib, os, zipfile

def _attack():
    try:
        with open({target!r}, "w") as f:
            f.write("pwned")
        wrote = "wrote outside"
    except OSError as exc:
        wrote = "refused " + type(exc).__name__
    try:
        uid_map = open("/proc/self/uid_map").read().split()
    except OSError:
        uid_map = []
    return wrote, uid_map

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wrote, uid_map = _attack()
    name = "evil_pkg-1.0-py3-none-any.whl"
    files = {{
        "evil_pkg/__init__.py": f"WROTE = {{wrote!r}}\\nUID_MAP = {{uid_map!r}}\\n",
        "evil_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: evil-pkg\\nVersion: 1.0\\n",
        "evil_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: x\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, text in files.items():
            data = text.encode()
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{{path}},sha256={{digest.decode()}},{{len(data)}}")
        record.append("evil_pkg-1.0.dist-info/RECORD,,")
        z.writestr("evil_pkg-1.0.dist-info/RECORD", "\\n".join(record) + "\\n")
    return name
"""

PYPROJECT = """
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "evil-pkg"
version = "1.0"
"""


def _sourcedir_tar(files: dict[str, str]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_requirements_package_builds_inside_the_sandbox(
    tmp_path: Path, home: Path, service: JobService
) -> None:
    """``./pkg`` in requirements.txt runs its build backend: as the job, where a host path
    does not exist and uid 0 is not the machine's root."""
    # Outside /tmp (which is the sandbox's own): a folder of the machine's.
    target = Path("/var/tmp") / f"trainport-build-{os.getpid()}"
    tar = _sourcedir_tar(
        {
            "train.py": "import evil_pkg; print('wrote', evil_pkg.WROTE); "
            "print('uid_map', evil_pkg.UID_MAP)",
            "requirements.txt": "./pkg\n",
            "pkg/pyproject.toml": PYPROJECT,
            "pkg/backend.py": BACKEND.format(target=str(target)),
        }
    )
    put(home, "code", "evil/sourcedir.tar.gz", tar)
    body = request(
        "evil-requirements",
        AlgorithmSpecification={
            "TrainingInputMode": "File",
            "TrainingImage": "trainport/python",
        },
        HyperParameters={
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": '"s3://code/evil/sourcedir.tar.gz"',
        },
        Tags=[{"Key": "trainport:runner", "Value": "sandbox"}],
    )
    service.create(body)
    record = wait_for(service, "evil-requirements", timeout=300)
    out = lines(service, "evil-requirements")
    assert record.status == "Completed", (record.failure_reason, out[-30:])
    assert not target.exists()
    assert "wrote refused FileNotFoundError" in out or "wrote refused PermissionError" in out
    uid_map = next(line for line in out if line.startswith("uid_map"))
    inside, outside = json.loads(uid_map.split(" ", 1)[1].replace("'", '"'))[:2]
    assert inside == "0" and int(outside) >= JOB_UID_BASE  # root inside, not outside


ROOT_ATTACKS = """
import os, shutil, socket
# A kernel setting written back with its own value: harmless, unless it is allowed at all.
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/swappiness"):
    try:
        value = open(path).read()
        with open(path, "w") as f:
            f.write(value)
        print("WROTE", path)
    except OSError as exc:
        print("refused", path, type(exc).__name__)
try:
    socket.sethostname("taken-over")
    print("WROTE hostname")
except OSError as exc:
    print("refused hostname", type(exc).__name__)
print("hostname", socket.gethostname())
# A user namespace of its own, where it would hold every capability again.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:
    print("WROTE a new user namespace")
else:
    print("refused unshare", ctypes.get_errno())
# A setuid copy of a shell for a local user to run later.
shutil.copy("/usr/bin/id", "/opt/ml/model/suid-id")
os.chmod("/opt/ml/model/suid-id", 0o4755)
print("uid", os.getuid(), "mode", oct(os.stat("/opt/ml/model/suid-id").st_mode))
"""


def test_uid_0_inside_is_not_the_machines_root(home: Path, service: JobService) -> None:
    before = {p: Path(p).read_text() for p in ("/proc/sys/kernel/core_pattern",)}
    service.create(sandboxed("root-attacks", ROOT_ATTACKS))
    record = wait_for(service, "root-attacks")
    out = lines(service, "root-attacks")
    assert record.status == "Completed", (record.failure_reason, out)
    assert not [line for line in out if line.startswith("WROTE")], out
    assert "hostname algo-1" in out and "refused unshare 1" in out
    assert "uid 0 mode 0o104755" in out  # it believes it is root with a setuid file...
    assert (
        Path("/proc/sys/kernel/core_pattern").read_text() == before["/proc/sys/kernel/core_pattern"]
    )
    # ... which on the machine belongs to the job's own unprivileged uid, in a tree no
    # other local user can enter.
    tree = home / "jobs" / "root-attacks" / "hosts" / "algo-1"
    copy = tree / "model" / "suid-id"
    if copy.exists():  # hosts' trees are kept until the job is removed
        assert copy.stat().st_uid >= JOB_UID_BASE
        assert stat.S_IMODE(tree.stat().st_mode) == 0o700
        assert tree.stat().st_uid == copy.stat().st_uid


ETC_SECRET = Path("/etc/trainport-test-secret.key")


def test_a_root_only_file_in_etc_is_not_inside(service: JobService) -> None:
    ETC_SECRET.write_text("secret-under-etc")
    ETC_SECRET.chmod(0o600)
    try:
        code = (
            f"import os\nprint('exists', os.path.exists({str(ETC_SECRET)!r}))\n"
            "print('passwd', open('/etc/passwd').read().split(':')[0])\n"
            "print('shadow', os.path.exists('/etc/shadow'))\n"
            "print('init env', sorted(k for k in os.environ if k.startswith('TINI')))\n"
        )
        service.create(sandboxed("etc-secret", code))
        record = wait_for(service, "etc-secret")
    finally:
        ETC_SECRET.unlink()
    out = lines(service, "etc-secret")
    assert record.status == "Completed", (record.failure_reason, out)
    assert "exists False" in out and "shadow False" in out and "passwd root" in out
    assert "init env []" in out  # the init's settings are not the job's


HOG = """
import sys
chunks = []
for i in range(int(sys.argv[1])):
    chunks.append(bytearray(64 << 20))  # touched: bytearray zero-fills
    print("MiB", (i + 1) * 64, flush=True)
"""

SMALL = json.dumps({"ml.m4.xlarge": {"cpus": 1, "memory_gib": 0.25}})


@pytest.fixture
def small_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """ml.m4.xlarge sized by the operator as 1 CPU and 0.25 GiB, for cheap limit tests."""
    monkeypatch.setenv("TRAINPORT_RAY_INSTANCE_TYPES", SMALL)


def on_small(name: str, code: str, *args: str, **overrides: object) -> dict[str, object]:
    """A sandboxed job on the small instance, its script given ``args``."""
    body = sandboxed(
        name,
        code,
        ResourceConfig={"InstanceType": "ml.m4.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
        **overrides,
    )
    body["AlgorithmSpecification"]["ContainerEntrypoint"].extend(args)  # type: ignore[index]
    return body


@pytest.mark.usefixtures("small_instance")
def test_a_job_over_its_instance_memory_fails_naming_the_limit(service: JobService) -> None:
    body = on_small("hog", HOG, "16")  # 1 GiB
    service.create(body)
    record = wait_for(service, "hog")
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert reason.startswith("OutOfMemoryError"), reason
    assert "ml.m4.xlarge" in reason and "0.25 GiB" in reason


@pytest.mark.usefixtures("small_instance")
def test_the_machine_tag_lifts_the_limits(service: JobService) -> None:
    body = on_small(
        "hog-machine", HOG, "8", extra_tags=[{"Key": "trainport:resources", "Value": "machine"}]
    )  # 512 MiB
    service.create(body)
    record = wait_for(service, "hog-machine")
    assert record.status == "Completed", record.failure_reason


SHM_HOG = """
import os
try:
    with open("/dev/shm/fill", "wb") as f:
        for i in range(16):
            f.write(b"x" * (64 << 20))
            f.flush()
    print("filled")
except OSError as exc:
    print("refused", type(exc).__name__, exc.errno)
"""


@pytest.mark.usefixtures("small_instance")
def test_dev_shm_counts_against_the_instance_memory(service: JobService) -> None:
    body = on_small("shm-hog", SHM_HOG)
    service.create(body)
    record = wait_for(service, "shm-hog")
    out = lines(service, "shm-hog")
    assert "filled" not in out, out
    assert (record.status == "Completed" and "refused OSError 28" in out) or (
        (record.failure_reason or "").startswith("OutOfMemoryError")
    ), (record.failure_reason, out)


FORKS = """
import subprocess, sys
started = []
try:
    for i in range(3000):
        started.append(subprocess.Popen(["sleep", "60"]))
except OSError as exc:
    print("refused after", len(started), type(exc).__name__)
else:
    print("started", len(started))
for p in started:
    p.kill()
"""


@pytest.mark.usefixtures("small_instance")
def test_a_job_cannot_start_more_processes_than_its_instance_allows(service: JobService) -> None:
    body = on_small("forks", FORKS)
    service.create(body)
    record = wait_for(service, "forks", timeout=300)
    out = lines(service, "forks")
    assert record.status == "Completed", (record.failure_reason, out[-5:])
    refused = [line for line in out if line.startswith("refused after")]
    assert refused and int(refused[0].split()[2]) <= 1024, out[-5:]


def test_reconcile_removes_a_killed_supervisors_sandbox(home: Path, service: JobService) -> None:
    """A supervisor killed mid-job leaves its runc container running; the next look at
    jobs ends the job and removes the container, its state and its bundle."""
    import signal

    from tests.conftest import wait_until

    service.create(
        sandboxed("runc-orphan", "import time; print('ready', flush=True); time.sleep(300)")
    )
    wait_until(lambda: any("ready" in line for line in lines(service, "runc-orphan")), what="ready")
    root = home / "jobs" / "runc-orphan" / "hosts" / "algo-1"
    prefix = sandbox_module._container_prefix(root)

    def containers() -> list[str]:
        state = Path(sandbox_module.RUNC_STATE)
        return [e for e in os.listdir(state) if e.startswith(prefix)] if state.is_dir() else []

    assert len(containers()) == 1
    supervisor = service.get("runc-orphan").supervisor
    assert supervisor is not None
    os.kill(supervisor[0], signal.SIGKILL)
    wait_until(lambda: service.get("runc-orphan").status == "Failed", what="reconcile")
    assert containers() == []
    bundles = Path(sandbox_module.RUNC_STATE) / "bundles"
    assert not list(bundles.glob(f"{prefix}*"))


def test_sys_names_only_the_hosts_own_interfaces(service: JobService) -> None:
    code = (
        "import os\nprint('net', sorted(os.listdir('/sys/class/net')))\n"
        "print('virtual', sorted(os.listdir('/sys/devices/virtual/net')))\n"
    )
    service.create(sandboxed("sys-net", code))
    record = wait_for(service, "sys-net")
    out = lines(service, "sys-net")
    assert record.status == "Completed", (record.failure_reason, out)
    assert "net ['eth0', 'lo']" in out and "virtual ['eth0', 'lo']" in out, out


STARTER = """
import sys, time
from pathlib import Path
from trainport.runners.plan import Mount, MountKind, SandboxPlan
from trainport.runners.sandbox import _RuncStart

root = Path(sys.argv[1])
mounts = (Mount(MountKind.RO_BIND, "/usr", "/usr"), Mount(MountKind.PROC, "/proc"),
          Mount(MountKind.SYMLINK, "/bin", "usr/bin"), Mount(MountKind.SYMLINK, "/lib", "usr/lib"),
          Mount(MountKind.SYMLINK, "/lib64", "usr/lib64"))
plan = SandboxPlan(mounts=mounts, argv=("/usr/bin/sleep", "300"), cwd="/", env={})
process = _RuncStart(plan, root, None, None).start()
print(process.container, flush=True)
time.sleep(300)
"""


def test_a_sandbox_whose_starter_died_is_swept(tmp_path: Path) -> None:
    """A starter killed with its runc (a Ray worker, say) leaves the container's state and
    bundle; the next start anywhere on the machine removes them."""
    import signal
    import subprocess
    import sys

    root = tmp_path / "hosts" / "algo-1"
    root.mkdir(parents=True)
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert starter.stdout is not None
    container = starter.stdout.readline().strip()
    state = Path(sandbox_module.RUNC_STATE)
    assert (state / container).is_dir()
    os.kill(starter.pid, signal.SIGKILL)
    starter.wait()
    subprocess.run(["pkill", "-KILL", "-f", f"runc .*{container}"], check=False)
    assert container in sandbox_module.sweep_orphans()
    assert not (state / container).exists()
    assert not (state / "bundles" / container).exists()
