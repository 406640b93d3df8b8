"""Hostile jobs against the sandbox, in each of its ways (what a job may see, as the
README's Runners section lists it): every test proves a refusal, not merely that nothing
crashed.

The jobs run as root inside (uid 0 of their user namespace), as SageMaker scripts expect,
and try what an attacker with a key would: read the platform's files by path and through
/proc, read another running job's files, undo the sandbox, and smuggle host files out
through links the supervisor might follow.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import put, python_job, require, wait_for, wait_until
from trainport.jobs.service import JobService
from trainport.runners import sandbox as sandbox_module
from trainport.runners.api import Placement

SECRET = "s3cr3t-key-material"
# Not a missing capability: bubblewrap is the way of a trainport run by a normal user.
ROOT_USES_RUNC = "as root the sandbox is runc; bubblewrap is the way for a non-root user"


@pytest.fixture(params=["runc", "bwrap"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    way = str(request.param)
    if way == "bwrap" and os.geteuid() == 0:
        pytest.skip(ROOT_USES_RUNC)
    problem = sandbox_module._probe(way)
    require(problem is None, f"no {way} sandbox on this machine: {problem}")
    monkeypatch.setenv("TRAINPORT_SANDBOX", way)
    yield way


@pytest.fixture
def secrets(home: Path, service: JobService) -> dict[str, Path]:
    """The platform's files a job must never read, each holding SECRET."""
    keys = home / "server" / "keys.json"
    keys.parent.mkdir(parents=True, exist_ok=True)
    keys.write_text(json.dumps({"AKID": SECRET}))
    canary = home / "canary.txt"
    canary.write_text(SECRET)
    put(home, "private", "object.txt", SECRET)
    service.create(python_job("seed", "print(1)"), runner="process")  # makes the database
    wait_for(service, "seed")
    return {
        "db": home / "trainport.db",
        "keys": keys,
        "canary": canary,
        "store": home / "store" / "private" / "object.txt",
        "jobs": home / "jobs" / "seed" / "logs" / "algo-1.log",
    }


def sandboxed(name: str, code: str, **overrides: object) -> dict[str, object]:
    return python_job(
        name, code, Tags=[{"Key": "trainport:runner", "Value": "sandbox"}], **overrides
    )


def lines(service: JobService, name: str) -> list[str]:
    return [line for _, line in service.logs(name)]


def members(home: Path, uri: str) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(home / "store" / uri[len("s3://") :]) as tar:
        return {m.name: m for m in tar.getmembers()}


def archive_bytes(home: Path, uri: str) -> bytes:
    return (home / "store" / uri[len("s3://") :]).read_bytes()


READ_BY_PATH = """
import glob, os
for name, path in paths.items():
    try:
        with open(path, "rb") as f:
            print("READ", name, f.read(64))
    except OSError as exc:
        print("refused", name, type(exc).__name__)
# The same files through every process's root and environment in /proc.
seen = 0
for root in glob.glob("/proc/[0-9]*/root"):
    for name, path in paths.items():
        try:
            with open(root + path, "rb") as f:
                print("READ", name, "via", root, f.read(64))
        except OSError:
            seen += 1
for environ in glob.glob("/proc/[0-9]*/environ"):
    try:
        text = open(environ, "rb").read()
    except OSError:
        continue
    if os.path.dirname(paths["canary"]).encode() in text:
        print("READ home path via", environ)
for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        text = open(cmdline, "rb").read()
    except OSError:
        continue
    if b"pytest" in text or b"trainport.jobs" in text:
        print("SAW the platform's process", cmdline)
print("done", seen > 0)
"""


def test_a_job_reads_no_platform_file_by_path_or_through_proc(
    way: str, home: Path, service: JobService, secrets: dict[str, Path]
) -> None:
    paths = {k: str(v) for k, v in secrets.items()}
    service.create(sandboxed("reader", f"paths = {paths!r}\n{READ_BY_PATH}"))
    record = wait_for(service, "reader")
    assert record.status == "Completed", record.failure_reason
    out = lines(service, "reader")
    assert out[-1] == "done True"
    assert sorted(line for line in out if line.startswith("refused")) == sorted(
        f"refused {name} FileNotFoundError" for name in paths
    ), out
    assert not [line for line in out if "READ" in line or "SAW" in line], out


