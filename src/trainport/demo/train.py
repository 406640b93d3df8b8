"""The demo's training script, written as for SageMaker's PyTorch estimator (script mode).

It reads its channels and model folder from the SM_* variables, hyperparameters arrive as
``--key value`` arguments, metrics are printed as ``key=value`` lines that the job's
MetricDefinitions pick up, and a SIGTERM (stop or max runtime) saves the model before exit.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn


def load(channel_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = []
    for path in sorted(Path(channel_dir).rglob("*.csv")):
        with open(path) as f:
            rows += [list(map(float, r)) for r in csv.reader(f)]
    data = torch.tensor(rows, dtype=torch.float32)
    return data[:, :-1], data[:, -1].long()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
    parser.add_argument("--validation", default=os.environ.get("SM_CHANNEL_VALIDATION"))
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = load(args.train)
    vx, vy = load(args.validation)
    model = nn.Sequential(nn.Linear(x.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 2))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def save(*_: object) -> None:
        torch.save(model.state_dict(), Path(args.model_dir) / "model.pt")
        (Path(args.model_dir) / "config.json").write_text(json.dumps(vars(args)))

    def on_term(signum: int, frame: object) -> None:
        print("SIGTERM: saving the model before exiting", flush=True)
        save()
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    print(f"training on {len(x)} rows, validating on {len(vx)}; hosts={os.environ['SM_HOSTS']}")
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(len(x))
        total = 0.0
        for i in range(0, len(x), 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        model.eval()
        with torch.no_grad():
            accuracy = (model(vx).argmax(1) == vy).float().mean().item()
        mean_loss = total / len(x)
        print(f"epoch={epoch} train_loss={mean_loss:.4f} val_accuracy={accuracy:.4f}", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
