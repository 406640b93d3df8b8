"""SMDDP against plain DDP on gloo: a 4-host job, shaped links, one run.

The model, emulated compute and measurement are ``distributed_e2e.py``'s (read its
docstring): an MLP whose forward and backward compute is a fixed sleep per layer, real
float32 gradients in DDP buckets. Here every host runs ``--per-host`` ranks (1, a CPU
host's default; or one per GPU) in one network namespace whose link is shaped to each
rate of ``--networks`` (``distributed_hosts.py``); ranks of a host talk over the
namespace's own loopback. Two methods take turns in the same run, each written as a
job's script writes it:

- **ddp**: ``DistributedDataParallel(model)`` on a gloo group: gloo's ring all-reduce over
  all ranks;
- **smddp**: ``DistributedDataParallel(model)`` on the default group made with
  ``backend="smddp"``, as after ``import smdistributed.dataparallel.torch.torch_smddp``:
  whatever trainport's ``smdistributed.dataparallel`` gives that model on these hosts.

Neither sets ``bucket_cap_mb`` unless ``--bucket-mb`` is given, so each method's DDP has the
bucket size it chooses for itself (printed); ``--bucket-mb`` gives both the same one.
Printed per rate: samples/s of each (N x batch / mean step of the slowest rank) and the
ratio smddp / ddp; ``--balanced`` adds the balanced hook over all ranks, for comparison.

    sudo python benchmarks/smddp_e2e.py                       # 4 hosts x 1 rank, 1000 and 400 Mbit
    sudo python benchmarks/smddp_e2e.py --bucket-mb 1         # both with the same buckets
    sudo python benchmarks/smddp_e2e.py --per-host 2          # hosts of two ranks (GPUs)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from distributed_e2e import summarise
from distributed_hosts import REPO, Hosts

from trainport.distributed import torchrun_env, torchrun_topology

SCRIPT = Path(__file__).with_name("distributed_e2e.py")


def run_hosts(
    hosts: Hosts, per_host: int, args: dict[str, Any], out: Path, port: int
) -> list[dict[str, Any]]:
    """``per_host`` ranks on each host, numbered host by host, as torchrun would start them."""
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for node in range(hosts.count):
        for local in range(per_host):
            topo = torchrun_topology(hosts.count, per_host, node, local, hosts.address(0), port)
            env = dict(os.environ)
            env.update(torchrun_env(topo))
            env["OMP_NUM_THREADS"] = "1"
            env["GLOO_SOCKET_IFNAME"] = hosts.interface()
            env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
            argv = [sys.executable, str(SCRIPT), "--worker", str(out), json.dumps(args)]
            log = (out / f"rank{topo.rank}.log").open("wb")
            procs.append((subprocess.Popen(hosts.wrap(node, argv), env=env, stderr=log), log))
    failed = [k for k, (proc, _) in enumerate(procs) if proc.wait(timeout=1800) != 0]
    for _, log in procs:
        log.close()
    if failed:
        tail = (out / f"rank{failed[0]}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{hosts.label}: ranks {failed} failed\n{tail}")
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(len(procs))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--per-host", type=int, default=1)
    parser.add_argument("--networks", type=int, nargs="+", default=[1000, 400])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--forward-ms", type=float, default=30.0)
    parser.add_argument("--backward-ms", type=float, default=60.0)
    parser.add_argument(
        "--bucket-mb",
        type=float,
        help="the same bucket size for both (default: each DDP's own choice, as in a script)",
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--balanced",
        action="store_true",
        help="also the balanced hook over all ranks, without the hierarchy (a third method)",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/smddp_e2e"))
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = {
        key: getattr(opts, key)
        for key in ("width", "layers", "batch", "forward_ms", "backward_ms", "bucket_mb")
    }
    methods = ["ddp", "smddp", *(["balanced"] if opts.balanced else [])]
    args.update(methods=methods, warmup=opts.warmup, rounds=opts.rounds, steps=opts.steps)
    world = opts.hosts * opts.per_host
    print(f"{opts.hosts} hosts x {opts.per_host} ranks; load before: {os.getloadavg()[0]:.2f}")
    extra = f" {'balanced samples/s':>19} {'balanced/ddp':>13}" if opts.balanced else ""
    print(f"{'link':>10} {'ddp samples/s':>14} {'smddp samples/s':>16} {'smddp/ddp':>10}{extra}")
    for k, rate in enumerate(opts.networks):
        with Hosts(opts.hosts, rate) as hosts:
            started = time.monotonic()
            reports = run_hosts(hosts, opts.per_host, args, opts.workdir / str(rate), 29500 + k)
            rows = {
                r["method"]: r for r in summarise(hosts.label, world, reports, opts.batch, None)
            }
        ddp, smddp = rows["ddp"]["samples_s"], rows["smddp"]["samples_s"]
        extra = ""
        if opts.balanced:
            flat = rows["balanced"]["samples_s"]
            extra = f" {flat:>19.1f} {flat / ddp:>13.3f}"
        mib = {m: reports[0][m]["bucket_bytes"] / 2**20 for m in ("ddp", "smddp")}
        print(
            f"{hosts.label:>10} {ddp:>14.1f} {smddp:>16.1f} {smddp / ddp:>10.3f}{extra}"
            f"   (buckets: ddp {mib['ddp']:.2f} MiB, smddp {mib['smddp']:.2f} MiB;"
            f" {time.monotonic() - started:.0f} s)"
        )
        sys.stdout.flush()
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
