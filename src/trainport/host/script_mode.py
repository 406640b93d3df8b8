"""Script mode: trainport playing the part of a SageMaker framework container.

A job whose hyperparameters name ``sagemaker_program`` and ``sagemaker_submit_directory`` runs
the user's script the way the sagemaker-training toolkit would. The host agent calls, in order:

1. :func:`unpack_sourcedir` (from :mod:`trainport.host.sourcedir`) to lay the code out in the
   host's code directory;
2. :func:`prepare_python`, which gives the interpreter to run it with: the base interpreter,
   or, when the code ships a ``requirements.txt``, a cached virtual environment layered on it;
3. :func:`script_invocation`, a pure function that returns the argv and the ``SM_*``
   environment, names and value formats matching the toolkit's ``Environment.to_env_vars``.

Paths in the environment are under ``base_dir``: ``/opt/ml`` in the sandbox runner, the job's
own host directory in the process runner.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainport.errors import ValidationError
from trainport.host.envbuild import STEP_PREFIX
from trainport.host.sourcedir import pack_entry_point, pack_sourcedir, unpack_sourcedir

__all__ = [
    "PROGRAM",
    "SUBMIT_DIRECTORY",
    "check_entry",
    "is_script_mode",
    "pack_entry_point",
    "pack_sourcedir",
    "prepare_python",
    "script_invocation",
    "unpack_sourcedir",
]

PROGRAM = "sagemaker_program"
SUBMIT_DIRECTORY = "sagemaker_submit_directory"
_LOG_LEVEL = "sagemaker_container_log_level"
_JOB_NAME = "sagemaker_job_name"
_REGION = "sagemaker_region"
_PREFIX = "sagemaker_"

# The toolkit's params.SAGEMAKER_HYPERPARAMETERS: consumed by the toolkit, so neither user
# hyperparameters nor SM_FRAMEWORK_PARAMS.
_TOOLKIT_KEYS = frozenset(
    {
        PROGRAM,
        SUBMIT_DIRECTORY,
        "sagemaker_enable_cloudwatch_metrics",
        _REGION,
        _LOG_LEVEL,
        _JOB_NAME,
        "default_user_module_name",
        "_tuning_objective_metric",
        "sagemaker_s3_output",
    }
)
# Any of these turns the current instance group into a distribution group (toolkit rule).
_DISTRIBUTION_FLAGS = (
    "sagemaker_mpi_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_torch_distributed_enabled",
)
_SAFE_ENTRY = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*$")


def is_script_mode(hyperparameters: Mapping[str, str]) -> bool:
    """Whether the hyperparameters select a user script (both SageMaker SDK keys present)."""
    return PROGRAM in hyperparameters and SUBMIT_DIRECTORY in hyperparameters


# -- the invocation (pure) --------------------------------------------------------------------


def script_invocation(
    *,
    base_dir: Path,
    hyperparameters: Mapping[str, str],
    resource_config: Mapping[str, Any],
    input_data_config: Mapping[str, Any],
    python: str,
    num_gpus: int,
    num_cpus: int,
    log_level: int = logging.INFO,
    job_name: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment additions that run the user's entry point.

    ``hyperparameters`` is the request's map (every value a JSON string from the SDK);
    ``resource_config`` and ``input_data_config`` are the documents of
    ``input/config/``. The argv is ``[python, entry, --key, value, ...]`` for a ``.py`` entry
    (a ``.sh`` or other entry runs through ``/bin/sh -c ./entry ...`` as in the toolkit); the
    entry is relative to the code dir, which must be the command's working directory.
    ``log_level`` applies when the ``sagemaker_container_log_level`` hyperparameter is absent;
    ``job_name`` is what the toolkit reads from ``TRAINING_JOB_NAME``.
    """
    if not is_script_mode(hyperparameters):
        raise ValidationError(
            f"script mode needs HyperParameters {PROGRAM} and {SUBMIT_DIRECTORY}; "
            "set both (the SageMaker SDK does when given entry_point)"
        )
    decoded = {key: _decode(value) for key, value in hyperparameters.items()}
    toolkit = {k: v for k, v in decoded.items() if k in _TOOLKIT_KEYS or k.startswith(_PREFIX)}
    user = {k: v for k, v in decoded.items() if k not in toolkit}
    framework_params = {k: v for k, v in toolkit.items() if k not in _TOOLKIT_KEYS}
    entry = check_entry(str(toolkit[PROGRAM]))
    user_args = _cmd_args(user)

    base = str(base_dir)
    code_dir = posixpath.join(base, "code")
    input_dir = posixpath.join(base, "input")
    output_dir = posixpath.join(base, "output")
    channels = {name: posixpath.join(input_dir, "data", name) for name in input_data_config}
    env = _toolkit_env(
        resource_config=resource_config,
        framework_params=framework_params,
        hps=user,
        channels=channels,
        dirs={
            "input_dir": input_dir,
            "input_config_dir": posixpath.join(input_dir, "config"),
            "model_dir": posixpath.join(base, "model"),
            "output_dir": output_dir,
            "output_data_dir": posixpath.join(output_dir, "data"),
            "output_intermediate_dir": posixpath.join(output_dir, "intermediate"),
        },
        extra={
            "input_data_config": dict(input_data_config),
            "user_entry_point": entry,
            "module_name": entry[:-3] if entry.endswith(".py") else entry,
            "module_dir": str(toolkit[SUBMIT_DIRECTORY]),
            "log_level": toolkit.get(_LOG_LEVEL, log_level),
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "job_name": job_name,
            "user_args": user_args,
        },
    )
    env.update(
        {
            "SAGEMAKER_BASE_DIR": base,
            "PYTHONPATH": code_dir,
            # The toolkit exports these into its own environment, so the script inherits them.
            "CURRENT_HOST": env["SM_CURRENT_HOST"],
            "SAGEMAKER_JOB_NAME": str(toolkit.get(_JOB_NAME, "")),
            "SAGEMAKER_REGION": str(toolkit.get(_REGION) or ""),
        }
    )
    if entry.endswith(".py"):
        argv = [python, entry, *user_args]
    else:
        quoted = " ".join(shlex.quote(a) for a in user_args)
        argv = ["/bin/sh", "-c", f"./{shlex.quote(entry)} {quoted}"]
    return argv, env


