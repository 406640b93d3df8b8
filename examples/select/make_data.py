"""Write a small synthetic classification dataset for examples/select/spec.yaml.

python examples/select/make_data.py && trainport select examples/select/spec.yaml
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def main(
    root: Path = Path(__file__).parent / "data", rows: int = 40_000, features: int = 16
) -> None:
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(2, features)) / np.sqrt(features)
    for split, n, files in (("train", rows, 8), ("val", rows // 10, 1)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in range(files):
            x = rng.normal(size=(n // files, features)).astype("float32")
            y = ((2 * x @ w1 + (x @ w2) ** 2 - 1) > 0).astype("int64")
            np.savez(root / split / f"part-{i:02d}.npz", x=x, y=y)
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
