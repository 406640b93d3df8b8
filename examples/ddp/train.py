"""A data-parallel PyTorch job: run with torchrun on every host by trainport.

    trainport run --entry-point examples/ddp/train.py --instance-count 2 --torchrun --hp epochs=3

Each rank trains on its own shard of a synthetic regression problem with DDP over gloo;
rank 0 saves the model. ``--reduction balanced`` (the default) reduces gradients with
trainport.distributed's balanced sharded hook (SageMaker's balanced fusion buffers);
``--reduction ddp`` keeps DDP's own all-reduce. Written for SageMaker's PyTorch estimator
too (distribution ``torch_distributed``): it reads only torchrun's variables and
SM_MODEL_DIR. Each rank's communication timeline goes to the job's output data.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainport.distributed import init_process_group, register_sharded_hook


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--reduction", choices=["balanced", "ring", "naive", "ddp"], default="balanced"
    )
    args = parser.parse_args()

    topology = init_process_group()
    rank, world = topology.rank, topology.world_size
    torch.manual_seed(0)
    true_w = torch.randn(16, 1)
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    x = torch.randn(2048, 16, generator=generator)
    y = x @ true_w + 0.01 * torch.randn(2048, 1, generator=generator)

    model = DistributedDataParallel(nn.Linear(16, 1))
    reducer = None
    if args.reduction != "ddp":
        reducer = register_sharded_hook(model, algorithm=args.reduction)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        total = 0.0
        for i in range(0, len(x), 128):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[i : i + 128]), y[i : i + 128])
            loss.backward()  # gradients are averaged across all ranks here
            opt.step()
            total += loss.item()
        mean = torch.tensor([total / (len(x) // 128)])
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch={epoch} world={world} loss={mean.item() / world:.6f}", flush=True)
    if reducer is not None:
        sent = reducer.counter.snapshot().sent
        print(f"rank={rank} reduction={args.reduction} bytes_sent={sent}", flush=True)
        output = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
        reducer.timeline.write(str(output / f"comm-rank{rank}.json"))
        reducer.close()
    if rank == 0:
        model_dir = Path(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
        torch.save(model.module.state_dict(), model_dir / "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
