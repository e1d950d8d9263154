r"""SOP: sentence-order prediction instead of NSP (ALBERT, Lan et al. 2019).

Purpose: compare the paper's NSP (is B the next segment or a random one?) with SOP (are A and B
in order or swapped?), which cannot be solved from topic alone. Same model, data, steps and seed
as `experiments/pretrain.py:VARIANT`; only the pair task changes.

Command:
  bertjax pretrain --config experiments/sop.py:tiny --workdir runs/sop_tiny
  python -m experiments.ablate --sweep nsp --scale tiny --steps 300 --out runs/ablate_nsp

Hardware: as the base variant (tiny: 2 CPU cores).

Expected result: ALBERT (Table 5 there) reports SOP helps multi-sentence tasks by ~1 point over
NSP, and that a model trained with NSP scores near chance (~52%) on SOP while an SOP model does
well on NSP. At CPU scale the pair accuracy starts near 50% and rises more slowly than NSP's.
"""

from __future__ import annotations

import pathlib
import sys

import ml_collections

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # see no_nsp.py
from experiments import pretrain  # noqa: E402


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  """`arg`: any variant of experiments/pretrain.py."""
  c = pretrain.get_config(arg)
  c.variant = f"sop/{c.variant}"
  c.data.pair_mode = "sop"  # label 1: the two segments are swapped (same head as NSP)
  return c
