"""End to end: data-parallel MLP training, default DDP vs the balanced hook vs a naive PS.

Two cores cannot run four real ranks of compute, so **forward and backward compute are
emulated by a fixed sleep** (``--forward-ms`` / ``--backward-ms`` per step, split evenly
over the layers; the real matmuls of the small MLP are also run but are tiny). The sleep
sits in each layer, so a layer's gradients become ready only after its share of backward
"compute", exactly as on a GPU, and communication can overlap the rest of the backward
pass. The gradients are real: ``--layers`` x Linear(width, width) in float32 (4.2 MB at the
defaults), fused into DDP buckets of ``--bucket-mb``.

Per network (loopback; namespace hosts shaped to 100, 400, 1000 Mbit/s each way, see
``distributed_hosts.py``) and per N = 2..4, each method trains ``--warmup`` unmeasured
steps, then the methods take turns for ``--rounds`` rounds of ``--steps`` measured steps
(so that changes in the shared machine's load fall on all of them alike):

- **samples/s** = N x batch / mean step time (slowest rank);
- **scaling efficiency vs one rank** = samples/s / (N x samples/s of one rank with default
  DDP); one rank does not communicate, so that baseline is measured once, on loopback;
- **scaling efficiency vs alone** = the same against N ranks that compute at once without
  communicating ("alone": each rank also trains the model without DDP, in the same rounds).
  On a cluster every rank has its own GPU and cores, so one rank's pace does not depend
  on N; here N ranks share two cores, and the sleeps' wake-ups, the real matmuls and
  Python run slower at N = 4 than alone whether or not anything is communicated. This
  baseline takes that out and leaves what communication costs;
- **exposed comm** = mean time from the end of the last backward compute to
  ``loss.backward()`` returning: the communication the overlap did not hide.

    sudo python benchmarks/distributed_e2e.py                     # the full grid
    python benchmarks/distributed_e2e.py --networks loopback       # no root needed
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from distributed_hosts import Hosts, run_ranks

METHODS = ["ddp", "balanced", "naive", "bal-coll", "sync", "hierarchical", "smddp"]
DEFAULT_METHODS = METHODS[:3]
ALONE = "alone"
GOAL = 0.9


def worker(out: Path, args: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainport.distributed import init_process_group, register_sharded_hook

    group = None
    if "smddp" in args["methods"]:
        # As a job's script: the default group on SMDDP's backend; the other methods get a
        # plain gloo group of the same ranks.
        from trainport.distributed.smddp.api import BACKEND, register_backend

        register_backend()
        topo = init_process_group(backend=BACKEND)
        group = dist.new_group(backend="gloo")
    else:
        # CPU tensors on gloo, also on a machine with GPUs (the ranks emulate CPU hosts).
        topo = init_process_group(backend="gloo")
    layers = args["layers"]
    forward_s = args["forward_ms"] / 1e3 / layers
    backward_s = args["backward_ms"] / 1e3 / layers
    clock = {"backward_compute_end": 0.0}

    class EmulatedCompute(torch.autograd.Function):
        """Identity whose forward and backward sleep for this layer's share of compute."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            time.sleep(forward_s)
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            time.sleep(backward_s)
            clock["backward_compute_end"] = time.perf_counter()
            return grad

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.linear = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return EmulatedCompute.apply(torch.relu(self.linear(x)))

    width, batch = args["width"], args["batch"]
    data = torch.randn(batch, width, generator=torch.Generator().manual_seed(topo.rank))
    setups = {}
    # No bucket size: each DDP chooses its own, as in a script that does not set one.
    buckets = {} if args["bucket_mb"] is None else {"bucket_cap_mb": args["bucket_mb"]}
    for method in args["methods"]:
        torch.manual_seed(0)
        module = nn.Sequential(*(Block(width) for _ in range(layers)))
        # smddp: the default group, as a job's DDP on the smddp backend gets it.
        model = DDP(module, process_group=None if method == "smddp" else group, **buckets)
        reducer = None
        if method == "sync":
            # Synchronisation without the bytes: one 4-byte all-reduce per bucket, the
            # gradients left as they are. What N ranks on this machine reach when
            # communication costs (almost) nothing.
            model.register_comm_hook(None, _sync_only)
        elif method == "bal-coll":  # the balanced reduction on gloo's own collectives
            reducer = register_sharded_hook(model, algorithm="balanced", transport="collectives")
        elif method == "smddp":
            reducer = getattr(model, "_trainport_reducer", None)
        elif method != "ddp":
            reducer = register_sharded_hook(model, algorithm=method)
        setups[method] = (model, reducer, torch.optim.SGD(model.parameters(), lr=1e-3))
    # The same model without DDP: what each rank computes while the other N-1 compute too,
    # with no communication at all (see "alone" in the module docstring).
    torch.manual_seed(0)
    alone = nn.Sequential(*(Block(width) for _ in range(layers)))
    setups[ALONE] = (alone, None, torch.optim.SGD(alone.parameters(), lr=1e-3))

    def train(method: str, count: int) -> tuple[list[float], list[float]]:
        model, _reducer, opt = setups[method]
        steps, exposed = [], []
        for _ in range(count):
            start = time.perf_counter()
            opt.zero_grad()
            model(data).pow(2).mean().backward()
            backward_end = time.perf_counter()
            opt.step()
            steps.append(time.perf_counter() - start)
            exposed.append(backward_end - clock["backward_compute_end"])
        return steps, exposed

    for method in setups:
        train(method, args["warmup"])
    # Methods take turns, a block of steps each per round, so that a change in the
    # machine's load (it is shared) falls on all of them alike.
    rounds: dict[str, list[tuple[list[float], list[float]]]] = {m: [] for m in setups}
    cpu: dict[str, float] = dict.fromkeys(setups, 0.0)  # this process's CPU time, all threads
    for _ in range(args["rounds"]):
        for method in setups:
            dist.barrier()
            before = time.process_time()
            rounds[method].append(train(method, args["steps"]))
            cpu[method] += time.process_time() - before
    results: dict[str, Any] = {}
    for method, (_model, reducer, _opt) in setups.items():
        steps = [t for block, _ in rounds[method] for t in block]
        exposed = [t for _, block in rounds[method] for t in block]
        results[method] = {
            "step_s": sum(steps) / len(steps),
            "round_step_s": [sum(block) / len(block) for block, _ in rounds[method]],
            "exposed_s": sum(exposed) / len(exposed),
            "cpu_s": cpu[method] / len(steps),
            "sent": reducer.counter.snapshot().sent if reducer else None,
            "bucket_bytes": getattr(_model, "bucket_bytes_cap", None),
        }
        if reducer is not None:
            if args.get("trace_dir"):
                name = f"{method}-N{topo.world_size}-rank{topo.rank}.json"
                reducer.timeline.write(Path(args["trace_dir"]) / name)
            reducer.close()
    dist.barrier()
    model = next(iter(setups.values()))[0]
    results["gradient_bytes"] = sum(p.numel() * 4 for p in model.parameters())
    (out / f"rank{topo.rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _sync_only(state, bucket):  # type: ignore[no-untyped-def]
    # Unannotated: DDP rejects a hook whose annotations are not its own types, and this
    # module's annotations are strings.
    import torch
    import torch.distributed as dist

    work = dist.all_reduce(torch.zeros(1), async_op=True)
    return work.get_future().then(lambda _: bucket.buffer())


def summarise(
    network: str, world: int, reports: list[Any], batch: int, base: float | None
) -> list[dict]:
    rows = []
    # Each rank's own pace without communication, at this N (the mean over ranks: they do
    # not wait for one another), per round.
    rounds = len(reports[0][ALONE]["round_step_s"])
    alone = [sum(r[ALONE]["round_step_s"][i] for r in reports) / world for i in range(rounds)]
    for method in METHODS:
        if method not in reports[0]:
            continue
        step = max(r[method]["step_s"] for r in reports)
        rate = world * batch / step
        # A step of the method ends when its slowest rank's does.
        per_round = [max(r[method]["round_step_s"][i] for r in reports) for i in range(rounds)]
        shared = [a / t for a, t in zip(alone, per_round, strict=True)]
        rows.append(
            {
                "network": network,
                "world": world,
                "method": method,
                "step_ms": step * 1e3,
                "samples_s": rate,
                "efficiency": None if base is None else rate / (world * base),
                "alone_step_ms": sum(alone) / rounds * 1e3,
                "efficiency_shared": sum(alone) / sum(per_round),
                "exposed_ms": max(r[method]["exposed_s"] for r in reports) * 1e3,
                "cpu_ms": sum(r[method]["cpu_s"] for r in reports) / world * 1e3,
                "round_efficiency_shared": shared,
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"{'network':>12} {'N':>2} {'method':>9} {'step ms':>8} {'samples/s':>9} "
        f"{'eff vs 1':>8} {'alone ms':>8} {'eff vs alone':>12} {'per round':>11} "
        f"{'exposed ms':>10} {'CPU ms':>6}"
    )
    for r in rows:
        eff = "-" if r["efficiency"] is None else f"{r['efficiency']:.3f}"
        spread = r["round_efficiency_shared"]
        print(
            f"{r['network']:>12} {r['world']:>2} {r['method']:>9} {r['step_ms']:>8.1f} "
            f"{r['samples_s']:>9.1f} {eff:>8} {r['alone_step_ms']:>8.1f} "
            f"{r['efficiency_shared']:>12.3f} {min(spread):>5.3f}-{max(spread):.3f} "
            f"{r['exposed_ms']:>10.1f} {r['cpu_ms']:>6.1f}"
        )
    sys.stdout.flush()


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    networks = [n for n in dict.fromkeys(r["network"] for r in rows) if n != "one rank"]
    fig, axes = plt.subplots(1, len(networks), figsize=(4 * len(networks), 3.6), squeeze=False)
    colours = {
        "ddp": "tab:blue",
        "balanced": "tab:green",
        "naive": "tab:red",
        "bal-coll": "tab:olive",
        "sync": "tab:grey",
        "hierarchical": "tab:purple",
        "smddp": "tab:orange",
    }
    for ax, network in zip(axes[0], networks, strict=True):
        for method in METHODS:
            points = [r for r in rows if r["network"] == network and r["method"] == method]
            if not points:
                continue
            points = [{"world": 1, "efficiency": 1.0}, *points]
            ax.plot(
                [p["world"] for p in points],
                [p["efficiency"] for p in points],
                marker="o",
                color=colours[method],
                label={"ddp": "default DDP"}.get(method, f"{method} hook"),
            )
        ax.axhline(GOAL, color="grey", linestyle="--", linewidth=0.8, label=f"goal {GOAL}")
        ax.set_ylim(0, 1.05)
        ax.set_xticks([1, 2, 3, 4])
        ax.set_title(network)
        ax.set_xlabel("ranks N")
        ax.set_ylabel("scaling efficiency")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("MLP data-parallel training, compute emulated by sleep (gloo, CPU)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), json.loads(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--networks", nargs="+", default=["loopback", "100", "400", "1000"])
    parser.add_argument(
        "--methods",
        nargs="+",
        default=DEFAULT_METHODS,
        choices=METHODS,
        help="bal-coll: the balanced hook on gloo's collectives instead of point-to-point; "
        "sync: a 4-byte all-reduce per bucket and no gradient bytes (the machine's ceiling)",
    )
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--forward-ms", type=float, default=30.0)
    parser.add_argument("--backward-ms", type=float, default=60.0)
    parser.add_argument("--bucket-mb", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=20, help="measured steps per round")
    parser.add_argument("--slow-steps", type=int, default=4, help="the same at <= 100 Mbit/s")
    parser.add_argument("--rounds", type=int, default=3, help="turns each method takes")
    parser.add_argument(
        "--congestion-control",
        default="cubic",
        help="TCP congestion control inside the namespace hosts (see distributed_hosts.py)",
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--results", type=Path, default=Path("/tmp/distributed_e2e.json"))
    parser.add_argument("--chart", type=Path, default=Path("docs/img/distributed_e2e.png"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/distributed_e2e"))
    parser.add_argument("--trace-dir", type=Path, help="write each hook's per-rank timeline")
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    common = {
        key: getattr(opts, key)
        for key in ("width", "layers", "batch", "forward_ms", "backward_ms", "bucket_mb")
    }
    common.update(methods=opts.methods, warmup=opts.warmup, rounds=opts.rounds)
    if opts.trace_dir:
        opts.trace_dir.mkdir(parents=True, exist_ok=True)
        common["trace_dir"] = str(opts.trace_dir.resolve())
    script = Path(__file__)
    with Hosts(1, None) as alone:
        one = run_ranks(
            alone,
            1,
            script,
            {**common, "methods": ["ddp"], "steps": opts.steps},
            opts.workdir / "one",
            600,
        )
    base = opts.batch / one[0]["ddp"]["step_s"]
    rows = summarise("one rank", 1, one, opts.batch, base)
    print(
        f"gradients: {one[0]['gradient_bytes'] / 2**20:.2f} MiB per step; "
        f"emulated compute {opts.forward_ms:g} + {opts.backward_ms:g} ms per step"
    )
    print_table(rows)
    for network in opts.networks:
        rate = None if network == "loopback" else int(network)
        steps = opts.slow_steps if rate is not None and rate <= 100 else opts.steps
        with Hosts(max(opts.worlds), rate, opts.congestion_control) as hosts:
            for world in opts.worlds:
                reports = run_ranks(
                    hosts,
                    world,
                    script,
                    {**common, "steps": steps},
                    opts.workdir / f"{network}-{world}",
                    1800,
                )
                new = summarise(hosts.label, world, reports, opts.batch, base)
                print_table(new)
                rows.extend(new)
                opts.results.write_text(json.dumps(rows, indent=1))
    print("\nall results")
    print_table(rows)
    chart(rows, opts.chart)
    print(f"\nresults: {opts.results}  chart: {opts.chart}")


if __name__ == "__main__":
    main()