def _toolkit_env(
    *,
    resource_config: Mapping[str, Any],
    framework_params: dict[str, Any],
    hps: dict[str, Any],
    channels: dict[str, str],
    dirs: dict[str, str],
    extra: dict[str, Any],
) -> dict[str, str]:
    """``Environment.to_env_vars`` of the toolkit, from already-decoded pieces."""
    try:
        hosts = list(resource_config["hosts"])
        current_host = str(resource_config["current_host"])
    except KeyError as exc:
        raise ValidationError(
            f"resource config lacks {exc.args[0]!r}; it needs hosts and current_host"
        ) from exc
    instance_type = resource_config.get("current_instance_type", "local")
    group = resource_config.get("current_group_name", "homogeneousCluster")
    groups_config: list[dict[str, Any]] = list(resource_config.get("instance_groups", []))
    if any(framework_params.get(flag, False) for flag in _DISTRIBUTION_FLAGS):
        default_groups = [group]
    else:
        default_groups = []
    distribution_groups = framework_params.get(
        "sagemaker_distribution_instance_groups", default_groups
    )
    if groups_config:
        distribution_hosts = [
            host
            for g in groups_config
            if g["instance_group_name"] in distribution_groups
            for host in g["hosts"]
        ]
    else:
        distribution_hosts = list(hosts)
    group_hosts: list[str] = next(
        (g["hosts"] for g in groups_config if g["instance_group_name"] == group), []
    )
    instance_groups = [g["instance_group_name"] for g in groups_config]
    master = distribution_hosts[0] if distribution_hosts else hosts[0]
    topology = resource_config.get("topology", [])
    common: dict[str, Any] = {
        **dirs,
        **{k: extra[k] for k in extra if k not in ("job_name", "user_args")},
        "hosts": hosts,
        "current_host": current_host,
        "current_instance_type": instance_type,
        "current_instance_group": group,
        "current_instance_group_hosts": group_hosts,
        "instance_groups": instance_groups,
        "instance_groups_dict": {g["instance_group_name"]: g for g in groups_config},
        "distribution_instance_groups": distribution_groups,
        "is_hetero": len(instance_groups) > 1,
        "network_interface_name": resource_config.get("network_interface_name", "eth0"),
        "resource_config": dict(resource_config),
        "framework_module": None,
        # Neuron cores: the toolkit asks neuron-ls, which no trainport host has.
        "num_neurons": 64 if "trn2.48xlarge" in str(instance_type) else 0,
    }
    training_env = {
        **common,
        "additional_framework_parameters": framework_params,
        "channel_input_dirs": channels,
        "distribution_hosts": distribution_hosts,
        "hyperparameters": hps,
        "is_master": current_host == master,
        "is_modelparallel_enabled": None,
        "is_smddpmprun_installed": False,
        "is_smddprun_installed": False,
        "job_name": extra["job_name"],
        "master_hostname": master,
        "topology": topology,
    }
    env: dict[str, Any] = {
        **common,
        "hps": hps,
        "framework_params": framework_params,
        "channels": sorted(channels),
        "training_env": training_env,
        "user_args": extra["user_args"],
    }
    if topology:
        env["topology"] = topology
    env.update({f"channel_{name}": path for name, path in channels.items()})
    env.update({f"hp_{key}": value for key, value in hps.items()})
    return {f"SM_{key.upper()}": _env_value(value) for key, value in env.items()}


