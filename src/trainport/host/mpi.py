"""MPI launch across a job's hosts, as SageMaker's training toolkit does it, without ssh.

SageMaker runs ``mpirun`` on algo-1 over every host (``-H algo-1:P,algo-2:P,... -np N*P``)
while the other hosts wait for it, and mpirun reaches them over ssh. trainport gives mpirun
a launch agent of its own instead (``plm_rsh_agent``): mpirun calls it as
``agent HOST orted ...`` once per host, and the agent (:mod:`trainport.host.mpi_launch`, run
inside algo-1's confinement) asks the supervisor, through a Unix socket in algo-1's tree,
to start that daemon on HOST. There the host's agent, which has been waiting for exactly
this, runs it as its training command: inside that host's own sandbox and network, with
that host's environment (so each rank sees the ``SM_*`` variables of its own host, which
orted hands down) and its own log. The socket accepts only the job's token and only the
job's own hosts, each once; nobody configures ssh, and a job's ranks reach only its hosts.

mpirun prefixes every chunk of rank output with ``[job,rank]<stream>:`` (``--tag-output``);
:class:`RankDemux` splits algo-1's stream back into each rank's lines and routes them to
the log of the host the rank runs on (``-map-by slot``: ranks ``k*P .. k*P+P-1`` on host k).
``orte_abort_on_non_zero_status`` makes one failed rank end the run; :func:`failure_reason`
reads which rank and host from mpirun's report.

The pure parts (settings, the command line, routing, the failure report) are here; the
socket service is :class:`LaunchBoard`.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import queue
import re
import secrets
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainport.errors import ValidationError
from trainport.host import jobtree
from trainport.host.mpi_launch import ENV_HOST, ENV_SHM, ENV_SOCKET, ENV_TOKEN, VADER_DIR
from trainport.spec import JobSpec

__all__ = [
    "ENV_HOST",
    "ENV_SHM",
    "VADER_DIR",
    "LaunchBoard",
    "LaunchRelay",
    "LaunchRequest",
    "MpiSettings",
    "RankDemux",
    "check",
    "failure_reason",
    "job_map",
    "mpi_settings",
    "mpirun_command",
    "rank_host",
]

log = logging.getLogger(__name__)

HP_ENABLED = "sagemaker_mpi_enabled"
HP_PROCESSES = "sagemaker_mpi_num_of_processes_per_host"
HP_OPTIONS = "sagemaker_mpi_custom_mpi_options"
TAG_OPTIONS = "trainport:mpi-options"

# Each host's shared-memory segments go in a folder of its own: hosts on one machine share
# /dev/shm, and OpenMPI names segments by host name, which is the machine's for all of them.
# A daemon's host sets VADER_DIR for it; algo-1's mpirun gets ENV_SHM instead (see there).
# trainport's own folder in each host's tree (the launch socket, the shared-memory folder):
# inside the tree so that it is reachable from inside the host's sandbox.
PRIVATE = ".trainport"
# How long a daemon may outlive the mpirun that asked for it before its host ends it.
DAEMON_GRACE = 10.0

_PACKAGE_HINT = (
    "install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin; or run scripts/setup.sh --test)"
)


@dataclass(frozen=True)
class MpiSettings:
    """What the request asks of MPI."""

    processes_per_host: int | None  # None: the host's GPU count, else 1
    custom_options: tuple[str, ...] = ()
    gpu_cap: int | None = None  # at most this many GPUs' processes (SMDDP: the instance's)

    def processes_on(self, host_gpus: int) -> int:
        """The setting, else one per GPU of the host's share (at most ``gpu_cap``), else 1."""
        gpus = host_gpus if self.gpu_cap is None else min(host_gpus, self.gpu_cap)
        return self.processes_per_host or gpus or 1


def _plain(value: str | None) -> str:
    """A hyperparameter as the SDK sends it (JSON-encoded) or as a person writes it."""
    if value is None:
        return ""
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    return str(decoded).lower() if isinstance(decoded, bool) else str(decoded)


plain_value = _plain  # for the other launches that read the SDK's settings


