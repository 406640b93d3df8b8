"""Script mode: sourcedir tarballs, the toolkit-compatible invocation, layered environments."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from sagemaker_training import mapping

from trainport.errors import ValidationError
from trainport.host.layout import HostLayout, resource_config
from trainport.host.script_mode import (
    is_script_mode,
    pack_entry_point,
    pack_sourcedir,
    prepare_python,
    script_invocation,
    unpack_sourcedir,
)

SUBMIT = "s3://bucket/job/source/sourcedir.tar.gz"

# As the SageMaker SDK sends them: every value JSON-encoded.
HPS = {
    "lr": "0.1",
    "epochs": "3",
    "name": '"resnet"',
    "flag": "true",
    "plain": "not json",
    "layers": "[1, 2]",
    "opts": '{"b": 2, "a": "x"}',
    "n": "null",
    "x": "5",
    "sagemaker_program": '"train.py"',
    "sagemaker_submit_directory": json.dumps(SUBMIT),
    "sagemaker_region": '"us-west-2"',
    "sagemaker_torch_distributed_enabled": "true",
}
INPUT_DATA_CONFIG = {
    "val": {
        "TrainingInputMode": "File",
        "S3DistributionType": "FullyReplicated",
        "RecordWrapperType": "None",
        "ContentType": "text/csv",
    },
    "train": {
        "TrainingInputMode": "Pipe",
        "S3DistributionType": "ShardedByS3Key",
        "RecordWrapperType": "RecordIO",
    },
}
RESOURCE = resource_config("algo-2", [("homogeneousCluster", "ml.m5.xlarge", ["algo-2", "algo-1"])])


def invocation(base_dir: Path, hps: dict[str, str] = HPS) -> tuple[list[str], dict[str, str]]:
    return script_invocation(
        base_dir=base_dir,
        hyperparameters=hps,
        resource_config=RESOURCE,
        input_data_config=INPUT_DATA_CONFIG,
        python="/usr/bin/python3",
        num_gpus=2,
        num_cpus=8,
        job_name="job-1",
    )


# -- sourcedir tarballs -----------------------------------------------------------------------


def make_source(root: Path) -> Path:
    src = root / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("import pkg.util\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "util.py").write_text("VALUE = 7\n")
    (src / "data.bin").write_bytes(bytes(range(256)))
    (src / "util_link.py").symlink_to("pkg/util.py")
    return src


def test_pack_and_unpack_roundtrip(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    blob = pack_sourcedir(src, "train.py")
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        names = sorted(tar.getnames())
    assert names == [
        "data.bin",
        "pkg",
        "pkg/__init__.py",
        "pkg/util.py",
        "train.py",
        "util_link.py",
    ]

    code = tmp_path / "opt" / "ml" / "code"
    unpack_sourcedir(blob, code)
    assert (code / "train.py").read_text() == "import pkg.util\n"
    assert (code / "pkg" / "util.py").read_text() == "VALUE = 7\n"
    assert (code / "data.bin").read_bytes() == bytes(range(256))
    assert os.readlink(code / "util_link.py") == "pkg/util.py"

    # From a path on disk, too.
    (tmp_path / "sourcedir.tar.gz").write_bytes(blob)
    unpack_sourcedir(tmp_path / "sourcedir.tar.gz", tmp_path / "code2")
    assert (tmp_path / "code2" / "pkg" / "util.py").exists()


def test_pack_entry_point_alone(tmp_path: Path) -> None:
    entry = tmp_path / "deep" / "train.py"
    entry.parent.mkdir()
    entry.write_text("print('hi')\n")
    blob = pack_entry_point(entry)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        assert tar.getnames() == ["train.py"]
    with pytest.raises(ValidationError, match=re.escape("missing.py")):
        pack_entry_point(tmp_path / "missing.py")


def test_pack_refuses_bad_input(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    with pytest.raises(ValidationError, match=re.escape(str(tmp_path / "nope"))):
        pack_sourcedir(tmp_path / "nope", "train.py")
    with pytest.raises(ValidationError, match=re.escape("missing.py")):
        pack_sourcedir(src, "missing.py")
    (tmp_path / "outside.py").write_text("")
    with pytest.raises(ValidationError, match="relative"):
        pack_sourcedir(src, "../outside.py")
    (src / "escape.py").symlink_to("../outside.py")
    with pytest.raises(ValidationError, match=re.escape("escape.py")):
        pack_sourcedir(src, "train.py")


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


BAD_MEMBERS = {
    "parent": (_member("../x"), "would land outside"),
    "absolute": (_member("/tmp/abs-x"), "would land outside"),
    "nested-dotdot": (_member("a/../../x"), "would land outside"),
    "dotdot-inside": (_member("a/../x"), "would land outside"),
    "symlink-absolute": (_member("ln", tarfile.SYMTYPE, "/etc/passwd"), "absolute path"),
    "symlink-up": (_member("sub/ln", tarfile.SYMTYPE, "../../x"), "points outside"),
    "hardlink-up": (_member("hl", tarfile.LNKTYPE, "../x"), "hard link"),
    "hardlink-absolute": (_member("hl", tarfile.LNKTYPE, "/etc/passwd"), "hard link"),
    "char-device": (_member("dev", tarfile.CHRTYPE), "device"),
    "block-device": (_member("blk", tarfile.BLKTYPE), "device"),
    "fifo": (_member("pipe", tarfile.FIFOTYPE), "FIFO"),
}


@pytest.mark.parametrize("case", sorted(BAD_MEMBERS))
def test_unpack_refuses_escaping_members_and_writes_nothing(tmp_path: Path, case: str) -> None:
    bad, reason = BAD_MEMBERS[case]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ok = tarfile.TarInfo("ok.py")
        ok.size = 3
        tar.addfile(ok, io.BytesIO(b"1\n\n"))  # a good member first: it must not be written
        tar.addfile(bad, io.BytesIO(b"") if bad.isreg() else None)
    code = tmp_path / "job" / "code"
    with pytest.raises(ValidationError) as err:
        unpack_sourcedir(buf.getvalue(), code)
    message = str(err.value)
    assert f"member {bad.name!r}" in message
    assert reason in message
    if reason == "would land outside":
        assert f"would land outside {code}" in message
    assert not code.exists()
    assert list(tmp_path.iterdir()) == []


def test_unpack_refuses_a_corrupt_tarball(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot be read"):
        unpack_sourcedir(b"not a tarball at all", tmp_path / "code")
    blob = pack_sourcedir(make_source(tmp_path), "train.py")
    with pytest.raises(ValidationError):
        unpack_sourcedir(blob[: len(blob) // 2], tmp_path / "code")


# -- the invocation ---------------------------------------------------------------------------


def test_is_script_mode() -> None:
    assert is_script_mode(HPS)
    assert not is_script_mode({"sagemaker_program": '"train.py"'})
    assert not is_script_mode({"sagemaker_submit_directory": '"s3://b/k"'})


def test_argv_is_sorted_decoded_and_rendered_like_the_toolkit(tmp_path: Path) -> None:
    argv, _ = invocation(Path("/opt/ml"))
    assert argv == [
        "/usr/bin/python3",
        "train.py",
        "--epochs", "3",
        "--flag", "True",
        "--layers", "[1, 2]",
        "--lr", "0.1",
        "-n", "",
        "--name", "resnet",
        "--opts", "a=x,b=2",
        "--plain", "not json",
        "-x", "5",
    ]  # fmt: skip
    user = {k: json.loads(v) if k != "plain" else v for k, v in HPS.items()}
    user = {k: v for k, v in user.items() if not k.startswith("sagemaker_")}
    assert argv[2:] == mapping.to_cmd_args(user)


def test_sm_environment(tmp_path: Path) -> None:
    argv, env = invocation(Path("/opt/ml"))
    typed = {
        "epochs": 3,
        "flag": True,
        "layers": [1, 2],
        "lr": 0.1,
        "n": None,
        "name": "resnet",
        "opts": {"a": "x", "b": 2},
        "plain": "not json",
        "x": 5,
    }
    assert env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert env["SM_CHANNELS"] == '["train","val"]'
    assert env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert env["SM_CHANNEL_VAL"] == "/opt/ml/input/data/val"
    assert json.loads(env["SM_HPS"]) == typed
    assert env["SM_HP_LR"] == "0.1"
    assert env["SM_HP_NAME"] == "resnet"
    assert env["SM_HP_FLAG"] == "true"
    assert env["SM_HP_OPTS"] == '{"a":"x","b":2}'
    assert env["SM_HP_N"] == ""
    assert not [k for k in env if k.startswith("SM_HP_SAGEMAKER")]
    assert env["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert env["SM_CURRENT_HOST"] == "algo-2"
    assert env["SM_NUM_GPUS"] == "2"
    assert env["SM_NUM_CPUS"] == "8"
    assert env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data"
    assert env["SM_OUTPUT_DIR"] == "/opt/ml/output"
    assert env["SM_OUTPUT_INTERMEDIATE_DIR"] == "/opt/ml/output/intermediate"
    assert env["SM_INPUT_DIR"] == "/opt/ml/input"
    assert env["SM_INPUT_CONFIG_DIR"] == "/opt/ml/input/config"
    assert json.loads(env["SM_INPUT_DATA_CONFIG"]) == INPUT_DATA_CONFIG
    assert json.loads(env["SM_RESOURCE_CONFIG"]) == RESOURCE
    assert env["SM_USER_ENTRY_POINT"] == "train.py"
    assert json.loads(env["SM_USER_ARGS"]) == argv[2:]
    assert json.loads(env["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_torch_distributed_enabled": True}
    assert env["SM_LOG_LEVEL"] == "20"
    assert env["SM_NETWORK_INTERFACE_NAME"] == "lo"
    assert env["SM_MODULE_DIR"] == SUBMIT  # the toolkit reports the submit directory's URI
    assert env["SM_MODULE_NAME"] == "train"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.m5.xlarge"
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert env["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["homogeneousCluster"]'
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["hyperparameters"] == typed
    assert training_env["master_hostname"] == "algo-1"
    assert training_env["is_master"] is False
    assert training_env["job_name"] == "job-1"
    assert training_env["channel_input_dirs"]["train"] == "/opt/ml/input/data/train"
    assert env["SAGEMAKER_BASE_DIR"] == "/opt/ml"
    assert env["PYTHONPATH"] == "/opt/ml/code"
    assert env["SAGEMAKER_REGION"] == "us-west-2"

    # Under the process runner every path is under the job's own directory.
    _, local = invocation(tmp_path)
    assert local["SM_MODEL_DIR"] == f"{tmp_path}/model"
    assert local["SM_CHANNEL_TRAIN"] == f"{tmp_path}/input/data/train"
    assert local["PYTHONPATH"] == f"{tmp_path}/code"


def test_log_level_hyperparameter_wins() -> None:
    _, env = invocation(Path("/opt/ml"), {**HPS, "sagemaker_container_log_level": "10"})
    assert env["SM_LOG_LEVEL"] == "10"
    assert "sagemaker_container_log_level" not in env["SM_FRAMEWORK_PARAMS"]


@pytest.mark.parametrize("entry", ["../train.py", "/abs/train.py", "-c", "a/./b.py", "x;y.py", ""])
def test_unsafe_entry_points_are_refused(entry: str) -> None:
    with pytest.raises(ValidationError, match="sagemaker_program"):
        invocation(Path("/opt/ml"), {**HPS, "sagemaker_program": json.dumps(entry)})


def test_shell_entry_runs_through_sh() -> None:
    argv, _ = invocation(Path("/opt/ml"), {**HPS, "sagemaker_program": '"run.sh"', "x": '"a b"'})
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[2].startswith("./run.sh --epochs 3 ")
    assert argv[2].endswith("-x 'a b'")


def _lay_out(root: Path) -> HostLayout:
    layout = HostLayout(root)
    layout.create()
    layout.write_configs(HPS, INPUT_DATA_CONFIG, RESOURCE)
    return layout


def test_the_toolkit_reads_the_same_environment(tmp_path: Path) -> None:
    """sagemaker_training's own Environment, over the same tree, agrees with every SM_* value."""
    layout = _lay_out(tmp_path / "ml")
    _, env = invocation(layout.root)
    probe = textwrap.dedent(
        """
        import json
        from sagemaker_training import environment
        environment.num_gpus = lambda: 2
        environment.num_cpus = lambda: 8
        e = environment.Environment()
        print(json.dumps({
            "channel_input_dirs": e.channel_input_dirs,
            "hyperparameters": e.hyperparameters,
            "hosts": e.hosts,
            "model_dir": e.model_dir,
            "env": e.to_env_vars(),
        }))
        """
    )
    child_env = {**os.environ, **env, "TRAINING_JOB_NAME": "job-1"}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=child_env, capture_output=True, text=True, check=True
    )
    seen: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["channel_input_dirs"] == {
        "train": env["SM_CHANNEL_TRAIN"],
        "val": env["SM_CHANNEL_VAL"],
    }
    assert seen["hyperparameters"] == json.loads(env["SM_HPS"])
    assert seen["hosts"] == json.loads(env["SM_HOSTS"])
    assert seen["model_dir"] == env["SM_MODEL_DIR"] == str(layout.model_dir)
    ours = {k: v for k, v in env.items() if k.startswith("SM_")}
    assert seen["env"] == ours