def _decode(value: str) -> Any:
    """A hyperparameter as the toolkit reads it: JSON when it parses, else the string."""
    try:
        return json.loads(value)
    except (ValueError, TypeError):
        return value


def _env_value(value: Any) -> str:
    """The toolkit's ``mapping.to_env_vars`` value format."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _cmd_args(hps: Mapping[str, Any]) -> list[str]:
    """The toolkit's ``mapping.to_cmd_args``: sorted keys, ``-k`` for one-letter names,
    ``str()`` of each value (so ``True``, ``0.1``, ``[1, 2]``), a dict as ``a=1,b=2``."""
    args: list[str] = []
    for key in sorted(hps):
        value = hps[key]
        name = f"--{key}" if len(key) > 1 else (f"-{key}" if key else "")
        if isinstance(value, dict):
            rendered = ",".join(f"{k}={v}" for k, v in sorted(value.items()))
        else:
            rendered = "" if value is None else str(value)
        args += [name, rendered]
    return args


def check_entry(entry: str) -> str:
    """``entry`` if it is a plain relative path inside the source directory."""
    if not _SAFE_ENTRY.match(entry) or any(p in (".", "..") for p in entry.split("/")):
        raise ValidationError(
            f"HyperParameters {PROGRAM} {entry!r} is not a plain relative path inside the "
            "source directory; use a name like 'train.py' or 'src/train.py' (letters, digits, "
            "'.', '_', '+', '-', '/'; no leading '-' or '/', no '.' or '..' segments)"
        )
    return entry


# -- the interpreter (effects) ----------------------------------------------------------------

_BASE_INFO = """\
import json, os, site, sys
dirs = list(site.getsitepackages())
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
print(json.dumps({"executable": sys.executable, "version": sys.version,
                  "site": [d for d in dirs if os.path.isdir(d)]}))