SAVES_A_SECRET = """
import os, time
os.makedirs("/opt/ml/model", exist_ok=True)
open("/opt/ml/model/secret.txt", "w").write("job-a-secret")
print("ready", flush=True)
while not os.path.exists("/opt/ml/model/done"):
    time.sleep(0.05)
"""

LOOKS_FOR_IT = """
import glob, sys
host_path = sys.argv[1]
found = []
for candidate in [host_path, *glob.glob("/proc/[0-9]*/root/opt/ml/model/secret.txt")]:
    try:
        if open(candidate).read() == "job-a-secret":
            found.append(candidate)
    except OSError:
        pass
print("found", found)
print("pids", sorted(int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*")) [:1])
"""


def test_a_job_cannot_see_another_running_jobs_files(
    way: str, home: Path, service: JobService
) -> None:
    service.create(sandboxed("job-a", SAVES_A_SECRET))
    wait_until(lambda: "ready" in lines(service, "job-a"), what="job-a ready")
    tree = home / "jobs" / "job-a" / "hosts" / "algo-1"
    assert (tree / "model" / "secret.txt").read_text() == "job-a-secret"  # it is there
    try:
        body = sandboxed("job-b", LOOKS_FOR_IT)
        body["AlgorithmSpecification"]["ContainerArguments"] = [  # type: ignore[index]
            str(tree / "model" / "secret.txt")
        ]
        service.create(body)
        record = wait_for(service, "job-b")
    finally:
        (tree / "model" / "done").write_text("")
    assert record.status == "Completed", record.failure_reason
    assert lines(service, "job-b")[0] == "found []"
    assert wait_for(service, "job-a").status == "Completed"


UNDOES = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
status = open("/proc/self/status").read()
print([line for line in status.splitlines() if line.startswith(("CapEff", "CapPrm", "NoNewPrivs"))])
print("uid", os.getuid())
targets = [line.split()[4] for line in open("/proc/self/mountinfo")]
undone = [t for t in targets if libc.umount2(t.encode(), 2) == 0]  # MNT_DETACH
print("unmounted", undone)
made = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0
print("mounted", made)
try:
    open("/etc/passwd", "a").close()
    print("WROTE /etc")
except OSError as exc:
    print("refused", type(exc).__name__)