def test_the_script_runs_with_this_invocation(tmp_path: Path) -> None:
    layout = _lay_out(tmp_path / "ml")
    src = make_source(tmp_path)
    (src / "train.py").write_text(
        textwrap.dedent(
            """
            import json, os, sys
            from pkg.util import VALUE
            out = os.path.join(os.environ["SM_MODEL_DIR"], "seen.json")
            with open(out, "w") as f:
                json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "value": VALUE,
                           "hps": json.loads(os.environ["SM_HPS"])}, f)
            """
        )
    )
    unpack_sourcedir(pack_sourcedir(src, "train.py"), layout.code_dir)
    argv, env = invocation(layout.root)
    argv[0] = sys.executable
    subprocess.run(argv, cwd=layout.code_dir, env={**os.environ, **env}, check=True)
    seen = json.loads((layout.model_dir / "seen.json").read_text())
    assert seen["argv"] == argv[2:]
    assert seen["cwd"] == str(layout.code_dir)
    assert seen["value"] == 7
    assert seen["hps"]["epochs"] == 3


# -- layered environments ---------------------------------------------------------------------


def test_no_requirements_means_the_base_interpreter(tmp_path: Path) -> None:
    assert prepare_python(tmp_path, tmp_path / "envs", base_python="/x/python", log=print) == (
        "/x/python"
    )
    assert not (tmp_path / "envs").exists()


