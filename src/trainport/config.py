"""Configuration, read in one place and at call time (never at import).

Everything trainport keeps lives under ``TRAINPORT_HOME`` (default ``~/.trainport``):

- ``store/<bucket>/<key>``: the embedded object store, used when no S3 endpoint is configured;
- ``trainport.db``: the job records (SQLite);
- ``jobs/<name>/``: each job's working directory (its ``/opt/ml`` tree per host) and logs;
- ``envs/<hash>/``: cached script-mode environments keyed by ``requirements.txt``.

The object store is S3-compatible as soon as ``TRAINPORT_STORE=s3`` or one of the standard AWS
endpoint variables (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``) is set; credentials and
region then come from the usual AWS configuration chain.

``TRAINPORT_RUNNER=ray`` places a job's hosts on the nodes of the Ray cluster that
``RAY_ADDRESS`` names (``ray.init``'s own default when unset).

A job gets none of these variables (see :mod:`trainport.host.jobenv`). Jobs that must reach
a store get credentials as SageMaker gives a role's: the operator maps each ``RoleArn`` to
credentials in a JSON file, ``TRAINPORT_ROLE_CREDENTIALS`` or else
``$TRAINPORT_HOME/roles.json`` (see :func:`load_role_credentials`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainport.errors import ValidationError
from trainport.instances import parse_instance_types

__all__ = [
    "ClientKey",
    "RoleCredentials",
    "Settings",
    "client_key",
    "load_role_credentials",
    "load_settings",
]

DEFAULT_STOP_GRACE_SECONDS = 120.0
DEFAULT_CHECKPOINT_SYNC_SECONDS = 30.0
DEFAULT_MAX_SOURCEDIR_MB = 512
# Where a job's hosts run and what contains them; "ray" places them on a Ray cluster's
# nodes, where each is contained as "auto" would on that node.
RUNNERS = ("auto", "sandbox", "process", "ray")
ROLE_CREDENTIALS_FILE = "roles.json"  # under TRAINPORT_HOME, unless the variable names one
_ROLE_FIELDS = {
    "AccessKeyId": "AWS_ACCESS_KEY_ID",
    "SecretAccessKey": "AWS_SECRET_ACCESS_KEY",
    "SessionToken": "AWS_SESSION_TOKEN",
    "EndpointUrl": "AWS_ENDPOINT_URL",
    "Region": "AWS_DEFAULT_REGION",
}
_ROLE_REQUIRED = ("AccessKeyId", "SecretAccessKey")


@dataclass(frozen=True)
class RoleCredentials:
    """What the jobs of one role get, as SageMaker hands a role's credentials to its jobs:
    the variables of the AWS configuration chain, by the names boto3 reads."""

    variables: tuple[tuple[str, str], ...] = field(repr=False)  # never in a log line

    def environment(self) -> dict[str, str]:
        return dict(self.variables)


@dataclass(frozen=True)
class Settings:
    home: Path
    store_kind: str  # "local" | "s3"
    s3_endpoint_url: str | None
    region: str
    account_id: str
    runner: str  # "auto" | "sandbox" | "process" | "ray"
    stop_grace_seconds: float
    checkpoint_sync_seconds: float
    download_workers: int
    # The server (``trainport server``) and clients of it.
    endpoint: str | None = None  # TRAINPORT_ENDPOINT: CLI commands go to this server
    server_keys: tuple[tuple[str, str], ...] = ()  # TRAINPORT_SERVER_KEYS: "AKID:SECRET,..."
    # TRAINPORT_SERVER_EXTRA_KEYS: more key pairs the server accepts besides its own (from
    # TRAINPORT_SERVER_KEYS or its key file), such as the S3 credentials the SageMaker SDK
    # also signs its CloudWatch Logs requests with.
    server_extra_keys: tuple[tuple[str, str], ...] = ()
    max_concurrent_jobs: int = 2  # TRAINPORT_MAX_CONCURRENT_JOBS
    # TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER=1: the server accepts jobs under the process
    # runner, which isolates nothing (any client with a key could then read the keys).
    server_allow_process_runner: bool = False
    # TRAINPORT_SERVER_ALLOW_HOST_PATHS=1: a request sent to the server may name files of
    # the server's machine to run (an image folder, a script path), which the sandbox then
    # shows the job read-only. Off, such a request is refused: a client could otherwise
    # read any host file it can name.
    server_allow_host_paths: bool = False
    # TRAINPORT_REQUIRE_ISOLATION=1: a job's hosts must run contained; a Ray node that
    # cannot make a sandbox fails the job instead of running it unisolated. The server sets
    # it for the supervisors of the jobs it takes unless it allows the process runner.
    require_isolation: bool = False
    # TRAINPORT_MAX_SOURCEDIR_MB: the most a job's source tarball may unpack to, so a gzip
    # bomb is refused at submission instead of filling the disk.
    max_sourcedir_bytes: int = DEFAULT_MAX_SOURCEDIR_MB << 20
    # RAY_ADDRESS: the cluster the ray runner places hosts on (None: ray.init's default).
    ray_address: str | None = None
    # TRAINPORT_RAY_INSTANCE_TYPES: JSON sizes of instance types (CPUs, GPUs, memory) for
    # the ray runner, beside or over its own table (trainport.instances).
    ray_instance_types: str = ""
    # The embedded store's folder when it is not under ``home``: a host agent on a Ray
    # node keeps its work under a home of its own but reads the submitter's store.
    store_dir: Path | None = None
    # Where framework and requirements environments are built and cached
    # (TRAINPORT_ENVS_DIR; ``home``/envs by default): several homes may share one.
    envs_root: Path | None = None
    # RoleArn -> the credentials its jobs get (TRAINPORT_ROLE_CREDENTIALS, or roles.json
    # under home); a role not listed gets none.
    role_credentials: tuple[tuple[str, RoleCredentials], ...] = ()
    # A client of a server (see trainport.client): TRAINPORT_ACCESS_KEY_ID and
    # TRAINPORT_SECRET_ACCESS_KEY; the AWS profile TRAINPORT_PROFILE (default "trainport")
    # in the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials);
    # TRAINPORT_AWS_CREDENTIALS=1: sign with the user's AWS credentials instead.
    client_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    client_profile: str = "trainport"
    client_profile_explicit: bool = False
    shared_credentials_file: Path | None = None
    use_aws_credentials: bool = False

    def credentials_for(self, role_arn: str | None) -> RoleCredentials | None:
        return dict(self.role_credentials).get(role_arn or "")

    @property
    def store_root(self) -> Path:
        return self.store_dir or self.home / "store"

    @property
    def db_path(self) -> Path:
        return self.home / "trainport.db"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def envs_dir(self) -> Path:
        return self.envs_root or self.home / "envs"

    @property
    def server_keys_path(self) -> Path:
        return self.home / "server" / "keys.json"


def _server_keys(raw: str, name: str = "TRAINPORT_SERVER_KEYS") -> tuple[tuple[str, str], ...]:
    keys = []
    for item in raw.split(","):
        key_id, sep, secret = item.strip().partition(":")
        if not sep or not key_id or not secret:
            raise ValidationError(
                f"{name}: write each key as ACCESS_KEY_ID:SECRET, comma-separated"
            )
        keys.append((key_id, secret))
    return tuple(keys)


def _float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValidationError(f"{name}={raw!r} is not a number of seconds") from exc
    if not math.isfinite(value) or value < 0:
        raise ValidationError(f"{name}={raw!r} must be a finite number of seconds, at least 0")
    return value


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Read trainport's settings from the environment (``os.environ`` by default)."""
    env = dict(os.environ if env is None else env)
    home = Path(env.get("TRAINPORT_HOME") or Path.home() / ".trainport").expanduser().resolve()
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    store_kind = (env.get("TRAINPORT_STORE") or ("s3" if endpoint else "local")).lower()
    if store_kind not in ("local", "s3"):
        raise ValidationError(f"TRAINPORT_STORE={store_kind!r}: use 'local' or 's3'")
    runner = (env.get("TRAINPORT_RUNNER") or "auto").lower()
    if runner not in RUNNERS:
        raise ValidationError(
            f"TRAINPORT_RUNNER={runner!r}: use 'auto', 'sandbox', 'process' or 'ray'"
        )
    workers_raw = env.get("TRAINPORT_DOWNLOAD_WORKERS") or "16"
    if not workers_raw.isdigit() or int(workers_raw) < 1:
        raise ValidationError(
            f"TRAINPORT_DOWNLOAD_WORKERS={workers_raw!r} must be a positive integer"
        )
    return Settings(
        home=home,
        store_kind=store_kind,
        s3_endpoint_url=endpoint,
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        account_id=env.get("TRAINPORT_ACCOUNT_ID") or "000000000000",
        runner=runner,
        stop_grace_seconds=_float(env, "TRAINPORT_STOP_GRACE_SECONDS", DEFAULT_STOP_GRACE_SECONDS),
        checkpoint_sync_seconds=_float(
            env, "TRAINPORT_CHECKPOINT_SYNC_SECONDS", DEFAULT_CHECKPOINT_SYNC_SECONDS
        ),
        download_workers=int(workers_raw),
        endpoint=env.get("TRAINPORT_ENDPOINT") or None,
        server_keys=_server_keys(env["TRAINPORT_SERVER_KEYS"])
        if env.get("TRAINPORT_SERVER_KEYS")
        else (),
        server_extra_keys=_server_keys(
            env.get("TRAINPORT_SERVER_EXTRA_KEYS") or "", "TRAINPORT_SERVER_EXTRA_KEYS"
        )
        if env.get("TRAINPORT_SERVER_EXTRA_KEYS")
        else (),
        max_concurrent_jobs=_positive(env, "TRAINPORT_MAX_CONCURRENT_JOBS", 2),
        server_allow_process_runner=_flag(env, "TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER"),
        server_allow_host_paths=_flag(env, "TRAINPORT_SERVER_ALLOW_HOST_PATHS"),
        require_isolation=_flag(env, "TRAINPORT_REQUIRE_ISOLATION"),
        max_sourcedir_bytes=(
            _positive(env, "TRAINPORT_MAX_SOURCEDIR_MB", DEFAULT_MAX_SOURCEDIR_MB) << 20
        ),
        ray_address=env.get("RAY_ADDRESS") or None,
        ray_instance_types=_instance_types(env.get("TRAINPORT_RAY_INSTANCE_TYPES") or ""),
        role_credentials=load_role_credentials(env, home),
        client_keys=_client_keys(env),
        client_profile=env.get("TRAINPORT_PROFILE") or "trainport",
        client_profile_explicit=bool(env.get("TRAINPORT_PROFILE")),
        shared_credentials_file=Path(
            env.get("AWS_SHARED_CREDENTIALS_FILE") or Path.home() / ".aws" / "credentials"
        ).expanduser(),
        use_aws_credentials=_flag(env, "TRAINPORT_AWS_CREDENTIALS"),
        envs_root=(
            Path(env["TRAINPORT_ENVS_DIR"]).expanduser().resolve()
            if env.get("TRAINPORT_ENVS_DIR")
            else None
        ),
    )


