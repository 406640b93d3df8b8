"""The communication hook on real gloo ranks over 127.0.0.1.

One launch per world size runs both the gradient and the traffic scenario (starting
processes dominates on two cores); the tests below read its reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.support import launch

Reports = list[dict[str, Any]]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Reports]:
    cache: dict[int, Reports] = {}

    def run(world: int) -> Reports:
        if world not in cache:
            out = tmp_path_factory.mktemp(f"world{world}")
            cache[world] = launch(world, "gradients,traffic", out, timeout=180)
        return cache[world]

    return run


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_gradients_equal_default_ddp(ranks: Callable[[int], Reports], world: int) -> None:
    for report in ranks(world):
        diffs = report["gradients"]["diff"]
        algorithms = ("balanced", "ring", "naive", "balanced:collectives")
        assert set(diffs) == {f"{a}@{c}" for a in algorithms for c in (0.002, 25.0)}
        assert max(diffs.values()) <= 1e-6, diffs
        if world > 1:
            # The small cap must have produced buckets that need padding to N shards.
            sizes = report["gradients"]["bucket_elements"]["balanced@0.002"]
            assert len(sizes) >= 2 and any(size % world for size in sizes), sizes


def test_hierarchical_gradients_equal_default_ddp(tmp_path: Path) -> None:
    # 2 hosts of 2 ranks: sum within each host, across the leaders (the backend's ring, or
    # the balanced stream), broadcast.
    algorithms = ["hierarchical", "hierarchical:balanced"]
    args = {"algorithms": algorithms, "per_host": 2}
    for report in launch(4, "gradients", tmp_path, timeout=180, args=args):
        diffs = report["gradients"]["diff"]
        assert set(diffs) == {f"{a}@{cap}" for a in algorithms for cap in (0.002, 25.0)}
        assert max(diffs.values()) <= 1e-6, diffs


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_bytes_per_rank_are_balanced(ranks: Callable[[int], Reports], world: int) -> None:
    for report in ranks(world):
        traffic = report["traffic"]
        expected = 2 * (world - 1) / world * traffic["bucket_bytes"]
        if world == 1:
            assert traffic["sent"] == traffic["received"] == traffic["kernel_written"] == 0
            continue
        for measured in ("sent", "received", "kernel_written"):
            assert traffic[measured] == pytest.approx(expected, rel=0.05), (measured, traffic)


@pytest.mark.slow
def test_many_small_buckets_do_not_hang(tmp_path: Path) -> None:
    reports = launch(3, "soak", tmp_path, timeout=150, args={"steps": 200, "layers": 12})
    for report in reports:
        soak = report["soak"]
        assert soak["steps"] == 200
        assert soak["buckets"] >= 200 * 10  # about one bucket per layer per step
        assert len(set(soak["checksums"])) == 1  # parameters identical on every rank
        assert soak["collectives"] == 2 * soak["buckets"]
        trace = json.loads(Path(soak["trace"]).read_text())["traceEvents"]
        ready = [e for e in trace if e["name"].startswith("ready")]
        reduce = [e for e in trace if e["name"].startswith("reduce")]
        assert len(ready) == len(reduce) == soak["buckets"]
        assert all(e["ph"] == "X" and e["tid"] == "comm" for e in reduce)
        # The thread serves buckets in the order they were handed over, each after its
        # hand-over. They may complete out of order: buckets land from the backend's
        # threads, and one bucket's all-gather overlaps the next one's all-to-all.
        reduce.sort(key=lambda e: e["ts"])
        for handed, served in zip(ready, reduce, strict=True):
            assert served["name"] == "reduce " + handed["name"].removeprefix("ready ")
            assert served["ts"] >= handed["ts"]


def test_dead_peer_fails_the_others(tmp_path: Path) -> None:
    reports = launch(3, "peer_dies", tmp_path, timeout=90, expect_exit={1: 17})
    for rank in (0, 2):
        assert reports[rank]["failed_at_step"] == 2
        assert f"balanced reduction of bucket 0 failed on rank {rank}" in reports[rank]["message"]


def test_sagemaker_variables_form_the_group(tmp_path: Path) -> None:
    """No torchrun: SM_HOSTS / SM_CURRENT_HOST place the ranks, rank 0 serves the store."""
    reports = launch(3, "join", tmp_path, timeout=90, sagemaker=True)
    assert [r["rank"] for r in reports] == [0, 1, 2]
    assert all(r["launcher"] == "sagemaker" and r["join"]["sum"] == 6.0 for r in reports)


def test_both_transports_average_a_large_padded_tensor(tmp_path: Path) -> None:
    for report in launch(3, "large", tmp_path, timeout=90):
        for transport in ("p2p", "collectives"):
            got = report["large"][transport]
            assert got["slices"] > 1
            assert got["error"] <= 1e-6, (transport, got)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 16])
def test_slices_cover_the_bucket_in_bounded_pieces(world: int) -> None:
    import torch

    from trainport.distributed.reduction import MIN_PIECES, MIN_SHARD_BYTES, PIECE_BYTES, pieces

    largest = max(PIECE_BYTES // 4, 2 * world * MIN_SHARD_BYTES // 4)
    for n in (1, world, 1000, 131_072, 131_328, 262_145, 5 * 2**20 // 4 + 3):
        flat = torch.arange(n, dtype=torch.float32)
        parts = pieces(flat, world)
        assert torch.equal(torch.cat(parts), flat)
        assert all(p.numel() <= largest for p in parts)
        # Short tensors are still cut (for several all-to-alls in flight), never into
        # shards below MIN_SHARD_BYTES; long ones into PIECE_BYTES slices.
        assert len(parts) <= max(MIN_PIECES, -(-n // (PIECE_BYTES // 4)))
        if len(parts) > 1:
            assert all(p.numel() >= world * MIN_SHARD_BYTES // 4 for p in parts)
        # No runt slice: each one costs a round of collectives whatever its size.
        sizes = [p.numel() for p in parts]
        assert max(sizes) - min(sizes) <= 1
