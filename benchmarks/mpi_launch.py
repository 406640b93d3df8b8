"""MPI launch overhead: a 4-rank job (2 hosts x 2 processes) under mpirun beside torchrun.

For each launcher this times, over ``--repeat`` interleaved rounds, from just before
``trainport run`` starts (as a subprocess) until **every** rank has run the first statement
of the user script (each rank prints ``time.time()`` as its first statement; the figure
reads it back from the hosts' logs, since a sandboxed job cannot write to this machine's
folders), and the wall time of the whole ``trainport run``. The two launchers run
the same script-mode job, in the same rounds, so drift on the machine hits both alike; the
ratio MPI / torchrun is the figure.

    python benchmarks/mpi_launch.py --repeat 5 [--runner sandbox|process]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """\
import os, time; os.write(1, f"FIRST {time.time()!r}\\n".encode())
"""

LAUNCHERS = {"mpi": ["--mpi"], "torchrun": ["--torchrun"]}


def trainport() -> list[str]:
    found = Path(sys.executable).with_name("trainport")
    return [str(found)] if found.exists() else [sys.executable, "-m", "trainport.cli"]


def time_one(launcher: str, round_no: int, work: Path, runner: str) -> tuple[float, float]:
    name = f"bench-{launcher}-{round_no}"
    command = [
        *trainport(),
        "run",
        "--name", name,
        "--entry-point", "first.py",
        "--source-dir", str(work / "src"),
        "--instance-count", "2",
        "--processes-per-host", "2",
        "--runner", runner,
        *LAUNCHERS[launcher],
    ]  # fmt: skip
    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    end = time.time()
    if done.returncode != 0:
        raise SystemExit(f"{launcher} job failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    logs = work / "home" / "jobs" / name / "logs"
    # Two ranks of a host write one log (one write each: PYTHONUNBUFFERED splits a print).
    firsts = [
        float(stamp)
        for log in logs.glob("algo-*.log")
        for stamp in re.findall(r"FIRST ([0-9.]+)", log.read_text())
    ]
    if len(firsts) != 4:
        raise SystemExit(f"{launcher}: {len(firsts)} of 4 ranks ran")
    return max(firsts) - start, end - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runner", default="sandbox", choices=["sandbox", "process"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainport-mpi-bench-") as tmp:
        work = Path(tmp)
        (work / "src").mkdir()
        (work / "src" / "first.py").write_text(SCRIPT)
        os.environ["TRAINPORT_HOME"] = str(work / "home")
        first: dict[str, list[float]] = {k: [] for k in LAUNCHERS}
        total: dict[str, list[float]] = {k: [] for k in LAUNCHERS}
        load = [os.getloadavg()[0]]
        time_one("mpi", -1, work, args.runner)  # warm caches (interpreter, page cache)
        for round_no in range(args.repeat):
            for launcher in LAUNCHERS:
                a, b = time_one(launcher, round_no, work, args.runner)
                first[launcher].append(a)
                total[launcher].append(b)
            load.append(os.getloadavg()[0])
    print(f"4 ranks (2 hosts x 2), runner {args.runner}, {args.repeat} interleaved rounds")
    print(f"load average (1 min) during the run: {min(load):.2f}-{max(load):.2f}")
    print(f"{'launcher':<10} {'every rank started s (median, min-max)':>40} {'whole run s':>24}")
    for launcher in LAUNCHERS:
        f, t = first[launcher], total[launcher]
        print(
            f"{launcher:<10} {statistics.median(f):>18.3f} ({min(f):.3f}-{max(f):.3f})"
            f"{'':>8} {statistics.median(t):>8.3f} ({min(t):.3f}-{max(t):.3f})"
        )
    ratio = statistics.median(first["mpi"]) / statistics.median(first["torchrun"])
    print(f"MPI / torchrun, time until every rank started: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
