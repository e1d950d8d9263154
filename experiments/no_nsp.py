r"""No NSP: pretraining with the masked-LM loss only (the BERT paper's Table 5, "No NSP" row).

Purpose: measure what next-sentence prediction adds. Same model, data, steps and seed as
`experiments/pretrain.py:VARIANT`; each example is one stretch of text (no sentence pair, no
[SEP] in the middle) and the NSP head gets no loss.

Command:
  bertjax pretrain --config experiments/no_nsp.py:tiny --workdir runs/no_nsp_tiny
  python -m experiments.ablate --sweep nsp --scale tiny --steps 300 --out runs/ablate_nsp

Hardware: as the base variant (tiny: 2 CPU cores; base: 16 TPU chips for ~4 days).

Expected result: paper, BERT-base dev accuracy with NSP vs without: MNLI-m 84.4 vs 83.9,
QNLI 88.4 vs 84.9, MRPC 86.7 vs 86.5, SST-2 92.7 vs 92.6; the drop is largest on the
sentence-pair tasks (QNLI, MNLI). At CPU scale see docs/experiments.md for measured figures.
"""

from __future__ import annotations

import pathlib
import sys

import ml_collections

# `bertjax pretrain --config experiments/no_nsp.py` loads this file by path; the repo root
# must be importable for the base config (the console script does not put it on sys.path).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from experiments import pretrain  # noqa: E402


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  """`arg`: any variant of experiments/pretrain.py (tiny, mini, small, medium, base, large)."""
  c = pretrain.get_config(arg)
  c.variant = f"no_nsp/{c.variant}"
  c.data.pair_mode = "none"  # MLM only: single segments, no NSP labels or loss
  return c
