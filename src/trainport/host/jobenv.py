"""The environment a job's processes start with: an allow-list, never its starter's.

Whoever starts trainport (a user's shell, ``trainport server``) has an environment full of
what a job must not get: cloud keys (the server's own among them), proxies, package index
settings, the virtual environment it runs in, SageMaker SDK settings. A job's processes get
only

- a fixed base: ``PATH`` (:func:`job_path`), a UTF-8 locale, a ``HOME`` and ``TMPDIR`` of
  the job's own, unbuffered Python output, and the interface the collective libraries bind
  to;
- the credentials of the job's role, where the operator maps it (see
  :func:`trainport.config.load_role_credentials`), as SageMaker hands a role's credentials
  to its jobs;
- the request's ``Environment``, over all of the above;
- the contract the platform adds after (``TRAINING_JOB_NAME``, ``SM_*``, GPUs, MPI).

:func:`job_environment` is a pure function of those pieces; the agent adds the contract.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from trainport.config import RoleCredentials

__all__ = [
    "CREDENTIAL_VARIABLES",
    "SYSTEM_PATH",
    "job_environment",
    "job_path",
    "role_environment",
]

# The system's standard folders.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOCALE = "C.UTF-8"
# One set of keys: a request that brings any of them brings its own credentials.
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def job_path() -> str:
    """A job's PATH: the folder of the interpreter trainport runs (as a framework
    container's own Python comes first on its PATH: ``python3`` is the one with the
    machine's training packages, on a Ray node that node's), then the system's folders.
    Script mode puts the job's own interpreter (a requirements environment) before both."""
    return os.pathsep.join([os.path.dirname(sys.executable), SYSTEM_PATH])


def role_environment(
    credentials: RoleCredentials | None, request: Mapping[str, str]
) -> dict[str, str]:
    """The role's variables a job gets, less those its request sets itself.

    On SageMaker a role's credentials come from the instance's metadata service, the last
    step of the AWS configuration chain, so ``AWS_*`` variables a user puts in the request's
    ``Environment`` are the user's own choice and win. The keys go as one set: a request
    that brings an access key gets none of the role's (the role's session token beside a
    user's key would break both)."""
    if credentials is None:
        return {}
    env = credentials.environment()
    if any(k in request for k in CREDENTIAL_VARIABLES):
        env = {k: v for k, v in env.items() if k not in CREDENTIAL_VARIABLES}
    return {k: v for k, v in env.items() if k not in request}


def job_environment(
    *,
    request: Mapping[str, str],
    home: str,
    interface: str,
    credentials: RoleCredentials | None = None,
    tmpdir: str = "/tmp",
    path: str = SYSTEM_PATH,
) -> dict[str, str]:
    """The environment of a job's training command before the contract's variables: the
    fixed base, the role's credentials and the request's ``Environment``, nothing else."""
    env = {
        "PATH": path,
        "LANG": LOCALE,
        "HOME": home,
        "TMPDIR": tmpdir,
        "PYTHONUNBUFFERED": "1",
        # Collective libraries pick their interface from the hostname, which resolves to
        # the machine's address, not the host's: name the host's interface instead.
        "GLOO_SOCKET_IFNAME": interface,
        "NCCL_SOCKET_IFNAME": interface,
    }
    if not any(k == "LANG" or k.startswith("LC_") for k in request):
        env["LC_ALL"] = LOCALE  # a request that chose a locale keeps it whole
    env.update(role_environment(credentials, request))
    env.update(request)
    return env