"""


def test_a_job_cannot_unmount_or_mount_and_has_no_capabilities(
    way: str, service: JobService
) -> None:
    service.create(sandboxed("undo", UNDOES))
    record = wait_for(service, "undo")
    assert record.status == "Completed", record.failure_reason
    caps, uid, unmounted, mounted, wrote = lines(service, "undo")
    assert caps == "['CapPrm:\\t0000000000000000', 'CapEff:\\t0000000000000000', 'NoNewPrivs:\\t1']"
    assert uid == "uid 0"  # root inside, as SageMaker scripts expect
    assert (unmounted, mounted) == ("unmounted []", "mounted False")
    assert wrote in ("refused OSError", "refused PermissionError")


SMUGGLES = """
import os, sys
target = sys.argv[1]
os.makedirs("/opt/ml/checkpoints", exist_ok=True)
os.symlink(target, "/opt/ml/checkpoints/leak")
os.symlink(os.path.dirname(target), "/opt/ml/checkpoints/leakdir")
os.symlink("/etc/shadow", "/opt/ml/checkpoints/shadow")
open("/opt/ml/checkpoints/real.txt", "w").write("mine")
os.symlink(target, "/opt/ml/model/inner-link")
os.rename("/opt/ml/output/data", "/opt/ml/output/data-was")
os.symlink(os.path.dirname(target), "/opt/ml/output/data")
os.symlink(target, "/opt/ml/output/failure")
sys.exit(1)
"""


def test_links_a_job_makes_smuggle_no_host_file_out(
    way: str, home: Path, service: JobService, secrets: dict[str, Path]
) -> None:
    body = sandboxed(
        "smuggle",
        SMUGGLES,
        CheckpointConfig={"S3Uri": "s3://ckpt/smuggle", "LocalPath": "/opt/ml/checkpoints"},
    )
    body["AlgorithmSpecification"]["ContainerArguments"] = [str(secrets["keys"])]  # type: ignore[index]
    service.create(body)
    record = wait_for(service, "smuggle")
    assert record.status == "Failed"
    # The failure file is a link: the reason is the exit code, not the key file.
    assert record.failure_reason == "AlgorithmError: , exit code: 1"
    # Checkpoints: the real file went up, no link was followed.
    uploaded = sorted(p.name for p in (home / "store" / "ckpt" / "smuggle").rglob("*"))
    assert uploaded == ["real.txt"]
    # The model archive keeps the link as a link; the output archive, whose folder is now
    # a link out of the tree, is empty. Neither holds the secret.
    model = members(home, record.model_artifacts or "")
    assert model["inner-link"].issym() and model["inner-link"].linkname == str(secrets["keys"])
    output = (record.model_artifacts or "").replace("model.tar.gz", "output.tar.gz")
    assert members(home, output) == {}
    for uri in (record.model_artifacts or "", output):
        with tarfile.open(home / "store" / uri[len("s3://") :]) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    assert SECRET.encode() not in tar.extractfile(member).read()  # type: ignore[union-attr]


MODEL_IS_A_LINK = """
import os, shutil, sys
shutil.rmtree("/opt/ml/model")
os.symlink(os.path.dirname(sys.argv[1]), "/opt/ml/model")
"""


def test_a_model_folder_replaced_by_a_link_archives_nothing_of_the_host(
    way: str, home: Path, service: JobService, secrets: dict[str, Path]
) -> None:
    body = sandboxed("model-link", MODEL_IS_A_LINK)
    body["AlgorithmSpecification"]["ContainerArguments"] = [str(secrets["keys"])]  # type: ignore[index]
    service.create(body)
    record = wait_for(service, "model-link")
    assert record.status == "Completed", record.failure_reason
    assert members(home, record.model_artifacts or "") == {}


# -- paths from a request are confined before use (no namespaces needed) ----------------


def _escaping_requests() -> list[tuple[str, dict[str, object], str]]:
    channel = {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/x/"}},
    }
    return [
        (
            "local-path",
            {"CheckpointConfig": {"S3Uri": "s3://c/k", "LocalPath": "/opt/ml/../../srv/x"}},
            "CheckpointConfig.LocalPath",
        ),
        (
            "local-path-root",
            {"CheckpointConfig": {"S3Uri": "s3://c/k", "LocalPath": "/opt/ml/."}},
            "CheckpointConfig.LocalPath",
        ),
        ("channel-dots", {"InputDataConfig": [{**channel, "ChannelName": ".."}]}, "ChannelName"),
        (
            "channel-uri",
            {
                "InputDataConfig": [
                    {
                        **channel,
                        "DataSource": {
                            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://d/a/../../x"}
                        },
                    }
                ]
            },
            "S3DataSource.S3Uri",
        ),
        (
            "output",
            {"OutputDataConfig": {"S3OutputPath": "s3://out/../../../etc"}},
            "OutputDataConfig.S3OutputPath",
        ),
        (
            "checkpoint-uri",
            {"CheckpointConfig": {"S3Uri": "s3://c/a/../..", "LocalPath": "/opt/ml/ckpt"}},
            "CheckpointConfig.S3Uri",
        ),
        ("nul", {"Environment": {"A": "x\x00y"}}, "Environment.A"),
        ("nul-hp", {"HyperParameters": {"lr\x00": "1"}}, "HyperParameters"),
    ]


@pytest.mark.parametrize(
    ("name", "overrides", "field"), _escaping_requests(), ids=[r[0] for r in _escaping_requests()]
)
def test_an_escaping_request_path_is_refused_naming_its_field(
    home: Path, service: JobService, name: str, overrides: dict[str, object], field: str
) -> None:
    from trainport.errors import ValidationError

    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        service.create(python_job(name, "print(1)", **overrides), runner="process")
    assert not (home / "jobs" / name).exists()


def test_a_local_path_is_normalised_inside_opt_ml() -> None:
    from trainport.spec import confined_local_path

    assert confined_local_path("/opt/ml/checkpoints/../model/./c") == "/opt/ml/model/c"


def test_jobs_logs_host_must_be_a_host_name(
    home: Path, service: JobService, tmp_path: Path
) -> None:
    from tests.test_cli import tp

    service.create(python_job("logged", "print('hi')"), runner="process")
    wait_for(service, "logged")
    outside = tmp_path / "x.log"
    outside.write_text("1.0\tnot yours\n")
    escape = os.path.relpath(tmp_path / "x", home / "jobs" / "logged" / "logs")
    result = tp("jobs", "logs", "logged", "--host", escape)
    assert result.returncode != 0
    assert "not yours" not in result.stdout + result.stderr
    # Refused by name: not a host of the job, whose hosts the message lists.
    assert "no such host" in result.stderr and "algo-1" in result.stderr


# -- the decision, read without running anything ----------------------------------------


def _placement(tmp_path: Path, argv: tuple[str, ...] = ()) -> Placement:
    home = tmp_path / "home" / ".trainport"
    return Placement(
        root=home / "jobs" / "j" / "hosts" / "algo-1",
        hosts_file=home / "jobs" / "j" / "hosts" / "algo-1.etc-hosts",
        argv=argv or ("python3", "-u", "/tmp/scripts/train.py"),
        env={
            "PATH": f"{home}/envs/abc/bin:/root/.cargo/bin:/usr/bin",
            "HOME": "/home/tester",
        },
        cwd="/opt/ml/code",
        private=(home,),
        shared=(home / "envs",),
    )


def test_the_plan_mounts_an_allow_list_and_nothing_private(tmp_path: Path) -> None:
    from trainport.runners.plan import HostView, MountKind, plan_sandbox

    placement = _placement(tmp_path)
    home = str(tmp_path / "home" / ".trainport")
    view = HostView(
        system={"/usr": "", "/bin": "usr/bin"},
        etc=("/etc/resolv.conf", "/etc/ssl"),
        gpu_devices=(),
        # The interpreter under the home folder that holds TRAINPORT_HOME: only itself.
        interpreter=(str(tmp_path / "home" / ".venv"), "/home/tester/.pyenv/versions/3", "/usr"),
        package=str(tmp_path / "home" / "src" / "trainport"),
        existing=frozenset({"/tmp/scripts/train.py", f"{home}/envs/abc/bin"}),
    )
    plan = plan_sandbox(placement, view)
    assert plan.namespaces == ("user", "mount", "pid", "ipc", "uts")
    assert plan.hostname == "algo-1"
    assert (plan.uid, plan.capabilities, plan.no_new_privs) == (0, (), True)
    sources = plan.sources()
    own = {f"{home}/jobs/j/hosts/algo-1", f"{home}/jobs/j/hosts/algo-1.etc-hosts"}
    assert own <= set(sources)  # the job's own tree (at /opt/ml) and hosts file
    # Of TRAINPORT_HOME, besides those, only the one cached environment in use.
    assert [s for s in sources if s.startswith(home) and s not in own] == [f"{home}/envs/abc"]
    assert str(tmp_path / "home") not in sources and "/root/.cargo/bin" not in sources
    kinds = [(m.kind, m.target) for m in plan.mounts]
    assert (MountKind.PROC, "/proc") in kinds
    # /etc is an allow-list: the entries named, and files written for the job.
    etc = {m.target: m for m in plan.mounts if m.target.startswith("/etc")}
    assert set(etc) == {"/etc/resolv.conf", "/etc/ssl", "/etc/passwd", "/etc/group",
                        "/etc/hostname", "/etc/hosts"}  # fmt: skip
    assert etc["/etc/passwd"].kind is MountKind.FILE and etc["/etc/hostname"].source == "algo-1\n"
    # The entry script is shown after /tmp is made empty, else the tmpfs would hide it.
    assert kinds.index((MountKind.RO_BIND, "/tmp/scripts/train.py")) > kinds.index(
        (MountKind.TMPFS, "/tmp")
    )
    # The job's home is its own, empty and writable, and made before the interpreter that
    # lies in it is shown.
    assert kinds.index((MountKind.TMPFS, "/home/tester")) < kinds.index(
        (MountKind.RO_BIND, "/home/tester/.pyenv/versions/3")
    )
    opt_ml = next(m for m in plan.mounts if m.target == "/opt/ml")
    assert opt_ml.kind is MountKind.BIND


def test_a_request_naming_a_private_path_or_its_parent_gets_neither(tmp_path: Path) -> None:
    from trainport.runners.plan import HostView, plan_sandbox

    home = tmp_path / "home" / ".trainport"
    named = (str(home / "trainport.db"), str(tmp_path / "home"), "/", "/srv/data")
    placement = _placement(tmp_path, argv=("cat", *named))
    view = HostView(
        system={}, etc=(), gpu_devices=(), interpreter=(), package="/usr/lib/x",
        existing=frozenset(named), folders=frozenset(named[1:]),
    )  # fmt: skip
    plan = plan_sandbox(placement, view)
    assert not set(named) & set(plan.sources())  # a folder an argument names is not shown
    assert len(plan.refused) == 1  # the private file, with its reason


# -- the process runner --------------------------------------------------------------------

RESOLVES = """
import json, os, socket
for host in json.loads(os.environ["SM_HOSTS"]):
    print(host, socket.getaddrinfo(host, 7777, type=socket.SOCK_STREAM)[0][4][0])