def mpi_settings(spec: JobSpec) -> MpiSettings | None:
    """The job's MPI settings, or None when it does not ask for MPI (SMDDP jobs, whose launch
    is an MPI one too, are read by :mod:`trainport.host.smddp`; ask
    :func:`trainport.host.launch_kind.mpi_launch_settings` for either).

    SageMaker's hyperparameters (``sagemaker_mpi_enabled``, ``..._num_of_processes_per_host``,
    ``..._custom_mpi_options``) or trainport's tags (``trainport:distribution=mpi``,
    ``trainport:processes-per-host``, ``trainport:mpi-options``); the tags win.
    """
    hps = spec.hyperparameters
    enabled = _plain(hps.get(HP_ENABLED)).lower() == "true"
    if not (enabled or spec.tags.get("trainport:distribution") == "mpi"):
        return None
    per_host = spec.processes_per_host
    if per_host is None and hps.get(HP_PROCESSES) is not None:
        raw = _plain(hps.get(HP_PROCESSES))
        if not raw.isdigit() or not 1 <= int(raw) <= 64:
            raise ValidationError(
                f"HyperParameters.{HP_PROCESSES}={raw!r} must be a whole number from 1 to 64"
            )
        per_host = int(raw)
    options = spec.tags.get(TAG_OPTIONS)
    field_name = f"Tags: {TAG_OPTIONS}"
    if options is None:
        options, field_name = _plain(hps.get(HP_OPTIONS)), f"HyperParameters.{HP_OPTIONS}"
    try:
        custom = tuple(shlex.split(options))
    except ValueError as exc:
        raise ValidationError(f"{field_name}: cannot split {options!r}: {exc}") from exc
    return MpiSettings(per_host, custom)


def check(spec: JobSpec, entry: str | None) -> None:
    """Refuse at submission what cannot launch: no mpirun here, or MPI with torchrun."""
    settings = mpi_settings(spec)
    if settings is None:
        return
    if spec.torch_distributed:
        raise ValidationError(
            "the job asks for both MPI and torchrun; choose one (sagemaker_mpi_enabled or "
            "trainport:distribution)"
        )
    if entry is None:
        raise ValidationError(
            "MPI launch runs a script-mode entry point: set sagemaker_program and "
            "sagemaker_submit_directory (trainport run --entry-point)"
        )
    if shutil.which("mpirun") is None:
        raise ValidationError(f"the job asks for MPI but mpirun is not on PATH: {_PACKAGE_HINT}")


def mpirun_command(
    *,
    hosts: Sequence[str],
    per_host: int,
    interface: str,
    agent: Sequence[str],
    program: Sequence[str],
    custom_options: Sequence[str] = (),
) -> list[str]:
    """mpirun over every host with the toolkit's options, reaching hosts through ``agent``."""
    command = [
        "mpirun",
        "--host", ",".join(f"{host}:{per_host}" for host in hosts),
        "-np", str(len(hosts) * per_host),
        # Jobs run as root inside their sandbox (as SageMaker's containers do).
        "--allow-run-as-root",
        # No --display-map: mpirun hands the map's display to every daemon, which prints it
        # again into its host's log; the agent logs job_map() once instead.
        "--tag-output",
        # Keep each daemon a child of its launch (no fork into the background), so the
        # host that runs it waits for it and signals reach it.
        "--leave-session-attached",
        "-mca", "plm_rsh_agent", " ".join(agent),
        "-mca", "plm_rsh_no_tree_spawn", "1",
        "-mca", "btl_tcp_if_include", interface,
        "-mca", "oob_tcp_if_include", interface,
        "-bind-to", "none",
        "-map-by", "slot",
        "-mca", "pml", "ob1",
        "-mca", "btl", "^openib",
        "-mca", "orte_abort_on_non_zero_status", "1",
        "-mca", "btl_vader_single_copy_mechanism", "none",
        # Daemons do not share their hardware topology with their ranks through shared
        # memory mapped at the "biggest hole" of their address space: orted now and then
        # chose a hole beside its stack and died of SIGSEGV writing there (about 1 start
        # in 10 here); ranks read the topology themselves instead.
        "-mca", "rtc_hwloc_vmhole", "none",
        "-x", f"NCCL_SOCKET_IFNAME={interface}",
        *custom_options,
        *program,
    ]  # fmt: skip
    return command


def job_map(hosts: Sequence[str], per_host: int) -> str:
    """Where each rank runs under ``-map-by slot``, in one line for the leader's log."""
    places = []
    for index, host in enumerate(hosts):
        first, last = index * per_host, index * per_host + per_host - 1
        places.append(f"{host} rank {first}" if first == last else f"{host} ranks {first}-{last}")
    return (
        f"MPI job map: {len(hosts) * per_host} ranks, {per_host} per host, by slot: "
        + ", ".join(places)
    )


