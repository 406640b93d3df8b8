"""Start N real ranks on 127.0.0.1 the way torchrun would, and collect what each reports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from trainport.distributed import torchrun_env, torchrun_topology

WORKER = Path(__file__).with_name("worker.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(
    world: int,
    scenario: str,
    out: Path,
    *,
    timeout: float = 120.0,
    args: dict[str, Any] | None = None,
    expect_exit: dict[int, int] | None = None,
    sagemaker: bool = False,
) -> list[dict[str, Any]]:
    """Run ``worker.py scenario`` as ranks 0..world-1 and return each rank's JSON report.

    Every rank gets torchrun's variables for a one-node job; a rank still running after
    ``timeout`` seconds is killed and reported as a hang.
    """
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[BinaryIO] = []
    for rank in range(world):
        env = dict(os.environ)
        if sagemaker:
            # SageMaker without torchrun: one process per host, placement from SM_HOSTS.
            hosts = [f"algo-{k + 1}" for k in range(world)]
            env.update(
                SM_HOSTS=json.dumps(hosts[::-1]),  # unsorted on purpose
                SM_CURRENT_HOST=hosts[rank],
                MASTER_ADDR="127.0.0.1",  # algo-1 does not resolve on this machine
                MASTER_PORT=str(port),
            )
        else:
            env.update(torchrun_env(torchrun_topology(1, world, 0, rank, "127.0.0.1", port)))
        # Two cores shared by up to four ranks: intra-op threads would only fight.
        env["OMP_NUM_THREADS"] = "1"
        env["GLOO_SOCKET_IFNAME"] = "lo"
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
        command = [sys.executable, str(WORKER), scenario, str(out), json.dumps(args or {})]
        logs.append((out / f"rank{rank}.log").open("wb"))
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=logs[-1]))
    deadline = time.monotonic() + timeout
    failures: list[str] = []
    for rank, proc in enumerate(procs):
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
                other.wait()
            failures.append(f"rank {rank} still running after {timeout:.0f}s (hang)")
            break
        if code != (expect_exit or {}).get(rank, 0):
            failures.append(f"rank {rank} exited {code}")
    for log in logs:
        log.close()
    if failures:
        tails = "\n".join(
            f"--- rank {r} ---\n" + (out / f"rank{r}.log").read_text(errors="replace")[-3000:]
            for r in range(world)
        )
        raise AssertionError("; ".join(failures) + "\n" + tails)
    reports = (out / f"rank{r}.json" for r in range(world))
    return [json.loads(path.read_text()) if path.exists() else {} for path in reports]
