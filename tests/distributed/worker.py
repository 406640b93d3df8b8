"""One rank of a multi-process test; run by tests/distributed/support.py:launch.

Usage: worker.py SCENARIO OUT_DIR ARGS_JSON. Joins the group from torchrun's variables,
runs the scenario and writes OUT_DIR/rank<k>.json.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainport.distributed import (
    init_process_group,
    register_sharded_hook,
)


def written_bytes() -> int:
    """Bytes this process passed to write()/writev(), sockets included (gloo's sends)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def odd_mlp() -> nn.Module:
    # Layer sizes chosen so parameter (and so bucket) sizes are not multiples of 2, 3 or 4.
    torch.manual_seed(1234)
    return nn.Sequential(
        nn.Linear(12, 37), nn.Tanh(), nn.Linear(37, 29), nn.Tanh(), nn.Linear(29, 7)
    )


def batch(rank: int, step: int, features: int, size: int = 8) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(size, features, generator=generator)


def gradients(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """Max |hooked - default DDP| over all gradients of 3 steps, per algorithm and bucket cap."""
    results: dict[str, Any] = {"diff": {}, "bucket_elements": {}}
    device = torch.device(args.get("device", "cpu"))
    base = odd_mlp().to(device)
    for algorithm in args.get("algorithms", ["balanced", "ring", "naive", "balanced:collectives"]):
        for cap in args.get("caps_mb", [0.002, 25.0]):
            reference = DDP(copy.deepcopy(base), bucket_cap_mb=cap)
            hooked = DDP(copy.deepcopy(base), bucket_cap_mb=cap)
            # "balanced:collectives": the balanced reduction on gloo's own collectives;
            # "hierarchical:balanced": the leaders reduce by the balanced stream.
            name, _, variant = algorithm.partition(":")
            hierarchical = name == "hierarchical"
            reducer = register_sharded_hook(
                hooked,
                algorithm=name,
                transport=None if hierarchical else variant or None,
                per_host=args.get("per_host"),
                across=variant if hierarchical and variant else "ring",
            )
            opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
            opt_hooked = torch.optim.SGD(hooked.parameters(), lr=0.1)
            worst = 0.0
            for step in range(3):
                x = batch(rank, step, 12).to(device)
                for model, opt in ((reference, opt_ref), (hooked, opt_hooked)):
                    opt.zero_grad()
                    model(x).pow(2).mean().backward()
                for a, b in zip(reference.parameters(), hooked.parameters(), strict=True):
                    assert a.grad is not None and b.grad is not None
                    worst = max(worst, (a.grad - b.grad).abs().max().item())
                opt_ref.step()
                opt_hooked.step()
            key = f"{algorithm}@{cap}"
            results["diff"][key] = worst
            results["bucket_elements"][key] = sorted(
                {
                    e["args"]["bytes"] // 4
                    for e in reducer.timeline.events()
                    if e["name"].startswith("ready")
                }
            )
            reducer.close()
    return results


def traffic(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """Bytes counted by the hook and by the kernel over a few balanced DDP steps."""
    torch.manual_seed(7)
    device = torch.device(args.get("device", "cpu"))
    # About 4 MB of gradients in buckets whose sizes are not multiples of N.
    model = DDP(nn.Sequential(nn.Linear(1001, 997), nn.Linear(997, 3)).to(device), bucket_cap_mb=1)
    reducer = register_sharded_hook(model, algorithm=args.get("algorithm", "balanced"))
    steps = int(args.get("steps", 3))

    def step(i: int) -> None:
        model.zero_grad()
        model(batch(rank, i, 1001, size=4).to(device)).sum().backward()

    step(0)  # the first step rebuilds DDP's buckets; measure steady state
    dist.barrier()
    reducer.counter.reset()
    before = written_bytes()
    for i in range(steps):
        step(i + 1)
    wrote = written_bytes() - before
    count = reducer.counter.snapshot()
    reducer.close()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "bucket_bytes": param_bytes * steps,
        "sent": count.sent,
        "received": count.received,
        "kernel_written": wrote,
    }


def soak(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """Many small buckets for many steps; parameters must stay identical on every rank."""
    torch.manual_seed(99)
    layers: list[nn.Module] = []
    for _ in range(int(args.get("layers", 12))):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    # A 0.5 KB cap puts about one layer in each bucket.
    model = DDP(nn.Sequential(*layers), bucket_cap_mb=0.0005)
    reducer = register_sharded_hook(model, algorithm=args.get("algorithm", "balanced"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.monotonic()
    steps = int(args.get("steps", 200))
    for i in range(steps):
        opt.zero_grad()
        model(batch(rank, i, 16)).pow(2).mean().backward()
        opt.step()
    elapsed = time.monotonic() - start
    checksum = torch.cat([p.detach().flatten() for p in model.parameters()]).double().sum()
    sums = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(sums, checksum.reshape(1))
    trace = reducer.timeline.write(Path(args["out"]) / f"trace-rank{rank}.json")
    reducer.close()
    buckets = sum(1 for e in reducer.timeline.events() if e["name"].startswith("ready"))
    return {
        "steps": steps,
        "seconds": elapsed,
        "checksums": [s.item() for s in sums],
        "buckets": buckets,
        "trace": str(trace),
        "collectives": reducer.counter.snapshot().collectives,
    }


def peer_dies(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 exits before its third backward pass (after DDP rebuilt its buckets).

    The others must fail with the reduction's error, not hang.
    """
    model = DDP(odd_mlp(), bucket_cap_mb=0.002)
    register_sharded_hook(model)
    for i in range(3):
        if i == 2 and rank == 1:
            os._exit(17)
        try:
            model(batch(rank, i, 12)).sum().backward()
        except Exception as exc:  # what the trainer sees is the point of this scenario
            report = {"failed_at_step": i, "error": type(exc).__name__, "message": str(exc)}
            (Path(args["out"]) / f"rank{rank}.json").write_text(json.dumps(report))
            os._exit(0)  # the group is broken: skip the closing barrier
    return {"failed_at_step": None}


def join(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """The group formed: an all-reduce of rank + 1 sums to N(N+1)/2 everywhere."""
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    return {"sum": total.item()}


def large(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """Max error of balanced_average on a tensor of several padded slices, per transport."""
    from trainport.distributed.reduction import Transport, balanced_average, pieces

    n = 5 * 2**20 // 4 + 3  # several slices, and not a multiple of N
    world = dist.get_world_size()
    values = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    expected = torch.stack(values).mean(dim=0)
    errors = {}
    for transport in Transport:
        flat = values[rank].clone()
        balanced_average(flat, transport=transport)
        errors[transport.value] = {
            "error": (flat - expected).abs().max().item(),
            "slices": len(pieces(flat, world)),
        }
    return errors


SCENARIOS = {
    "large": large,
    "join": join,
    "gradients": gradients,
    "traffic": traffic,
    "soak": soak,
    "peer_dies": peer_dies,
}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    scenario, out, raw = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    args = json.loads(raw)
    args["out"] = str(out)
    topology = init_process_group(backend=args.get("backend"))
    results: dict[str, Any] = {
        "rank": topology.rank,
        "world_size": topology.world_size,
        "launcher": topology.launcher.value,
    }
    for name in scenario.split(","):
        results[name] = SCENARIOS[name](topology.rank, args)
    (out / f"rank{topology.rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