def rank_host(hosts: Sequence[str], per_host: int) -> Callable[[int], str | None]:
    """Which host a rank runs on under ``-map-by slot`` with ``per_host`` slots each."""

    def host_of(rank: int) -> str | None:
        index = rank // per_host
        return hosts[index] if 0 <= index < len(hosts) else None

    return host_of


_TAG = re.compile(rb"\[\d+,(\d+)\]<(?:stdout|stderr|stddiag)>:")


@dataclass
class RankDemux:
    """Split mpirun's tagged output into (host, line) pairs, a line per rank per newline.

    mpirun tags each chunk a rank wrote, not each line, so one line of algo-1's stream can
    hold pieces of several ranks' lines; each rank's pieces are joined until its newline.
    Untagged text is mpirun's own and stays on algo-1 (host ``None``).
    """

    host_of: Callable[[int], str | None]
    _partial: dict[int, bytes] = field(default_factory=dict)

    def feed(self, raw: bytes) -> list[tuple[str | None, bytes]]:
        out: list[tuple[str | None, bytes]] = []
        marks = list(_TAG.finditer(raw))
        head = raw[: marks[0].start()] if marks else raw
        if head.strip():
            out.append((None, head.rstrip(b"\n")))
        for i, mark in enumerate(marks):
            rank = int(mark.group(1))
            end = marks[i + 1].start() if i + 1 < len(marks) else len(raw)
            text = self._partial.pop(rank, b"") + raw[mark.end() : end]
            *lines, rest = text.split(b"\n")
            out.extend((self.host_of(rank), line) for line in lines)
            if rest:
                self._partial[rank] = rest
        return out

    def flush(self) -> list[tuple[str | None, bytes]]:
        left = [(self.host_of(rank), text) for rank, text in sorted(self._partial.items())]
        self._partial.clear()
        return left


_NOTICED = re.compile(
    r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \(([^)]*)\))?"
)
_PROCESS = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_EXIT = re.compile(r"Exit code:\s*(-?\d+)")
_NODE_LOST = re.compile(r"Remote daemon:\s*\S+ on node (\S+)")
_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank (\d+) in communicator \S+\s+with errorcode (-?\d+)"
)


def failure_reason(
    lines: Sequence[str],
    host_of: Callable[[int], str | None],
    code: int,
    notes: Sequence[str] = (),
) -> str:
    """What ended an MPI run, naming the rank and its host, from mpirun's own report, or
    from the notes failing ranks left when that report names no rank."""
    text = "\n".join(lines)
    if match := _NOTICED.search(text):
        rank, node, signal_no, name = match.groups()
        what = f"signal {signal_no}" + (f" ({name})" if name else "")
        return f"AlgorithmError: MPI rank {rank} on host {node} was killed by {what}"
    if match := _ABORT.search(text):
        rank = int(match.group(1))
        said = next(
            (f": {n['error']}" for n in _well_formed(notes) if n["rank"] == rank and n["error"]),
            "; its log has the cause",
        )
        return (
            f"AlgorithmError: MPI rank {rank} on host {host_of(rank) or '?'} aborted the run "
            f"(MPI_Abort, error code {match.group(2)}){said}"
        )
    if (rank_match := _PROCESS.search(text)) and (exit_match := _EXIT.search(text)):
        rank = int(rank_match.group(1))
        host = host_of(rank) or "?"
        notes_of = (f": {n['error']}" for n in _well_formed(notes) if n["rank"] == rank)
        said = next((n for n in notes_of if n != ": "), "")  # its uncaught exception, if noted
        code_text = exit_match.group(1)
        return f"AlgorithmError: MPI rank {rank} on host {host} exited with code {code_text}{said}"
    if note := first_rank_note(notes):
        rank = note["rank"]
        said = f": {note['error']}" if note.get("error") else ""
        return (
            f"AlgorithmError: MPI rank {rank} on host {host_of(rank) or '?'} exited with code "
            f"{note['code']}{said} (mpirun itself ended with code {code})"
        )
    if match := _NODE_LOST.search(text):
        return f"AlgorithmError: mpirun lost the MPI daemon on host {match.group(1)}"
    tail = [line for line in lines if line.strip()][-5:]
    return f"AlgorithmError: mpirun exited with code {code}: " + " | ".join(tail)