PIP = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]


def _local_wheel(root: Path, version: str) -> Path:
    """A tiny package with a pyproject, built offline into a wheel pip can install by path."""
    pkg = root / f"localpkg-{version}"
    (pkg / "localpkg").mkdir(parents=True)
    (pkg / "localpkg" / "__init__.py").write_text(
        f"VALUE = {version!r}\n\ndef main():\n    print('cli', VALUE)\n"
    )
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "localpkg"
            version = "{version}"

            [project.scripts]
            localpkg-cli = "localpkg:main"

            [tool.setuptools]
            packages = ["localpkg"]
            """
        )
    )
    wheels = root / "wheels"
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(pkg)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob(f"localpkg-{version}-*.whl")
    return wheel


def _base_venv(root: Path, installed: Path) -> Path:
    """A base interpreter that is itself a venv (over this interpreter's site-packages), with
    the wheel ``installed`` in it and a plain module of its own."""
    venv = root / "base-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
    )
    purelib = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "basevenvmod.py").write_text("WHERE = 'base venv'\n")
    subprocess.run(
        [venv / "bin" / "python", *PIP[1:], "install", "--no-index", str(installed)], check=True
    )
    return venv / "bin" / "python"


@pytest.mark.slow
def test_layered_env_is_built_once_and_sees_both_worlds(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    wheel = _local_wheel(tmp_path, "0.2")
    (code / "requirements.txt").write_text(f"--no-index\n{wheel}\n")
    base = str(_base_venv(tmp_path, _local_wheel(tmp_path, "0.1")))
    envs = tmp_path / "envs"

    logs: list[list[str]] = [[], [], []]
    results: list[str] = ["", ""]

    def build(i: int) -> None:
        results[i] = prepare_python(code, envs, base_python=base, log=logs[i].append)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    python = results[0]
    assert results[1] == python
    assert python.startswith(str(envs))
    built = [log for log in logs[:2] if any("Successfully installed" in line for line in log)]
    assert len(built) == 1  # the other caller waited on the lock, then reused
    assert sorted(p.name for p in envs.iterdir() if not p.name.endswith(".lock")) == [
        Path(python).parent.parent.name
    ]

    assert prepare_python(code, envs, base_python=base, log=logs[2].append) == python
    assert any("reusing" in line for line in logs[2])
    assert not any("Successfully installed" in line for line in logs[2])

    probe = (
        "import json, localpkg, basevenvmod, yaml, sys; "
        "print(json.dumps([localpkg.VALUE, basevenvmod.WHERE, yaml.__file__, sys.prefix]))"
    )
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    value, where, yaml_file, prefix = json.loads(out.stdout)
    assert value == "0.2"  # the requirements' version wins over the base venv's 0.1
    assert where == "base venv"  # the base venv's own site-packages
    assert yaml_file.startswith(sys.base_prefix)  # and what the base venv layers on
    assert prefix == str(Path(python).parent.parent)
    # Console scripts were retargeted from the temporary build folder.
    cli = subprocess.run(
        [str(Path(python).parent / "localpkg-cli")], capture_output=True, text=True, check=True
    )
    assert cli.stdout.strip() == "cli 0.2"
    base_sees = subprocess.run(
        [base, "-c", "import localpkg; print(localpkg.VALUE)"], capture_output=True, text=True
    )
    assert base_sees.stdout.strip() == "0.1"  # and the base was left alone


@pytest.mark.slow
def test_failed_install_names_requirements_and_leaves_no_cache(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("--no-index\nno-such-package-trainport==1.0\n")
    envs = tmp_path / "envs"
    lines: list[str] = []
    with pytest.raises(ValidationError, match=re.escape("requirements.txt")) as err:
        prepare_python(code, envs, log=lines.append)
    assert "no-such-package-trainport" in str(err.value)
    assert lines  # pip's output was streamed
    assert [p.name for p in envs.iterdir() if not p.name.endswith(".lock")] == []
