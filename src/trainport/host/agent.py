"""The host agent: one host's whole life, reported as events.

``HostAgent.run`` goes Downloading -> Training -> Uploading and returns how the training
process ended. Everything it has to tell happens through ``report`` as the plain-data events
of :mod:`trainport.host.events`, so the agent runs the same in the supervisor's process or
on a cluster node (see :mod:`trainport.placement`). The supervisor above it owns job-level
policy (stop requests, max runtime, the status machine); it calls :meth:`HostAgent.terminate`
to stop, which forwards SIGTERM to the training process group, waits the grace period, then
sends SIGKILL.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trainport.config import RoleCredentials, Settings
from trainport.errors import TrainportError, ValidationError
from trainport.host import command as commands
from trainport.host import (
    diskspace,
    failure,
    framework_envs,
    frameworks,
    gpus,
    jobenv,
    jobtree,
    launch_kind,
    mpi,
    mpi_rank,
    pipe,
    smddp,
)
from trainport.host.artifacts import scratch_dir, upload_artifacts
from trainport.host.channels import (
    ChannelObject,
    object_order,
    resolve_channel,
    shard,
    stage_file_channel,
)
from trainport.host.checkpoints import CheckpointSync
from trainport.host.events import (
    HostEvent,
    LogLines,
    MetricsFound,
    StatusChanged,
    TrainingStarted,
    append_log_lines,
)
from trainport.host.layout import HostLayout, hosts_file_text, resource_config
from trainport.host.metrics import MetricMatcher
from trainport.host.phases import Finished, MetricPoint, Phase, Progress
from trainport.host.resources import ResourceSampler, ResourcesSampled
from trainport.runners.api import KILL, TERM, HostProcess, Placement, Runner
from trainport.runners.container import ContainerRunner
from trainport.runners.limits import Limits, host_limits
from trainport.spec import JobSpec
from trainport.store.api import ObjectStore, S3Uri

if TYPE_CHECKING:
    from trainport.host import fastfile

__all__ = ["HostAgent", "HostPlan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostPlan:
    """The blueprint of one host of a job."""

    spec: JobSpec
    arn: str
    host: str
    hosts: tuple[str, ...]
    job_dir: Path

    # Each host's address, as every host's /etc/hosts maps it: its namespace's on the job's
    # bridge, else a loopback address of its own.
    addresses: dict[str, str] = field(default_factory=dict)
    network_interface: str = "lo"
    netns: str | None = None  # the host's network namespace, if not the machine's
    network_note: str | None = None  # told in the Training status: why the network is shared
    # Multi-host jobs merge every host's model folder into one archive: the supervisor
    # uploads once all hosts are done, not each agent.
    upload_artifacts: bool = True
    # MPI jobs: where algo-1's mpirun asks for a daemon on each other host (one per job).
    mpi_board: mpi.LaunchBoard | None = None

    @property
    def host_index(self) -> int:
        return self.hosts.index(self.host)

    @property
    def layout(self) -> HostLayout:
        return HostLayout(self.job_dir / "hosts" / self.host)

    @property
    def log_path(self) -> Path:
        return self.job_dir / "logs" / f"{self.host}.log"

    @property
    def hosts_file(self) -> Path:
        return self.job_dir / "hosts" / f"{self.host}.etc-hosts"


TORCHRUN_PORT = 7777
# After the training process and its group are gone, how long its output may still flow.
_OUTPUT_DRAIN_SECONDS = 2.0
_MAX_LINE = 1 << 20


def _output_lines(stream: IO[bytes], ended: threading.Event) -> Iterator[bytes]:
    """The command's output, line by line, until EOF, or once ``ended`` is set, until
    nothing more is waiting (whoever still holds the pipe open is not waited for)."""
    fd = stream.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            if ended.is_set():
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line + b"\n" for line in lines)
        if len(pending) > _MAX_LINE:  # a "line" that never ends is logged in pieces
            yield pending + b"\n"
            pending = b""
    if pending:
        yield pending


class _Stopped(Exception):
    """A stop arrived before training started."""


class HostAgent:
    def __init__(
        self,
        plan: HostPlan,
        *,
        store: ObjectStore,
        runner: Runner,
        settings: Settings,
        report: Callable[[HostEvent], None],
    ) -> None:
        self.plan = plan
        self.store = store
        self.runner = runner
        self.settings = settings
        self.report = report
        # Matched in a process of its own: a user's Regex must not hold up this one.
        self.metrics = MetricMatcher(
            plan.spec.metric_definitions,
            on_points=self._metrics_found,
            on_warning=lambda message: self._log_line(f"[trainport] {message}"),
        )
        self._process: HostProcess | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # Pipe servers and FastFile mounts: started before training, closed after it.
        self._streams: list[pipe.PipeChannelServer | fastfile.FastFileMount] = []
        self._notes: list[str] = []  # told in the Training status message
        self._stream_failure: str | None = None
        # Room kept back to record the job's end if its disk fills, and what the host was
        # doing (and where) for the reason if it does.
        self._reserve = diskspace.Reserve(plan.job_dir / "hosts" / f"{plan.host}.reserve")
        self._activity = ("preparing the host", plan.job_dir)
        # MPI: the daemon this host runs for algo-1's mpirun, and how rank output is routed.
        self._launch: mpi.LaunchRequest | None = None
        self._mpi_follower = False
        self._demux: mpi.RankDemux | None = None
        self._interface = plan.network_interface  # see _choose_interface
        # Script mode: the command the toolkit would name in ExecuteUserScriptError.
        self._script_command: tuple[str, ...] | None = None

    def emit(self, change: Phase | Progress) -> None:
        self.report(StatusChanged(self.plan.host, change))

    def _metrics_found(self, points: list[MetricPoint]) -> None:
        self.report(MetricsFound(self.plan.host, tuple(points)))

    # -- stopping -------------------------------------------------------------------------

    def terminate(self, grace: float) -> None:
        """SIGTERM the training process group, SIGKILL it ``grace`` seconds later."""
        with self._lock:
            self._stop.set()
            process = self._process
        if process is None:
            return
        process.signal(TERM)

        def kill_later() -> None:
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if process.popen.poll() is not None and not process.group_alive():
                    return
                time.sleep(0.05)
            log.info("grace period of %.0f s over; sending SIGKILL", grace)
            process.signal(KILL)

        threading.Thread(target=kill_later, name="grace-killer", daemon=True).start()

    # -- the host's life ------------------------------------------------------------------

    def run(self) -> Finished:
        plan, layout = self.plan, self.plan.layout
        spec = plan.spec
        checkpoints: CheckpointSync | None = None
        result: Finished
        try:
            self._reserve.claim()
            self.emit(Phase("Downloading", "Downloading input data"))
            self._prepare(layout)
            if spec.checkpoint_uri:
                self._activity = ("seeding checkpoints", layout.local(spec.checkpoint_local_path))
                checkpoints = CheckpointSync(
                    self.store, spec.checkpoint_uri, layout.local(spec.checkpoint_local_path)
                )
                seeded = checkpoints.seed()
                log.info("seeded %d checkpoint files from %s", seeded, spec.checkpoint_uri)
            self._activity = ("staging the input data", layout.data_dir)
            self._stage_channels(layout)
            self._activity = ("unpacking the code", layout.code_dir)
            cmd = self._command(layout)
            if cmd.container is None:
                self._notes += self.runner.limit_notes(self._limits())
            if self._stop.is_set():
                raise _Stopped
            self.emit(Phase("Training", "; ".join(["Training in progress", *self._notes])))
            self._activity = ("training", layout.root)
            result = self._train(cmd, layout, checkpoints)
            result = self._end_mpi(result)
        except _Stopped:
            failure = self._stream_failure
            result = Finished(None, f"ClientError: {failure}" if failure else None)
        except TrainportError as exc:
            log.error("host %s could not run the job: %s", plan.host, exc)
            result = Finished(None, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # an agent bug must still end the job with a reason
            log.exception("host %s failed", plan.host)
            result = Finished(None, f"InternalError: {type(exc).__name__}: {exc}")
        self._release_mpi()
        self._close_streams()
        result = self._room_to_end(result, layout)
        self.emit(Phase("Uploading", "Uploading generated training model"))
        return self._finish(result, layout, checkpoints)

    def _room_to_end(self, result: Finished, layout: HostLayout) -> Finished:
        """Give back the reserve; on a full disk also drop the staged input, so the job's
        end can be recorded, and say in the reason that the disk filled, and where."""
        full = diskspace.is_full(layout.root)
        self._reserve.release()
        if not full:
            return result
        removed = diskspace.make_room(layout.data_dir)
        what, where = self._activity
        log.error("host %s: no space left on the device while %s (%s)", self.plan.host, what, where)
        if result.exit_code == 0:
            return result  # it finished: packing its model may still fail, and says why
        reason = (
            f"ClientError: no space left on the device that holds {where} "
            f"(TRAINPORT_HOME {self.settings.home}) while {what}"
            + ("; its staged input data was removed to make room" if removed else "")
            + ". Free space there and run the job again"
        )
        if result.failure_reason:
            reason += f". The job reported: {result.failure_reason}"
        return Finished(result.exit_code, reason)

    def _prepare(self, layout: HostLayout) -> None:
        plan, spec = self.plan, self.plan.spec
        layout.create()
        plan.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._choose_interface()
        # The machine's own name maps to this host's address, so code that resolves its
        # hostname inside the sandbox finds itself.
        own = {socket.gethostname(): plan.addresses.get(plan.host, "127.0.0.1")}
        plan.hosts_file.write_text(hosts_file_text({**own, **plan.addresses}))
        layout.write_configs(
            spec.hyperparameters,
            pipe.input_data_config(spec.channels, spec.pipe_workers),
            self._resource_config(),
        )

    def _resource_config(self) -> dict[str, object]:
        spec = self.plan.spec
        groups = {spec.group_of(h) for h in spec.hosts}
        ordered = sorted(groups, key=lambda g: spec.hosts.index(spec.group_hosts(g)[0]))
        return resource_config(
            self.plan.host,
            [(g.name, g.instance_type, list(spec.group_hosts(g))) for g in ordered],
            self._interface,
        )

    def _choose_interface(self) -> None:
        """The interface the job's collectives use: its network's, or the one the
        sagemaker_network_interface_name hyperparameter names where the host has it."""
        plan = self.plan
        available = None
        if frameworks.INTERFACE_HYPERPARAMETER in plan.spec.hyperparameters:
            available = frameworks.network_interfaces(plan.netns)
        self._interface, note = frameworks.choose_interface(
            plan.network_interface, plan.spec.hyperparameters, available
        )
        if note:
            self._notes.append(note)

    def _stage_channels(self, layout: HostLayout) -> None:
        plan = self.plan
        for channel in plan.spec.channels:
            if self._stop.is_set():
                raise _Stopped
            if channel.input_mode == "Pipe":
                server = pipe.serve_channel(
                    self.store,
                    channel,
                    layout.data_dir,
                    host_index=plan.host_index,
                    host_count=len(plan.hosts),
                    workers=plan.spec.pipe_workers,
                    opts=pipe.PipeOptions(fetchers=self.settings.download_workers),
                    on_error=self._stream_failed,
                )
                self._streams.append(server)
                continue
            objects = resolve_channel(self.store, channel)
            ordered = object_order(objects, channel.shuffle_seed, epoch=0)
            mine = shard(ordered, channel.distribution, plan.host_index, len(plan.hosts))
            if channel.input_mode == "FastFile" and self._mount_fastfile(
                channel.name, mine, layout
            ):
                continue
            stats = stage_file_channel(
                self.store,
                mine,
                layout.channel_dir(channel.name),
                workers=self.settings.download_workers,
                label=f"channel {channel.name}",
                on_progress=functools.partial(self._download_progress, channel.name),
            )
            log.info(
                "channel %s: %d objects, %.1f MiB in %.2f s",
                channel.name,
                stats.objects,
                stats.bytes / (1 << 20),
                stats.seconds,
            )

    def _mount_fastfile(self, name: str, objects: list[ChannelObject], layout: HostLayout) -> bool:
        # Imported here: FUSE support is heavy and most jobs never use it.
        from trainport.host import fastfile

        """Mount a FastFile view; False (and a note in the status) to stage in File mode."""
        try:
            view = fastfile.mount_channel(
                self.store, objects, layout.channel_dir(name), label=f"channel {name}"
            )
        except fastfile.FastFileUnavailable as exc:
            note = f"FastFile unavailable ({exc}); channel {name} staged in File mode"
            log.warning("%s", note)
            self._notes.append(note)
            self.emit(Phase("Downloading", note))
            return False
        self._streams.append(view)
        return True

    def _stream_failed(self, message: str) -> None:
        """A Pipe channel cannot go on (an object vanished, bad gzip): end the job."""
        self._log_line(f"[trainport] {message}")
        self._stream_failure = message
        self.terminate(self.settings.stop_grace_seconds)

    def _close_streams(self) -> None:
        while self._streams:
            try:
                self._streams.pop().close()
            except Exception:  # closing one must not keep the others open
                log.exception("closing a channel stream failed")

    def _download_progress(
        self, channel: str, objects: int, total_objects: int, done: int, total: int
    ) -> None:
        percent = 100 * done / total if total else 100.0
        self.emit(
            Progress(
                f"Downloading input data: channel {channel} {percent:.0f}% "
                f"({objects}/{total_objects} objects, {done / (1 << 20):.1f}/"
                f"{total / (1 << 20):.1f} MiB)"
            )
        )

    def _pull_image(self, engine: str, image: str) -> None:
        from trainport.runners.container import pull_image

        log.info("pulling image %s with %s", image, engine)
        # In the job's log as well: a status message may change before anyone reads it.
        self._log_line(f"[trainport] pulling image {image} with {engine}")
        self.emit(Progress(f"Pulling image {image}"))
        last = ""

        def progress(shown: str) -> None:
            nonlocal last
            if shown != last:  # one status update per change, not per line of the engine's
                last = shown
                self.emit(Progress(f"Pulling image {image}: {shown}"))

        pull_image(engine, image, progress)
        self._log_line(f"[trainport] pulled image {image}")

    def _base_env(self, base_dir: str) -> dict[str, str]:
        """The job's environment: an allow-list (see host.jobenv), nothing of this
        process's own, whoever started it."""
        spec = self.plan.spec
        env = jobenv.job_environment(
            request=spec.environment,
            home=self._home(base_dir),
            interface=self._interface,
            credentials=self._role_credentials(),
            path=jobenv.job_path(),
        )
        env["TRAINING_JOB_NAME"] = spec.name
        env["TRAINING_JOB_ARN"] = self.plan.arn
        env["SAGEMAKER_BASE_DIR"] = base_dir
        if spec.pipe_workers:
            env["TRAINPORT_PIPE_WORKERS"] = str(spec.pipe_workers)
        return env

    def _role_credentials(self) -> RoleCredentials | None:
        return self.settings.credentials_for(self.plan.spec.request.get("RoleArn"))

    def _home(self, base_dir: str) -> str:
        """The job's HOME: in a sandbox its private empty folder (see runners.plan); where
        the job sees its tree where it lies (the process runner), a folder in that tree."""
        root = self.plan.layout.root
        if base_dir != str(root):
            return "/root"
        home = root / mpi.PRIVATE / "home"
        home.mkdir(parents=True, exist_ok=True)
        return str(home)

    def _gpus(self) -> gpus.GpuShare:
        """This host's share of the machine's GPUs (told in the status when hosts share)."""
        plan = self.plan
        share = gpus.share(
            gpus.machine_gpus(os.environ),
            len(plan.hosts),
            plan.host_index,
            gpus.parse_tag(plan.spec.tags.get(gpus.TAG)),
        )
        if share.note:
            self._notes.append(share.note)
        return share

    def _command(self, layout: HostLayout) -> commands.Command:
        spec = self.plan.spec
        if self.plan.network_note:
            self._notes.append(self.plan.network_note)
        base_dir = self.runner.base_dir(layout.root)
        env = self._base_env(base_dir)
        share = self._gpus()
        if "CUDA_VISIBLE_DEVICES" not in spec.environment:  # the request's own choice wins
            env.update(share.environment())
            if not share.machine and "CUDA_VISIBLE_DEVICES" in os.environ:
                env["CUDA_VISIBLE_DEVICES"] = ""  # this machine lends none: the job sees none
        how = commands.check_runnable(spec)
        if how == "container":
            # The job's start pulls an image the engine lacks (submission asked no engine).
            engine = commands.container_engine(spec, pull=self._pull_image)
            assert engine is not None  # check_runnable found it
            self._notes.append(f"running image {spec.training_image} in {engine}")
            if spec.network_isolation and len(self.plan.hosts) > 1 and not self.plan.netns:
                raise ValidationError(commands.ISOLATED_HOSTS_NEED_NAMESPACES)
            code = commands.code_to_stage(spec)
            if code is not None:  # the image's toolkit finds it there and downloads nothing
                self._unpack_code(code, layout)
            return commands.container_command(
                spec,
                engine,
                self.plan.host,
                self.plan.arn,
                share.devices,
                self.plan.job_dir,
                mount_code=code is not None,
                credentials=jobenv.role_environment(self._role_credentials(), spec.environment),
            )
        if spec.network_isolation and not self.plan.netns:
            # Without root there is no namespace to put the job in; its code runs all the
            # same (it does on SageMaker), and the user is told rather than misled.
            self._notes.append(
                "EnableNetworkIsolation is not enforced: network namespaces need root, so "
                "this job has the machine's network"
            )
        if how != "script":
            return commands.plain_command(spec, env, f"{base_dir}/code")
        if spec.training_image and spec.training_image != commands.PLAIN_SCRIPT_IMAGE:
            # Say which way was chosen for the image the user named.
            self._notes.append(
                f"script mode: image {spec.training_image} is not in a container engine here"
            )
        from trainport.host import script_mode

        source = S3Uri.parse(
            spec.hyperparameters["sagemaker_submit_directory"].strip('"'),
            field="HyperParameters.sagemaker_submit_directory",
        )
        self._unpack_code(source, layout)
        layer = framework_envs.layer_for(spec.training_image)
        self._notes += framework_envs.image_notes(spec.training_image)
        python = script_mode.prepare_python(
            layout.code_dir,
            self.settings.envs_dir,
            base_python=sys.executable,
            log=lambda line: self._log_line(f"[trainport] {line}"),
            build=functools.partial(self._build_env, env, f"{base_dir}/code", layout),
            framework=layer.requirements if layer else (),
        )
        argv, sm_env = script_mode.script_invocation(
            base_dir=Path(base_dir),
            hyperparameters=spec.hyperparameters,
            resource_config=self._resource_config(),
            input_data_config={c.name: c.input_data_config_entry() for c in spec.channels},
            python=python,
            num_gpus=len(share.devices),
            num_cpus=os.cpu_count() or 1,
            job_name=spec.name,
        )
        merged = {**env, **sm_env}
        # What the framework's toolkit exports before it starts the entry point (over the
        # request's own, as in the container).
        framework = frameworks.framework_of(spec.training_image)
        torch = frameworks.torch_version() if framework is frameworks.Framework.PYTORCH else None
        merged.update(frameworks.container_variables(framework, sm_env, torch=torch))
        # The interpreter's own bin folder first, as in a framework container: a script that
        # starts `python`, `pip` or `torchrun` itself gets this environment, not the
        # machine's base interpreter.
        merged["PATH"] = os.pathsep.join(
            [str(Path(python).parent), *filter(None, [env.get("PATH")])]
        )
        if env.get("PYTHONPATH"):  # the code folder first, the request's own paths after
            merged["PYTHONPATH"] = f"{sm_env['PYTHONPATH']}{os.pathsep}{env['PYTHONPATH']}"
        if spec.torch_distributed:
            argv = self._torchrun(argv, python, len(share.devices))
        settings = launch_kind.mpi_launch_settings(spec)
        if smddp.enabled(spec):
            # Last on the path: the job's own code and paths come first, and trainport's
            # package defers to a real smdistributed.dataparallel the interpreter has.
            merged["PYTHONPATH"] = os.pathsep.join([merged["PYTHONPATH"], str(smddp.SITE)])
        if settings is not None:
            return self._mpi_command(settings, argv, python, merged, base_dir, layout, share)
        self._script_command = tuple(argv)
        return commands.Command(tuple(argv), f"{base_dir}/code", merged)

    def _build_env(
        self, env: dict[str, str], cwd: str, layout: HostLayout, argv: list[str], folder: Path
    ) -> None:
        """Run a requirements build where the job runs: its runner, identity, limits and
        network, writing only ``folder``; its output goes to the job's log."""
        placement = self._placement(tuple(argv), env, cwd, layout, writable=(folder,))
        with self._lock:
            if self._stop.is_set():
                raise _Stopped
            process = self.runner.start(placement)
            self._process = process
        tail: list[str] = []
        try:
            for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                tail = [*tail[-19:], line]
                self._log_line(line)
            code = process.wait()
        finally:
            with self._lock:
                self._process = None
        if self._stop.is_set():
            raise _Stopped
        if code != 0:
            raise ValidationError(
                f"pip install -r requirements.txt failed with exit code {code}; fix "
                "requirements.txt in the source directory. Last lines of output:\n"
                + "\n".join(tail)
            )

    def _placement(
        self,
        argv: tuple[str, ...],
        env: dict[str, str],
        cwd: str,
        layout: HostLayout,
        writable: tuple[Path, ...] = (),
    ) -> Placement:
        return Placement(
            root=layout.root,
            hosts_file=self.plan.hosts_file,
            argv=argv,
            env=env,
            cwd=cwd,
            private=(self.settings.home,),
            shared=(self.settings.envs_dir,),
            netns=self.plan.netns,
            hosts=self.plan.hosts,
            limits=self._limits(),
            writable=writable,
        )

    def _unpack_code(self, source: S3Uri, layout: HostLayout) -> None:
        from trainport.host import script_mode

        script_mode.unpack_sourcedir(
            self.store.get_bytes(source.bucket, source.key),
            layout.code_dir,
            max_bytes=self.settings.max_sourcedir_bytes,
        )

    # -- MPI --------------------------------------------------------------------------------

    def _mpi_command(
        self,
        settings: mpi.MpiSettings,
        argv: list[str],
        python: str,
        env: dict[str, str],
        base_dir: str,
        layout: HostLayout,
        share: gpus.GpuShare,
    ) -> commands.Command:
        """algo-1 runs mpirun over every host; the others run the daemon it asks for."""
        plan = self.plan
        board = plan.mpi_board
        if board is None:  # the supervisor makes one for every MPI job
            raise ValidationError("an MPI job needs the supervisor's launch board")
        private = layout.root / mpi.PRIVATE
        (private / "shm").mkdir(parents=True, exist_ok=True)
        (private / "ranks").mkdir(exist_ok=True)
        inside = f"{base_dir}/{mpi.PRIVATE}"
        # Not an OMPI_* variable: each host's ranks get their own host's folder.
        env = {**env, mpi.ENV_HOST: plan.host, mpi_rank.ENV_RANKS: f"{inside}/ranks"}
        cwd = f"{base_dir}/code"
        if plan.host != plan.hosts[0]:
            env[mpi.VADER_DIR] = f"{inside}/shm"
            self._mpi_follower = True
            request = board.wait_for(plan.host, self._stop)
            if request is None:
                if self._stop.is_set():
                    raise _Stopped
                return commands.Command(("true",), cwd, env)  # the run ended without us
            self._launch = request
            threading.Thread(
                target=self._watch_launch, args=(request, board), name="mpi-watch", daemon=True
            ).start()
            return commands.Command(("sh", "-c", request.command), cwd, env)
        board.start(private)
        env.update(board.environment(f"{inside}/launch.sock"))
        env[mpi.ENV_SHM] = f"{inside}/shm"
        per_host = settings.processes_on(len(share.devices))
        self._demux = mpi.RankDemux(mpi.rank_host(plan.hosts, per_host))
        self._log_line(f"[trainport] {mpi.job_map(plan.hosts, per_host)}")
        program = argv
        if argv and argv[0] == python and mpi.has_mpi4py():
            # As the toolkit does: an uncaught exception in a rank aborts the whole run.
            # The rank runner leaves a note if its rank fails (see mpi_rank).
            program = [python, "-m", "trainport.host.mpi_rank", *argv[1:]]
        command = mpi.mpirun_command(
            hosts=plan.hosts,
            per_host=per_host,
            interface=self._interface,
            agent=(python, "-m", "trainport.host.mpi_launch"),
            program=program,
            custom_options=settings.custom_options,
        )
        return commands.Command(tuple(command), cwd, env)

    def _watch_launch(self, request: mpi.LaunchRequest, board: mpi.LaunchBoard) -> None:
        """End this host's daemon if its launch agent went away or mpirun ended long ago."""
        while self._launch is request:
            if request.cancelled.wait(0.5) or board.ended_for(mpi.DAEMON_GRACE):
                log.info("host %s: mpirun is gone; ending its MPI daemon", self.plan.host)
                self.terminate(5.0)
                return

    def _end_mpi(self, result: Finished) -> Finished:
        """An MPI run's outcome: algo-1's mpirun speaks for the job, naming the rank's host."""
        plan = self.plan
        if self._launch is not None:
            self._launch.finish(result.exit_code if result.exit_code is not None else 1)
        if self._mpi_follower:
            # A daemon ends when mpirun tells it to, or is killed when mpirun fails: the
            # leader reports the run; this host's log keeps the details.
            return Finished(0, None)
        if self._demux is None or result.exit_code in (0, None):
            return result
        if result.failure_reason and not result.failure_reason.startswith("AlgorithmError: , "):
            return result  # the leader's own ranks wrote a failure file
        host_of = self._demux.host_of
        notes = mpi.rank_notes(
            [plan.job_dir / "hosts" / host / mpi.PRIVATE / "ranks" for host in plan.hosts]
        )
        reason = mpi.failure_reason(
            list(mpi.tail_lines(plan.log_path)), host_of, result.exit_code, notes
        )
        for host in plan.hosts:
            if f"host {host} " not in reason + " ":
                continue
            # Without a note of its rank's error, the last one its host's ranks printed.
            error = failure.last_exception(
                list(mpi.tail_lines(plan.job_dir / "logs" / f"{host}.log"))
            )
            if error and error not in reason:
                reason += f"; {host}'s last error: {error}"
            if host != plan.host:
                text = self._failure_reason(HostLayout(plan.job_dir / "hosts" / host), 1)
                if text and not text.startswith("AlgorithmError: , "):
                    reason += f"; {host}'s failure file: {text}"
        return Finished(result.exit_code, reason)

    def _release_mpi(self) -> None:
        if self._launch is not None:
            self._launch.finish(1)  # no-op once finished; unblocks the board otherwise
            self._launch = None
        board = self.plan.mpi_board
        if board is not None and self.plan.host == self.plan.hosts[0]:
            board.close()

    def _torchrun(self, argv: list[str], python: str, host_gpus: int) -> list[str]:
        """The script-mode command under torchrun, as SageMaker's PyTorch containers run it."""
        plan, spec = self.plan, self.plan.spec
        if len(argv) < 2 or argv[0] != python or not argv[1].endswith(".py"):
            raise ValidationError(
                "torch distributed training needs a Python entry point (sagemaker_program "
                f"ending in .py); this job would run {argv[:2]}"
            )
        per_host = spec.processes_per_host or host_gpus or 1
        return [
            python, "-m", "torch.distributed.run",
            "--nnodes", str(len(plan.hosts)),
            "--nproc_per_node", str(per_host),
            "--master_addr", "algo-1",
            "--master_port", str(TORCHRUN_PORT),
            "--node_rank", str(plan.host_index),
            *argv[1:],
        ]  # fmt: skip

    # -- training -------------------------------------------------------------------------

    def _log_line(self, text: str) -> None:
        line = (time.time(), text)
        append_log_lines(self.plan.log_path, (line,))
        self.report(LogLines(self.plan.host, (line,)))

    def _train(
        self, cmd: commands.Command, layout: HostLayout, checkpoints: CheckpointSync | None
    ) -> Finished:
        placement = self._placement(cmd.argv, cmd.env, cmd.cwd, layout)
        with self._lock:
            if self._stop.is_set():
                raise _Stopped
            runner = ContainerRunner(cmd.container) if cmd.container else self.runner
            process = runner.start(placement)
            self._process = process
        self.report(TrainingStarted(self.plan.host, process.pgid))
        log.info("host %s started %s (process group %d)", self.plan.host, cmd.argv, process.pgid)
        sampler = ResourceSampler(
            process.pgid,
            lambda sample: self.report(ResourcesSampled(self.plan.host, (sample,))),
        )
        sampler.start()
        done = threading.Event()
        syncer = None
        if checkpoints is not None and self.settings.checkpoint_sync_seconds > 0:
            syncer = threading.Thread(
                target=self._sync_loop,
                args=(checkpoints, done),
                name="checkpoint-sync",
                daemon=True,
            )
            syncer.start()
        # The job ends when its training process does, as a container does: not when every
        # holder of its output has let go (a child that left the process group, or a
        # sandbox's init still reaping one, may hold it for ever).
        ended = threading.Event()
        pump = threading.Thread(
            target=self._pump_logs, args=(process, ended), name="log-pump", daemon=True
        )
        pump.start()
        code = process.wait()
        sampler.stop()
        # Children the training process left behind (a DataLoader worker, a shell's job)
        # still hold the group: give them the same grace, then end them.
        if process.group_alive():
            process.signal(TERM)
            deadline = time.monotonic() + 5
            while process.group_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            process.signal(KILL)
        pump.join(timeout=_OUTPUT_DRAIN_SECONDS)
        ended.set()  # what is left to read is read; a pipe still held open is let go
        pump.join()
        done.set()
        if syncer is not None:
            syncer.join()
        if self._stream_failure:
            return Finished(code or 1, f"ClientError: {self._stream_failure}")
        over = process.limit_reason() if code else None
        if over:
            self._log_line(f"[trainport] {over}")
            return Finished(code, over)
        return Finished(code, self._failure_reason(layout, code) or self._output_reason(code))

    def _limits(self) -> Limits | None:
        spec = self.plan.spec
        # The sizes the Ray runner places hosts by (the table, and the operator's own).
        return host_limits(
            spec.group_of(self.plan.host).instance_type, spec.tags, self.settings.ray_instance_types
        )

    def _sync_loop(self, checkpoints: CheckpointSync, done: threading.Event) -> None:
        while not done.wait(self.settings.checkpoint_sync_seconds):
            try:
                checkpoints.sync()
            except TrainportError as exc:
                log.warning("checkpoint sync failed (will retry): %s", exc)

    def _pump_logs(self, process: HostProcess, ended: threading.Event) -> None:
        """Copy the job's output into its log with timestamps, and parse metrics."""
        lost = 0  # lines that could not be written (a full disk)
        # Unbuffered: a write that fails leaves nothing behind to fail again at close.
        with open(self.plan.log_path, "ab", buffering=0) as out, contextlib.ExitStack() as others:
            elsewhere: dict[str, IO[bytes]] = {}

            def write(host: str | None, text: bytes, now: float) -> bool:
                """Log one line; True if it is this host's (and so feeds metrics)."""
                stamp = f"{now:.3f}\t".encode()
                line = text.rstrip(b"\n")
                target = host or self.plan.host
                if target == self.plan.host:
                    out.write(stamp + line + b"\n")
                    out.flush()
                else:
                    # MPI: a rank on another host; its lines belong in that host's log.
                    if target not in elsewhere:
                        path = self.plan.job_dir / "logs" / f"{target}.log"
                        elsewhere[target] = others.enter_context(open(path, "ab"))
                    elsewhere[target].write(stamp + text + b"\n")
                    elsewhere[target].flush()
                self.report(LogLines(target, ((now, line.decode("utf-8", "replace")),)))
                return target == self.plan.host

            for raw in _output_lines(process.stdout, ended):
                now = time.time()
                routed = self._demux.feed(raw) if self._demux else [(None, raw)]
                for host, text in routed:
                    try:
                        mine = write(host, text, now)
                    except OSError:  # read on all the same, or training blocks on its pipe
                        lost += 1
                        continue
                    if mine and self.metrics:
                        self.metrics.feed(text.decode("utf-8", "replace"), now)
            for host, text in self._demux.flush() if self._demux else []:
                with contextlib.suppress(OSError):
                    write(host, text, time.time())
        self.metrics.close()  # the last points are recorded before the job's end
        if lost:
            log.warning("host %s: %d log lines could not be written", self.plan.host, lost)

    @staticmethod
    def _failure_reason(layout: HostLayout, code: int) -> str | None:
        if code == 0:
            return None
        # Never through a link the job made: it would put a host file into FailureReason.
        # Cut to SageMaker's limit by the status machine, which keeps the end too.
        text = jobtree.read_text(layout.failure_file, 65536) or ""
        return text if text.strip() else None

    def _output_reason(self, code: int) -> str | None:
        """The reason of a command that left no failure file: in script mode the toolkit's
        ExecuteUserScriptError, else the command's last lines (see host.failure)."""
        if code == 0:
            return None
        if self._demux is not None or self._mpi_follower:
            return f"AlgorithmError: , exit code: {code}"  # _end_mpi names the rank
        lines = list(mpi.tail_lines(self.plan.log_path))
        if self._script_command is not None:
            return failure.script_failure(code, self._script_command, lines)
        return failure.output_failure(code, lines)

    # -- the end --------------------------------------------------------------------------

    def _finish(
        self, result: Finished, layout: HostLayout, checkpoints: CheckpointSync | None
    ) -> Finished:
        spec = self.plan.spec
        problems = []
        if checkpoints is not None:
            try:
                checkpoints.sync()
            except (TrainportError, OSError) as exc:
                problems.append(f"checkpoint upload failed: {_said(exc)}")
        try:
            if self.plan.upload_artifacts:
                self.model_uri = upload_artifacts(
                    self.store,
                    spec.output_path,
                    spec.name,
                    layout.model_dir,
                    layout.output_data_dir,
                    scratch=scratch_dir(self.plan.job_dir),
                )
        except (TrainportError, OSError) as exc:  # OSError: packing in the job's folder
            problems.append(f"artifact upload failed: {_said(exc)}")
        if problems and result.exit_code == 0:
            return Finished(1, "ClientError: " + "; ".join(problems))
        return result

    model_uri: str | None = None


def _said(exc: Exception) -> str:
    """An error for a reason: ours as they are, the system's with the file they name."""
    if isinstance(exc, OSError) and not isinstance(exc, TrainportError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    return str(exc)
