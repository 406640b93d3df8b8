"""Job overhead: how much later than a bare interpreter does user code start and end?

For each runner (sandbox, process) this times, over ``--repeat`` repetitions:

- **first line**: from just before ``trainport run job.yaml`` is launched as a subprocess
  until the first statement of the user script runs (the script prints ``time.time()`` as
  its first statement, read back from the job's log, or from a file for the floor);
- **total**: the wall time of ``trainport run`` for that script, which does nothing else
  (so it includes staging nothing, writing the config files, waiting for the process,
  uploading an empty model and the CLI noticing the final status);

each beside the floor: the same interpreter started on the same script directly, measured
the same way in the same run. Runs are interleaved (floor, sandbox, process, floor, ...) so
drift on the machine hits every column alike. A breakdown per stage follows, from each job
record's timestamps (created, Downloading, Training, Completed) and the script's. The job
uses ``ContainerEntrypoint`` with the interpreter's real path, so no script-mode packing
enters the figure.

    python benchmarks/job_overhead.py --repeat 10
    python benchmarks/job_overhead.py --repeat 7 --runners sandbox:unshare,sandbox:bwrap,process

A runner written ``sandbox:WAY`` runs the sandbox made that way (``TRAINPORT_SANDBOX``).
A runner written ``RUNNER@REF`` runs trainport as it was at the git commit ``REF`` (a
detached worktree of this repository, put first on ``PYTHONPATH``), so a change is measured
beside the code before it in one run:

    python benchmarks/job_overhead.py --repeat 7 --runners sandbox,sandbox@7ff9b6c,process

Every sandbox is also compared, run by run, with each ``sandbox@REF`` (its first line
against the earlier code's).
The runner ``container`` runs the job as a busybox image in the container engine (built
here, no registry needed; ``container:docker`` or ``container:podman`` names the engine,
``TRAINPORT_CONTAINER_ENGINE``: docker's daemon must be running), its user code ``echo``:
busybox has no sub-second clock, so its first line is timed when trainport receives it (the
log's own stamp), which a Python job's interpreter start (~20-40 ms) does not delay; the
container column is thus slightly flattered against the others.
With both a sandbox and the process runner, the sandbox's cost over the process runner
(to the first line, paired run by run) is printed against its budget of 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

GOAL_SECONDS = 0.5
SANDBOX_BUDGET_SECONDS = 0.1  # the sandbox's cost over the process runner, to the first line

# The time goes to stdout (the job's log) too: a sandboxed job cannot write outside its
# tree, so the marker file is only for the floor.
USER_SCRIPT = """\
import sys, time; t = repr(time.time()); print(t, flush=True)
try: open(sys.argv[1], "w").write(t)
except OSError: pass
"""


STAGES = (
    ("CLI start -> job record created", "created"),
    ("record created -> agent Downloading", "downloading"),
    ("Downloading -> Training (layout, runner)", "training"),
    ("Training -> first line of user code", "first_line"),
    ("first line -> Completed recorded", "completed"),
    ("Completed -> CLI exited", "exited"),
)


@dataclass
class Series:
    first_line: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    stages: list[dict[str, float]] = field(default_factory=list)


def stage_times(home: Path, name: str, start: float, first: float, end: float) -> dict[str, float]:
    """Seconds since launch at which the job passed each point, from its record."""
    from trainport.jobs.db import JobDB

    record = JobDB(home / "trainport.db").get(name)
    at = {t.status: t.start_time for t in record.transitions}
    points = {
        "created": record.creation_time,
        "downloading": at.get("Downloading", record.creation_time),
        "training": at.get("Training", record.creation_time),
        "first_line": first,
        "completed": at.get("Completed", end),
        "exited": end,
    }
    return {k: v - start for k, v in points.items()}


def trainport_command() -> list[str]:
    """``trainport`` next to this interpreter (not a pyenv shim, whose bash start-up would
    be charged to trainport), else ``python -m trainport.cli``."""
    exe = Path(sys.executable).with_name("trainport")
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    return [sys.executable, "-c", "from trainport.cli import main; main()"]


BENCH_IMAGE = "localhost/trainport-bench-busybox:1"


def bench_image(engine: str) -> str:
    """A busybox image in ``engine``, built once (FROM scratch: no registry needed)."""
    from trainport.runners.container import engine_kind, image_present

    engine = shutil.which(engine) or engine
    if image_present(engine, BENCH_IMAGE):
        return BENCH_IMAGE
    context = Path(tempfile.mkdtemp(prefix="trainport-bench-image-"))
    shutil.copy("/bin/busybox", context / "busybox")
    (context / "Containerfile").write_text(
        'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
    )
    runtime = ["--runtime", "runc"] if engine_kind(engine) == "podman" else []
    containerfile = ["-f", str(context / "Containerfile")]
    subprocess.run(
        [engine, "build", *runtime, "-q", *containerfile, "-t", BENCH_IMAGE, str(context)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(context)
    return BENCH_IMAGE


def write_job(path: Path, script: Path, marker: Path, name: str, image: str | None = None) -> None:
    request = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/trainport",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "local",
            "ContainerEntrypoint": [sys.executable, str(script), str(marker)],
        },
        "OutputDataConfig": {"S3OutputPath": "s3://trainport-bench/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 120},
    }
    if image is not None:
        request["AlgorithmSpecification"] = {
            "TrainingInputMode": "File",
            "TrainingImage": image,
            "ContainerEntrypoint": ["/bin/sh", "-c", "echo first"],
        }
    path.write_text(json.dumps(request, indent=2))


def time_one(
    argv: list[str],
    marker: Path,
    env: dict[str, str],
    log: Path | None = None,
    stamped: bool = False,
) -> tuple[float, float, float, float]:
    """(start, first line, end) as epoch seconds, and the first line's delay; the first
    line's time is read from the job's ``log`` if given, else from ``marker``."""
    marker.unlink(missing_ok=True)
    start = time.time()
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    end = time.time()
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout.decode(errors='replace')}"
        )
    if log is not None:
        stamp, line = log.read_text().splitlines()[0].split("\t", 1)
        first = float(stamp if stamped else line)
    else:
        first = float(marker.read_text())
    return start, first, end, first - start


def job_log(home: Path, name: str) -> Path:
    return home / "jobs" / name / "logs" / "algo-1.log"


_WORKTREES: dict[str, Path] = {}


def worktree(ref: str) -> Path:
    """A detached worktree of this repository at ``ref`` (made once per run)."""
    if ref not in _WORKTREES:
        repo = Path(__file__).resolve().parent.parent
        where = Path(tempfile.mkdtemp(prefix=f"trainport-at-{ref[:12]}-"))
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "--force", str(where), ref],
            check=True,
            capture_output=True,
        )
        _WORKTREES[ref] = where
    return _WORKTREES[ref]


def drop_worktrees() -> None:
    repo = Path(__file__).resolve().parent.parent
    for where in _WORKTREES.values():
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", str(where)],
            capture_output=True,
        )


def runner_env(runner: str, env: dict[str, str]) -> dict[str, str]:
    """The environment for ``runner`` (``sandbox:WAY`` picks the sandbox's way,
    ``container:ENGINE`` the engine, ``@REF`` the code of an earlier commit)."""
    runner, _, ref = runner.partition("@")
    if ref:
        env = {**env, "PYTHONPATH": str(worktree(ref) / "src")}
    _, _, way = runner.partition(":")
    if not way:
        return env
    return {
        **env,
        "TRAINPORT_CONTAINER_ENGINE" if is_container(runner) else "TRAINPORT_SANDBOX": way,
    }


def is_container(runner: str) -> bool:
    return runner.partition(":")[0] == "container"


def image_for(runner: str) -> str | None:
    return bench_image(runner.partition(":")[2] or "podman") if is_container(runner) else None


def cli_runner(runner: str) -> str:
    """A TrainingImage the engine has runs in a container whatever the runner flag says."""
    return "sandbox" if is_container(runner) else runner.partition("@")[0].partition(":")[0]


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="repetitions per column")
    parser.add_argument(
        "--runners",
        default="sandbox,process",
        help="comma-separated runners to measure (default: sandbox,process)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch TRAINPORT_HOME")
    args = parser.parse_args()
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]

    work = Path(tempfile.mkdtemp(prefix="trainport-bench-overhead-"))
    home = work / "home"
    script = work / "user" / "noop.py"
    script.parent.mkdir(parents=True)
    script.write_text(USER_SCRIPT)
    marker = work / "user" / "first-line"
    env = {**os.environ, "TRAINPORT_HOME": str(home)}
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "TRAINPORT_STORE", "TRAINPORT_RUNNER"):
        env.pop(var, None)  # the embedded store: this measures trainport, not an endpoint
    tp = trainport_command()

    floor = Series()
    by_runner = {r: Series() for r in runners}
    try:
        # One unmeasured round warms the page cache and creates the database.
        for r in runners:
            job = work / f"warm-{r}.json"
            name = f"warm-{r.replace(':', '-').replace('@', '-at-')}"
            write_job(job, script, marker, name, image_for(r))
            argv = [*tp, "run", str(job), "--runner", cli_runner(r)]
            time_one(argv, marker, runner_env(r, env), job_log(home, name), is_container(r))
        for i in range(args.repeat):
            start, first, end, _ = time_one([sys.executable, str(script), str(marker)], marker, env)
            floor.first_line.append(first - start)
            floor.total.append(end - start)
            for r in runners:
                job = work / f"job-{r}-{i}.json"
                name = f"bench-{r.replace(':', '-').replace('@', '-at-')}-{i}"
                write_job(job, script, marker, name, image_for(r))
                argv = [*tp, "run", str(job), "--runner", cli_runner(r)]
                start, first, end, _ = time_one(
                    argv, marker, runner_env(r, env), job_log(home, name), is_container(r)
                )
                by_runner[r].first_line.append(first - start)
                by_runner[r].total.append(end - start)
                by_runner[r].stages.append(stage_times(home, name, start, first, end))
    finally:
        drop_worktrees()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"job overhead, median of {args.repeat} runs (ms); goal: < {GOAL_SECONDS * 1000:.0f} ms")
    print(f"  python {sys.version.split()[0]}, {os.cpu_count()} CPUs, trainport: {' '.join(tp)}")
    header = f"{'':36}{'trainport':>11}{'floor':>9}{'above':>9}{'ratio':>8}{'goal':>7}"
    print(header)
    print("-" * len(header))
    for r in runners:
        series = by_runner[r]
        for what, values, base in (
            ("first line", series.first_line, floor.first_line),
            ("total (no-op job)", series.total, floor.total),
        ):
            ours, bottom = median_ms(values), median_ms(base)
            above = ours - bottom
            ok = "ok" if above < GOAL_SECONDS * 1000 else "MISS"
            print(
                f"{r + ': ' + what:36}{ours:>11.0f}{bottom:>9.0f}{above:>9.0f}"
                f"{ours / bottom:>7.1f}x{ok:>7}"
            )
    for r in runners:
        series = by_runner[r]
        lo, hi = min(series.total) * 1000, max(series.total) * 1000
        print(f"  {r}: no-op job total min {lo:.0f} ms, max {hi:.0f} ms")
    for r in runners:
        series = by_runner[r]
        lo, hi = min(series.first_line) * 1000, max(series.first_line) * 1000
        print(f"  {r}: first line min {lo:.0f} ms, max {hi:.0f} ms")
    if "process" in by_runner:
        base = by_runner["process"].first_line
        for r in (r for r in runners if r.startswith("sandbox")):
            # Paired run by run (they ran back to back), so drift cancels.
            extra = sorted(s - p for s, p in zip(by_runner[r].first_line, base, strict=True))
            mid = statistics.median(extra) * 1000
            ok = "ok" if mid < SANDBOX_BUDGET_SECONDS * 1000 else "MISS"
            print(
                f"  {r} over process, first line: median {mid:+.0f} ms (runs {extra[0] * 1000:+.0f}"
                f" to {extra[-1] * 1000:+.0f}); budget {SANDBOX_BUDGET_SECONDS * 1000:.0f} ms {ok}"
            )
    for earlier in (r for r in runners if "@" in r):
        base = by_runner[earlier].first_line
        base_total = by_runner[earlier].total
        for r in (r for r in runners if r.startswith("sandbox") and "@" not in r):
            extra = sorted(s - p for s, p in zip(by_runner[r].first_line, base, strict=True))
            whole = sorted(s - p for s, p in zip(by_runner[r].total, base_total, strict=True))
            mid = statistics.median(extra) * 1000
            ok = "ok" if mid < SANDBOX_BUDGET_SECONDS * 1000 else "MISS"
            print(
                f"  {r} over {earlier}, first line: median {mid:+.0f} ms (runs "
                f"{extra[0] * 1000:+.0f} to {extra[-1] * 1000:+.0f}); whole job: median "
                f"{statistics.median(whole) * 1000:+.0f} ms; budget "
                f"{SANDBOX_BUDGET_SECONDS * 1000:.0f} ms to the first line {ok}"
            )
    print()
    print("where the time goes (median over runs of each stage's length, ms)")
    print(f"{'stage':<44}" + "".join(f"{r:>17}" for r in runners))
    previous = "start"
    for label, key in STAGES:
        cells = []
        for r in runners:
            lengths = [
                st[key] - (st[previous] if previous != "start" else 0.0)
                for st in by_runner[r].stages
            ]
            cells.append(f"{median_ms(lengths):>17.0f}")
        print(f"{label:<44}" + "".join(cells))
        previous = key
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