def first_rank_note(notes: Sequence[str]) -> dict[str, Any] | None:
    """The earliest well-formed note a failing rank left (see :mod:`mpi_rank`)."""
    return min(_well_formed(notes), key=lambda note: note["time"], default=None)


def _well_formed(notes: Sequence[str]) -> list[dict[str, Any]]:
    """The notes that parse and have their fields' types; a job wrote them."""
    found: list[dict[str, Any]] = []
    for raw in notes:
        try:
            note = json.loads(raw)
        except ValueError:
            continue
        if (
            isinstance(note, dict)
            and type(note.get("rank")) is int
            and type(note.get("code")) is int
            and isinstance(note.get("time"), (int, float))
            and isinstance(note.get("error", ""), str)
        ):
            found.append({**note, "error": note.get("error", "")[:500]})
    return found


def rank_notes(folders: Sequence[Path]) -> list[str]:
    """The rank notes in each host's ``ranks`` folder, read without following links."""
    texts: list[str] = []
    for folder in folders:
        with jobtree.open_folder(folder) as opened:
            names = sorted(os.listdir(opened))[:256] if opened is not None else []
        for name in names:
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            if (text := jobtree.read_text(folder / name, 2000)) is not None:
                texts.append(text)
    return texts


# -- the launch service (effects) -------------------------------------------------------------


class LaunchRequest:
    """One daemon mpirun wants started on a host; the host's agent runs it."""

    def __init__(self, host: str, command: str) -> None:
        self.host = host
        self.command = command
        self.cancelled = threading.Event()  # the launch agent went away: end the command
        self._exit: queue.SimpleQueue[int] = queue.SimpleQueue()

    def finish(self, code: int) -> None:
        self._exit.put(code)

    def wait(self) -> int:
        return self._exit.get()


class LaunchRelay(Protocol):
    """Carries launches from the leader's board to agents in other processes or machines."""

    def launch(self, request: LaunchRequest) -> None:
        """Start ``request``'s daemon on its host and return at once; the relay finishes
        ``request`` with the daemon's exit code, and ends the daemon if ``request`` is
        cancelled first."""

    def close(self) -> None:
        """The leader's run has ended: hosts still waiting for a launch give up."""