"""


#: Runs an environment build's command line (see :mod:`trainport.host.envbuild`), which
#: writes only the folder given, from the code folder; raises ValidationError if it fails.
EnvBuilder = Callable[[list[str], Path], None]


def prepare_python(
    code_dir: Path,
    envs_dir: Path,
    *,
    base_python: str = sys.executable,
    log: Callable[[str], None],
    build: EnvBuilder | None = None,
    framework: Sequence[str] = (),
) -> str:
    """The interpreter to run the user's code with.

    Without ``framework`` lines and ``code_dir/requirements.txt`` that is ``base_python``.
    ``framework`` (pip requirement lines, see :mod:`trainport.host.framework_envs`) makes a
    layer on it, and ``requirements.txt`` a layer on that: each a virtual environment under
    ``envs_dir/<sha256>`` (of its lines and the interpreter under it), built once and
    reused. A layer's packages take precedence, while everything importable from the
    interpreter under it (also when that is itself a venv) stays importable through a
    ``.pth`` file. pip's output goes line by line to ``log``. Builds happen in a temporary
    folder renamed into place under a lock file, so concurrent callers build once and a
    crash leaves no half-built cache.

    The build runs code from the package index and the request (setup.py of a local
    package, say): ``build`` runs it where the job runs, in its confinement; without one it
    runs here, as the caller.
    """
    python = base_python
    if framework:
        try:
            python = _layer(
                framework_lines(framework),
                None,
                Path(envs_dir),
                python,
                log,
                build,
                "framework image",
            )
        except ValidationError as exc:
            # The builder's advice is about requirements.txt; this layer is the image's.
            said = str(exc).partition("Last lines of output:")[2].strip()
            # A package compiled here (Horovod) fails for want of the machine's tools more
            # often than for the image's version.
            compiled = any(line.startswith(f"{STEP_PREFIX}compile ") for line in framework)
            advice = (
                "install cmake, g++ and OpenMPI's development files where jobs run "
                "(apt-get install cmake g++ libopenmpi-dev), or name another version of the image"
                if compiled
                else "name another version of the image"
            )
            raise ValidationError(
                "AlgorithmSpecification.TrainingImage: the packages its framework image "
                f"stands for ({'; '.join(framework)}) could not be installed for Python "
                f"{sys.version_info.major}.{sys.version_info.minor}; {advice}. Last lines of "
                "output:\n" + (said or str(exc))
            ) from exc
    requirements = Path(code_dir) / "requirements.txt"
    if requirements.is_file():
        layered = python != base_python
        python = _layer(
            requirements.read_bytes(),
            requirements,
            Path(envs_dir),
            python,
            log,
            build,
            "requirements.txt",
            isolated=layered,
        )
    return python


def framework_lines(framework: Sequence[str]) -> bytes:
    return "".join(f"{line}\n" for line in framework).encode()


def layer_built(
    framework: Sequence[str], envs_dir: Path, base_python: str = sys.executable
) -> bool:
    """Whether the environment of ``framework`` lines on ``base_python`` is in the cache."""
    base = _base_info(base_python)
    digest = _digest(framework_lines(framework), base)
    return (Path(envs_dir) / digest / "bin" / "python").exists()


def _digest(lines: bytes, base: dict[str, Any]) -> str:
    return hashlib.sha256(lines + b"\0" + json.dumps(base, sort_keys=True).encode()).hexdigest()


def _layer(
    lines: bytes,
    requirements: Path | None,
    envs: Path,
    base_python: str,
    log: Callable[[str], None],
    build: EnvBuilder | None,
    what: str,
    *,
    isolated: bool = False,
) -> str:
    """One cached environment of ``lines`` on ``base_python``: from ``requirements`` (a file
    in the code folder, where the build runs), or from a file written into the folder being
    built. ``isolated``: ask ``base_python`` for its folders without running its site
    hooks (a layer a build made is not run outside the job's confinement)."""
    base = _base_info(base_python, isolated=isolated)
    digest = _digest(lines, base)
    envs.mkdir(parents=True, exist_ok=True)
    final = envs / digest
    python = final / "bin" / "python"
    with _locked(envs / f"{digest}.lock"):
        if python.exists():
            log(f"{what}: reusing the environment {final}")
            return str(python)
        for stale in envs.glob(f"{digest}.tmp-*"):  # left by a builder that crashed
            shutil.rmtree(stale, ignore_errors=True)
        building = envs / f"{digest}.tmp-{os.getpid()}"
        building.mkdir()
        log(f"{what}: building an environment on {base_python} in {final}")
        if requirements is None:
            # The build sees the folder it builds at its own path: the lines go there.
            listed = building / "requirements-layer.txt"
            listed.write_bytes(lines)
            named, cwd = str(listed), building
        else:
            # By name: the build runs in the code folder, wherever the sandbox shows it.
            named, cwd = requirements.name, requirements.parent
        # By path, with -I: the base interpreter need not have trainport installed.
        argv = [base_python, "-I", str(Path(__file__).with_name("envbuild.py"))]
        if requirements is None:
            # A framework image's lines may carry steps beyond pip's (envbuild's
            # docstring); a source's requirements.txt never does.
            argv.append("--layer-steps")
        argv += [str(building), str(final), named, *base["site"]]
        try:
            if build is None:
                _run_logged(argv, log, "building the environment", cwd=cwd)
            else:
                build(argv, building)
            os.rename(building, final)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return str(python)


def _base_info(base_python: str, *, isolated: bool = False) -> dict[str, Any]:
    flags = ["-I", "-S"] if isolated else []
    try:
        out = subprocess.run(
            [base_python, *flags, "-c", _BASE_INFO], capture_output=True, text=True, check=True
        ).stdout
        info: dict[str, Any] = json.loads(out)
    except (OSError, subprocess.CalledProcessError, ValueError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise ValidationError(
            f"base interpreter {base_python} cannot be run to find its site-packages "
            f"({detail.strip()[-500:]}); point trainport at a working Python"
        ) from exc
    return info


def _run_logged(
    argv: list[str], log: Callable[[str], None], what: str, cwd: Path | None = None
) -> None:
    """Run ``argv``, streaming its output lines to ``log``; a failure names ``what``."""
    tail: deque[str] = deque(maxlen=20)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        for raw in proc.stdout or ():
            line = raw.rstrip("\n")
            tail.append(line)
            log(line)
        code = proc.wait()
    if code != 0:
        where = f" in {cwd}" if cwd is not None else ""
        raise ValidationError(
            f"{what}{where} failed with exit code {code}; fix requirements.txt in the source "
            "directory. Last lines of output:\n" + "\n".join(tail)
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
