"""Communication: ring all-reduce vs balanced sharded reduction vs a naive parameter server.

For each network (loopback, and namespace hosts shaped to 100, 400, 1000 Mbit/s each way;
see ``distributed_hosts.py``), each world size N and each message size, every algorithm of
``trainport.distributed.reduction`` averages the same float32 tensor, interleaved rep by rep.
A rep's time is the slowest rank's, between barriers; the table shows the median over reps.

- **bus bandwidth** = size x 2(N-1)/N / time, nccl-tests' convention for all-reduce, for all
  three algorithms so they compare directly; **/link** divides it by the link rate, the
  physical limit of a ring or a balanced reduction on full-duplex links.
- **bal-coll** is the balanced reduction carried by gloo's own collectives
  (``all_to_all_single`` then ``all_gather_into_tensor``), what the library used before it
  switched gloo to point-to-point messages with every receive posted first; it is measured
  in the same run to show what that switch is worth.
- **bytes per rank**: the most any rank sent, from the library's counters, and the ratio of
  the most to the least (1.0 = balanced), plus the kernel's count of bytes the busiest rank
  put on its interface (namespace hosts: ``eth0`` tx_bytes, headers included; loopback:
  bytes written to sockets from ``/proc/self/io``).

    sudo python benchmarks/distributed_comm.py                    # the full grid
    python benchmarks/distributed_comm.py --networks loopback      # no root needed
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from distributed_hosts import Hosts, interface_bytes, run_ranks, written_bytes

ALGORITHMS = ["ring", "balanced", "bal-coll", "naive"]


def worker(out: Path, args: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from trainport.distributed import ALGORITHMS as REDUCE
    from trainport.distributed import Algorithm, Scratch, init_process_group
    from trainport.distributed.reduction import Transport, balanced_average

    # CPU tensors on gloo, also on a machine with GPUs (the ranks emulate CPU hosts).
    topo = init_process_group(backend="gloo")
    interface = args["interface"]

    def kernel_sent() -> int:
        return interface_bytes(interface)[0] if interface != "lo" else written_bytes()

    def reduce(name: str, flat: torch.Tensor) -> Any:
        if name == "bal-coll":
            return balanced_average(flat, None, scratch, transport=Transport.COLLECTIVES)
        return REDUCE[Algorithm(name)](flat, None, scratch)

    scratch = Scratch()
    for name in ALGORITHMS:  # connect every pair once, outside the timed region
        reduce(name, torch.ones(1024))
    results: list[dict[str, Any]] = []
    for size_mb in args["sizes_mb"]:
        n = int(size_mb * 2**20) // 4
        tensor = torch.ones(n)
        times: dict[str, list[float]] = {name: [] for name in ALGORITHMS}
        counted: dict[str, Any] = {}
        kernel: dict[str, int] = dict.fromkeys(ALGORITHMS, 0)
        for _ in range(args["reps"]):
            for name in args["algorithms"]:
                dist.barrier()
                before = kernel_sent()
                start = time.perf_counter()
                count = reduce(name, tensor)
                times[name].append(time.perf_counter() - start)
                kernel[name] += kernel_sent() - before
                counted[name] = {"sent": count.sent, "received": count.received}
        for name in args["algorithms"]:
            results.append(
                {
                    "size_mb": size_mb,
                    "algorithm": name,
                    "times": times[name],
                    **counted[name],
                    "kernel_sent": kernel[name] / args["reps"],
                }
            )
    (out / f"rank{topo.rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def summarise(world: int, network: str, rate: int | None, reports: list[Any]) -> list[dict]:
    rows = []
    for i, first in enumerate(reports[0]):
        per_rank = [r[i] for r in reports]
        slowest = [max(ts) for ts in zip(*(p["times"] for p in per_rank), strict=True)]
        seconds = statistics.median(slowest)
        size = first["size_mb"] * 2**20
        busbw = size * 2 * (world - 1) / world / seconds / 1e6
        sent = [p["sent"] for p in per_rank]
        received = [p["received"] for p in per_rank]
        rows.append(
            {
                "network": network,
                "rate_mbit": rate,
                "world": world,
                "size_mb": first["size_mb"],
                "algorithm": first["algorithm"],
                "seconds": seconds,
                "busbw_mb_s": busbw,
                "link_fraction": None if rate is None else busbw / (rate / 8),
                "sent_max_mb": max(sent) / 2**20,
                "received_max_mb": max(received) / 2**20,
                "max_min": max(sent) / max(1, min(sent)),
                "kernel_sent_max_mb": max(p["kernel_sent"] for p in per_rank) / 2**20,
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'network':>12} {'N':>2} {'MB':>4} {'algorithm':>9} {'time ms':>9} {'busbw MB/s':>10} "
        f"{'/link':>6} {'sent MB max':>11} {'max/min':>7} {'kernel MB max':>13}"
    )
    print(header)
    for r in rows:
        link = "-" if r["link_fraction"] is None else f"{r['link_fraction']:.2f}"
        print(
            f"{r['network']:>12} {r['world']:>2} {r['size_mb']:>4g} {r['algorithm']:>9} "
            f"{r['seconds'] * 1e3:>9.1f} {r['busbw_mb_s']:>10.1f} {link:>6} "
            f"{r['sent_max_mb']:>11.2f} {r['max_min']:>7.2f} {r['kernel_sent_max_mb']:>13.2f}"
        )
    sys.stdout.flush()


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    networks = list(dict.fromkeys(r["network"] for r in rows))
    fig, axes = plt.subplots(1, len(networks), figsize=(4.2 * len(networks), 3.8), squeeze=False)
    colours = {
        "ring": "tab:blue",
        "balanced": "tab:green",
        "bal-coll": "tab:olive",
        "naive": "tab:red",
    }
    styles = {2: ":", 3: "--", 4: "-"}
    for ax, network in zip(axes[0], networks, strict=True):
        mine = [r for r in rows if r["network"] == network]
        for (algorithm, world), colour in (
            ((a, w), colours[a]) for a in ALGORITHMS for w in sorted({r["world"] for r in mine})
        ):
            points = [r for r in mine if r["algorithm"] == algorithm and r["world"] == world]
            if points:
                ax.plot(
                    [p["size_mb"] for p in points],
                    [p["busbw_mb_s"] for p in points],
                    styles.get(world, "-"),
                    color=colour,
                    marker="o",
                    label=f"{algorithm} N={world}",
                )
        rate = mine[0]["rate_mbit"]
        if rate:
            ax.axhline(rate / 8, color="grey", linewidth=0.8, label="link rate")
        ax.set_xscale("log", base=2)
        ax.set_title(network)
        ax.set_xlabel("message size (MB)")
        ax.set_ylabel("bus bandwidth (MB/s)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(
        "gloo CPU reductions: ring all-reduce vs balanced sharded (point-to-point, and on "
        "gloo's collectives) vs naive PS",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), json.loads(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument(
        "--networks",
        nargs="+",
        default=["loopback", "100", "400", "1000"],
        help="loopback and/or link rates in Mbit/s",
    )
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--slow-reps", type=int, default=1, help="reps at <= 100 Mbit/s")
    parser.add_argument(
        "--congestion-control",
        default="cubic",
        help="TCP congestion control inside the namespace hosts (see distributed_hosts.py)",
    )
    parser.add_argument("--results", type=Path, default=Path("/tmp/distributed_comm.json"))
    parser.add_argument("--chart", type=Path, default=Path("docs/img/distributed_comm.png"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/distributed_comm"))
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    rows: list[dict] = []
    for network in opts.networks:
        rate = None if network == "loopback" else int(network)
        hosts = Hosts(max(opts.worlds), rate, opts.congestion_control)
        reps = opts.slow_reps if rate is not None and rate <= 100 else opts.reps
        with hosts:
            for world in opts.worlds:
                args = {
                    "sizes_mb": opts.sizes_mb,
                    "algorithms": opts.algorithms,
                    "reps": reps,
                    "interface": hosts.interface(),
                }
                started = time.monotonic()
                reports = run_ranks(
                    hosts, world, Path(__file__), args, opts.workdir / f"{network}-{world}", 3600
                )
                new = summarise(world, hosts.label, rate, reports)
                logging.info("%s N=%d: %.0f s", hosts.label, world, time.monotonic() - started)
                print_table(new)
                rows.extend(new)
                opts.results.write_text(json.dumps(rows, indent=1))
    print("\nall results")
    print_table(rows)
    chart(rows, opts.chart)
    print(f"\nresults: {opts.results}  chart: {opts.chart}")


if __name__ == "__main__":
    main()
