r"""Depth ablation: L in {1, 2, 4, 6, 12} layers at the fixed width of a base variant.

Purpose: how MLM perplexity and downstream accuracy grow with depth alone (the depth axis of
the BERT paper's Table 6), everything else (width, heads, data, steps, seed) held fixed.

Command (`arg` is VARIANT,layers=L):
  bertjax pretrain --config experiments/layers.py:tiny,layers=4 --workdir runs/layers4
  python -m experiments.ablate --sweep layers --scale tiny --steps 300 --out runs/ablate_layers

Hardware: tiny (H=128): 2 CPU cores, cost linear in L; base width (H=768): a TPU slice.

Expected result: perplexity falls monotonically with depth, fastest from 1 to 4 layers; in the
paper (Table 6, H=768) 3 -> 6 -> 12 layers gives LM perplexity 5.84 -> 4.68 -> 3.99 and MNLI-m
77.9 -> 81.9 -> 84.4. Short CPU runs flatten the curve: deep models need more steps.
"""

from __future__ import annotations

import pathlib
import sys

import ml_collections

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # see no_nsp.py
from experiments import pretrain  # noqa: E402

LAYERS = (1, 2, 4, 6, 12)  # the sweep's depths (experiments/ablate.py --sweep layers)


def get_config(arg: str = "tiny,layers=2") -> ml_collections.ConfigDict:
  """`arg`: VARIANT[,layers=L], VARIANT a variant of experiments/pretrain.py."""
  variant, *opts = arg.split(",")
  layers = None
  for opt in opts:
    key, _, value = opt.partition("=")
    if key != "layers" or not value.isdigit() or int(value) < 1:
      raise ValueError(
          f"experiments/layers.py: bad option {opt!r} in {arg!r}; expected "
          "VARIANT,layers=L with L >= 1, e.g. tiny,layers=4"
      )
    layers = int(value)
  c = pretrain.get_config(variant)
  c.variant = f"layers/{c.variant},layers={layers}"
  # None keeps the preset's depth (bertjax.training.train.model_config skips None overrides).
  c.model.num_layers = ml_collections.FieldReference(layers, field_type=int)  # encoder layers
  return c