def has_mpi4py() -> bool:
    """Whether the job's interpreter can run ``-m mpi4py`` (it layers on this one)."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


class LaunchBoard:
    """The supervisor's side of the launch agent: a socket and a queue per host.

    The leader's agent starts it with a folder inside its own tree (the socket must be
    reachable from inside its sandbox); the socket is bound through ``/proc/self/fd`` so
    that long job paths do not hit the 108-byte limit of a socket address.

    The socket is the job's to reach, and the job's code holds the token, so the board
    bounds what a connection may cost: it serves at most ``slots`` at once (one thread
    each; one launch per other host needs far fewer) and closes any beyond; a connection
    must send its whole request within ``request_seconds`` or is closed.
    """

    MAX_REQUEST = 1 << 20
    REQUEST_SECONDS = 5.0

    def __init__(self, hosts: Sequence[str], relay: LaunchRelay | None = None) -> None:
        self.hosts = tuple(hosts)
        # Where the other hosts' agents are not in this process (a Ray cluster), the
        # leader's board relays each launch to them instead of queueing it here.
        self.relay = relay
        self.token = secrets.token_hex(16)
        self.path: Path | None = None
        self._closed_at: float | None = None
        self._queues: dict[str, queue.SimpleQueue[LaunchRequest | None]] = {
            h: queue.SimpleQueue() for h in self.hosts[1:]
        }
        self._launched: set[str] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._server: socket.socket | None = None
        self.request_seconds = self.REQUEST_SECONDS
        self.slots = 2 * len(self.hosts) + 4
        self._free = threading.BoundedSemaphore(self.slots)
        self._said_full = False

    def environment(self, socket_in_job: str) -> dict[str, str]:
        """What the leader's training command needs to reach the board."""
        return {ENV_SOCKET: socket_in_job, ENV_TOKEN: self.token}

    def start(self, socket_dir: Path) -> None:
        socket_dir.mkdir(parents=True, exist_ok=True)
        self.path = socket_dir / "launch.sock"
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        fd = os.open(socket_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(f"/proc/self/fd/{fd}/{self.path.name}")
        finally:
            os.close(fd)
        # The job may run as another uid inside its sandbox; the token is the guard.
        os.chmod(self.path, 0o666)
        server.listen(len(self.hosts))
        self._server = server
        threading.Thread(target=self._accept, name="mpi-launch", daemon=True).start()

    def ended_for(self, seconds: float) -> bool:
        """Whether the leader's run ended at least ``seconds`` ago."""
        return self._closed_at is not None and time.monotonic() - self._closed_at >= seconds

    def close(self) -> None:
        """No more launches: hosts still waiting for one give up."""
        if self._closed_at is None:
            self._closed_at = time.monotonic()
            if self.relay is not None:
                self.relay.close()
        self._closed.set()
        for waiting in self._queues.values():
            waiting.put(None)
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def deliver(self, request: LaunchRequest) -> bool:
        """Queue a launch relayed from the leader's board for this host's agent; False if
        that host was launched already or the run has ended."""
        with self._lock:
            if request.host in self._launched or self._closed.is_set():
                return False
            self._launched.add(request.host)
        self._queues[request.host].put(request)
        return True

    def wait_for(self, host: str, stop: threading.Event) -> LaunchRequest | None:
        """The daemon to run on ``host``, once mpirun asks; None if the run ended first."""
        waiting = self._queues[host]
        while not stop.is_set():
            try:
                request = waiting.get(timeout=0.2)
            except queue.Empty:
                continue
            return request
        return None

    def _accept(self) -> None:
        assert self._server is not None  # set by start()
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if not self._free.acquire(blocking=False):
                if not self._said_full:  # once: a flood must not flood the log too
                    self._said_full = True
                    log.warning(
                        "mpi launch board: all %d connections busy; closing more", self.slots
                    )
                conn.close()
                continue
            try:
                threading.Thread(
                    target=self._serve, args=(conn,), name="mpi-launch-conn", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had: this connection is not served
                self._free.release()
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_one(conn)
        finally:
            self._free.release()

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            request = self._read(conn)
            if request is None:
                return
            if self.relay is not None:
                self.relay.launch(request)
            else:
                self._queues[request.host].put(request)
            done: list[int] = []
            finisher = threading.Thread(target=lambda: done.append(request.wait()), daemon=True)
            finisher.start()
            # The agent keeps the connection open while the daemon runs: its end (mpirun
            # killed it) must end the daemon too.
            conn.settimeout(0.2)
            while finisher.is_alive():
                try:
                    if conn.recv(1) == b"":
                        request.cancelled.set()
                        break
                except TimeoutError:
                    continue
                except OSError:
                    request.cancelled.set()
                    break
            finisher.join()
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": done[0]}).encode() + b"\n")

    def _read(self, conn: socket.socket) -> LaunchRequest | None:
        deadline = time.monotonic() + self.request_seconds
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                return None  # idle, or trickling: its slot goes to others
            conn.settimeout(left)
            try:
                chunk = conn.recv(65536)
            except OSError:  # TimeoutError included
                return None
            if not chunk or len(data) > self.MAX_REQUEST:
                return None
            data += chunk
        try:
            doc = json.loads(data)
            token, host, command = str(doc["token"]), str(doc["host"]), str(doc["command"])
        except (ValueError, KeyError, TypeError):
            return self._refuse(conn, "malformed launch request")
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return self._refuse(conn, "wrong token")
        if host not in self._queues:
            return self._refuse(conn, f"{host!r} is not another host of this job")
        with self._lock:
            if host in self._launched or self._closed.is_set():
                return self._refuse(conn, f"{host} was already launched")
            self._launched.add(host)
        log.info("mpi: launching the daemon on %s", host)
        return LaunchRequest(host, command)

    @staticmethod
    def _refuse(conn: socket.socket, why: str) -> None:
        log.warning("mpi launch refused: %s", why)
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)  # a client that reads nothing holds no slot for long
            conn.sendall(json.dumps({"error": why}).encode() + b"\n")
        return None


def tail_lines(path: Path, limit: int = 200) -> Iterator[str]:
    """The last ``limit`` text lines of a host log (timestamps removed)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            data = f.read()
    except OSError:
        return iter(())
    lines = [raw.partition(b"\t")[2].decode("utf-8", "replace") for raw in data.splitlines()]
    return iter(lines[-limit:])
