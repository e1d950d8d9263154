r"""Model size ablation: the BERT paper's Table 6 grid of (layers L, hidden H, heads A).

Purpose: MLM perplexity and downstream accuracy against model size. `base` runs the paper's
exact grid; `tiny`/`mini` run the same shape shrunk to CPU size (depth / 3, width 768 -> 128
or 256, 64-dim heads kept, and the paper's "few wide heads" row kept as one or two heads).

Command (`arg` is VARIANT,L=..,H=..,A=..; the intermediate size is 4H, as BERT's):
  bertjax pretrain --config experiments/size.py:base,L=6,H=768,A=3 --workdir gs://B/size6x768x3
  python -m experiments.ablate --sweep size --scale tiny --steps 300 --out runs/ablate_size

Hardware: tiny grid: 2 CPU cores (the largest row, 8x192, ~6x the tiny model's cost);
base grid: a TPU slice per row, the 24x1024 row being BERT-large.

Expected result (paper, Table 6: L/H/A, LM ppl on held-out training data, dev MNLI-m / MRPC /
SST-2): 3/768/12 5.84 77.9/79.8/88.4; 6/768/3 5.24 80.6/82.2/90.7; 6/768/12 4.68 81.9/84.8/91.3;
12/768/12 3.99 84.4/86.7/92.9; 12/1024/16 3.54 85.7/86.9/93.3; 24/1024/16 3.23 86.6/87.8/93.7.
"""

from __future__ import annotations

import pathlib
import sys

import ml_collections

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # see no_nsp.py
from experiments import pretrain  # noqa: E402

# scale -> rows (L, H, A), in the paper's order (experiments/ablate.py --sweep size)
GRID = {
    "base": (
        (3, 768, 12),
        (6, 768, 3),
        (6, 768, 12),
        (12, 768, 12),
        (12, 1024, 16),
        (24, 1024, 16),
    ),
    "mini": ((1, 256, 4), (2, 256, 1), (2, 256, 4), (4, 256, 4), (4, 320, 5), (8, 320, 5)),
    "tiny": ((1, 128, 2), (2, 128, 1), (2, 128, 2), (4, 128, 2), (4, 192, 3), (8, 192, 3)),
}
GRID["demo"] = GRID["tiny"]  # the demo recipe trains the tiny preset


def get_config(arg: str = "tiny,L=2,H=128,A=2") -> ml_collections.ConfigDict:
  """`arg`: VARIANT,L=..,H=..,A=.., VARIANT a variant of experiments/pretrain.py."""
  variant, *opts = arg.split(",")
  size = {}
  for opt in opts:
    key, _, value = opt.partition("=")
    if key not in ("L", "H", "A") or not value.isdigit():
      raise ValueError(
          f"experiments/size.py: bad option {opt!r} in {arg!r}; expected "
          "VARIANT,L=..,H=..,A=.. e.g. tiny,L=4,H=128,A=2"
      )
    size[key] = int(value)
  if set(size) != {"L", "H", "A"} or size["H"] % size["A"]:
    raise ValueError(
        f"experiments/size.py: {arg!r}: give all of L, H and A, with H divisible " "by A"
    )
  c = pretrain.get_config(variant)
  c.variant = f"size/{c.variant},L={size['L']},H={size['H']},A={size['A']}"
  c.model.num_layers = size["L"]  # encoder layers
  c.model.hidden_size = size["H"]  # hidden width
  c.model.num_heads = size["A"]  # attention heads (head size H / A)
  c.model.intermediate_size = 4 * size["H"]  # feed-forward width, 4H as in BERT
  return c