def _client_keys(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    key_id = env.get("TRAINPORT_ACCESS_KEY_ID") or ""
    secret = env.get("TRAINPORT_SECRET_ACCESS_KEY") or ""
    if bool(key_id) != bool(secret):
        missing = "TRAINPORT_SECRET_ACCESS_KEY" if key_id else "TRAINPORT_ACCESS_KEY_ID"
        raise ValidationError(
            f"{missing} is not set: set TRAINPORT_ACCESS_KEY_ID and "
            "TRAINPORT_SECRET_ACCESS_KEY together (the key `trainport server` printed)"
        )
    return ((key_id, secret),) if key_id else ()


@dataclass(frozen=True)
class ClientKey:
    """The key a client signs its requests to a server with, and where it was found (said
    in an error when the server does not accept it)."""

    key_id: str
    secret: str = field(repr=False)
    source: str
    token: str | None = field(default=None, repr=False)


def client_key(settings: Settings) -> ClientKey | None:
    """A key for a trainport server, in the order :mod:`trainport.client` lists; None when
    nothing of trainport's names one (the user's AWS credentials are not looked at)."""
    if settings.client_keys:
        key_id, secret = settings.client_keys[0]
        return ClientKey(key_id, secret, "TRAINPORT_ACCESS_KEY_ID")
    if settings.client_profile_explicit:
        return _profile_key(settings, required=True)
    if settings.server_keys:
        key_id, secret = settings.server_keys[0]
        return ClientKey(key_id, secret, "TRAINPORT_SERVER_KEYS")
    path = settings.server_keys_path
    if path.exists():
        try:
            first = json.loads(path.read_text())["AccessKeys"][0]
            key_id, secret = first["AccessKeyId"], first["SecretAccessKey"]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ValidationError(
                f"the server's key file {path} cannot be read ({exc}); set "
                "TRAINPORT_ACCESS_KEY_ID/TRAINPORT_SECRET_ACCESS_KEY instead"
            ) from exc
        return ClientKey(key_id, secret, f"the server's key file {path}")
    return _profile_key(settings, required=False)


def _profile_key(settings: Settings, *, required: bool) -> ClientKey | None:
    import configparser

    name, path = settings.client_profile, settings.shared_credentials_file
    parser = configparser.RawConfigParser()
    try:
        parser.read(path) if path is not None else None
    except configparser.Error as exc:
        raise ValidationError(f"the AWS credentials file {path} cannot be read: {exc}") from exc
    if parser.has_section(name):
        key_id = parser.get(name, "aws_access_key_id", fallback="")
        secret = parser.get(name, "aws_secret_access_key", fallback="")
        if key_id and secret:
            return ClientKey(key_id, secret, f"profile {name} in {path}")
        raise ValidationError(
            f"profile {name} in {path} needs aws_access_key_id and aws_secret_access_key"
        )
    if required:
        raise ValidationError(
            f"TRAINPORT_PROFILE={name}: no such profile in {path}; add a [{name}] section "
            "with aws_access_key_id and aws_secret_access_key"
        )
    return None


def load_role_credentials(
    env: dict[str, str], home: Path
) -> tuple[tuple[str, RoleCredentials], ...]:
    """The operator's map of role ARNs to credentials, read from the JSON file that
    ``TRAINPORT_ROLE_CREDENTIALS`` names, else ``home/roles.json`` if it exists::

        {"arn:aws:iam::111122223333:role/trainer": {
            "AccessKeyId": "...", "SecretAccessKey": "...",
            "SessionToken": "...", "EndpointUrl": "http://127.0.0.1:9000", "Region": "us-east-1"}}

    SessionToken, EndpointUrl and Region are optional. Anything malformed is an error that
    names the file and what is wrong with it."""
    named = env.get("TRAINPORT_ROLE_CREDENTIALS") or ""
    path = Path(named).expanduser() if named else home / ROLE_CREDENTIALS_FILE
    if not named and not path.exists():
        return ()
    where = f"role credentials file {path}" + (" (TRAINPORT_ROLE_CREDENTIALS)" if named else "")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValidationError(f"{where}: cannot read it: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ValidationError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValidationError(f"{where}: must be a JSON object mapping role ARNs to credentials")
    return tuple((arn, _role(where, arn, entry)) for arn, entry in doc.items())


def _role(where: str, arn: str, entry: Any) -> RoleCredentials:
    if not arn.startswith("arn:") or ":role/" not in arn:
        raise ValidationError(
            f"{where}: {arn!r} is not a role ARN (arn:aws:iam::ACCOUNT:role/NAME)"
        )
    if not isinstance(entry, dict):
        raise ValidationError(
            f"{where}: {arn}: must be an object with AccessKeyId and SecretAccessKey"
        )
    unknown = sorted(set(entry) - set(_ROLE_FIELDS))
    if unknown:
        raise ValidationError(
            f"{where}: {arn}: unknown field(s) {', '.join(unknown)}; use " + ", ".join(_ROLE_FIELDS)
        )
    missing = [k for k in _ROLE_REQUIRED if k not in entry]
    if missing:
        raise ValidationError(f"{where}: {arn}: {' and '.join(missing)} missing")
    for key, value in entry.items():
        if not isinstance(value, str) or not value or "\n" in value or "\0" in value:
            raise ValidationError(f"{where}: {arn}: {key} must be a non-empty one-line string")
    url = entry.get("EndpointUrl", "http://")
    if not url.startswith(("http://", "https://")):
        raise ValidationError(f"{where}: {arn}: EndpointUrl {url!r} must start with http(s)://")
    return RoleCredentials(tuple((_ROLE_FIELDS[k], v) for k, v in entry.items()))


def _instance_types(raw: str) -> str:
    """The raw JSON, once it parses."""
    if raw.strip():
        parse_instance_types(raw)
    return raw


def _flag(env: dict[str, str], name: str) -> bool:
    raw = (env.get(name) or "0").strip().lower()
    if raw not in ("0", "1", "true", "false", "yes", "no"):
        raise ValidationError(f"{name}={raw!r}: use 1 or 0")
    return raw in ("1", "true", "yes")


def _positive(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name) or str(default)
    if not raw.isdigit() or int(raw) < 1:
        raise ValidationError(f"{name}={raw!r} must be a positive integer")
    return int(raw)


def container_engine_setting(env: dict[str, str] | None = None) -> str:
    """TRAINPORT_CONTAINER_ENGINE: auto (podman, else docker whose daemon answers), none,
    or an engine's name or path."""
    env = dict(os.environ if env is None else env)
    return env.get("TRAINPORT_CONTAINER_ENGINE", "auto").strip() or "auto"