"""


def test_every_host_name_resolves_under_the_process_runner(home: Path, service: JobService) -> None:
    from tests.test_multihost import assert_host_addresses
    from trainport.host.script_mode import pack_sourcedir
    from trainport.runners.process import hosts_namespace_problem

    problem = hosts_namespace_problem()
    require(problem is None, f"no mount namespace for the hosts file: {problem}")
    src = home.parent / "src-resolve"
    src.mkdir()
    (src / "resolve.py").write_text(RESOLVES)
    put(home, "code", "resolve/sourcedir.tar.gz", pack_sourcedir(src, "resolve.py"))
    body = python_job(
        "resolve",
        "",
        algo={"TrainingImage": "local/pytorch:2", "ContainerEntrypoint": None},
        HyperParameters={
            "sagemaker_program": json.dumps("resolve.py"),
            "sagemaker_submit_directory": json.dumps("s3://code/resolve/sourcedir.tar.gz"),
        },
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
    )
    del body["AlgorithmSpecification"]["ContainerEntrypoint"]
    service.create(body, runner="process")
    record = wait_for(service, "resolve")
    assert record.status == "Completed", record.failure_reason
    hosts = ("algo-1", "algo-2")
    seen = [dict(line.split() for _, line in service.logs("resolve", host=h)) for h in hosts]
    assert seen[0] == seen[1] and sorted(seen[0]) == list(hosts)
    assert_host_addresses(seen[0], "resolve")  # each host its own address
    assert "algo-1" not in Path("/etc/hosts").read_text()  # the machine's file is untouched


def test_a_server_refuses_the_process_runner_unless_its_operator_allows_it(
    home: Path,
) -> None:
    from trainport.config import load_settings
    from trainport.errors import ValidationError

    refusing = JobService(load_settings(), allow_process_runner=False)
    with pytest.raises(ValidationError, match="isolates nothing"):
        refusing.create(python_job("unisolated", "print(1)"), runner="process")
    assert load_settings({"TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER": "1"}).server_allow_process_runner
    assert not load_settings({}).server_allow_process_runner


LEAVES_A_CHILD = """
import subprocess, sys
# A child in a session of its own, holding the job's output open: it must not keep the job
# alive once the training process has ended (a container ends with its main process).
subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True)
print("main process done", flush=True)
"""


@pytest.mark.parametrize("runner", ["runc", "bwrap", "process"])
def test_a_job_ends_with_its_training_process_whatever_it_left_running(
    home: Path, service: JobService, runner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    marker = f"{1000 + os.getpid() % 1000}.{len(runner)}7"  # an argument only this test uses
    if runner == "bwrap" and os.geteuid() == 0:
        pytest.skip(ROOT_USES_RUNC)
    if runner != "process":
        require(sandbox_module.sandbox_problem() is None, "no sandbox here")
        monkeypatch.setenv("TRAINPORT_SANDBOX", runner)
        sandbox_module._probe.cache_clear()
    body = python_job(f"leaves-{runner}", LEAVES_A_CHILD)
    body["AlgorithmSpecification"]["ContainerEntrypoint"].append(marker)
    service.create(body, runner="process" if runner == "process" else "sandbox")
    try:
        record = wait_for(service, f"leaves-{runner}", timeout=60)
        assert record.status == "Completed", record.failure_reason
        assert "main process done" in lines(service, f"leaves-{runner}")
        if runner != "process":  # the sandbox takes everything it ran down with it
            wait_until(
                lambda: subprocess.run(["pgrep", "-f", f"sleep {marker}"]).returncode != 0,
                timeout=10,
                what="the sandbox's leftover process gone",
            )
    finally:
        subprocess.run(["pkill", "-f", f"sleep {marker}"])
