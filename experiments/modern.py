r"""The modern ladder: from BERT to ModernBERT one change at a time, each rung keeping the last's.

Purpose: which of ModernBERT's changes (Warner et al. 2024) buys what on this corpus at matched
compute. Rung 0 is BERT's recipe; every later rung adds one change to the one before, in the
order below, and the last is ModernBERT's block and recipe at the scale's width and depth
(`experiments/pretrain.py:modern_tiny` differs from it only in size: 3 layers, GeGLU 192).
Every rung trains on the same data, steps, batch and sequence length, and every rung is scored
the same way: held-out MLM at 15% masking on the same single-segment, unpacked examples
(config.eval.mask_prob/pair_mode/packing/seed), whatever its own masking, pair task or packing.

Command (`arg` is SCALE,rung=NAME; SCALE demo or tiny, NAME one of RUNGS):
  bertjax pretrain --config experiments/modern.py:demo,rung=geglu --workdir runs/geglu
  python -m experiments.ablate --sweep modern --scale demo --steps 600 --seeds 0,1 \
      --out runs/ablate_modern

Hardware: demo (seq 32 x batch 128, the tiny model's 2 layers x 128): 2 CPU cores, the whole
ladder (10 rungs x 2 seeds) in about an hour at 600 steps (docs/experiments.md, "The modern
ladder"). tiny (seq 128 x batch 64): about 4x the demo's time per step.

Expected result: each rung's direction as its paper reported it (the comment beside each rung
below); at a few hundred CPU steps most differences are expected within seed noise.
"""

from __future__ import annotations

import math
import pathlib
import sys

import ml_collections

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # see no_nsp.py
from experiments import pretrain  # noqa: E402

# scale -> (sequence length, global batch): one phase, so every rung sees the same shape.
SCALES = {"demo": (32, 128), "tiny": (128, 64)}
EVAL_MASK_PROB = 0.15  # BERT's rate: every rung is scored at it, whatever it trains with
# Time to target: held-out MLM accuracy at 15% masking. Rung 0 (BERT), timed alone at the
# demo budget (600 steps, seed 0), crossed 0.10 at step 240 and ended at 0.123: a point on
# the way that the later rungs should reach too. ablate --sweep modern sets it (--target).
TARGET_MLM_ACCURACY = 0.10


def _no_nsp(c, scale):  # RoBERTa (Liu et al. 2019, 4.2): MLM alone matches or beats MLM + NSP
  c.data.pair_mode = "none"


def _mask30(c, scale):  # Wettig et al. 2023 ("Should You Mask 15%"): 40% beats 15% (large
  # models); ModernBERT and MosaicBERT train at 30%
  c.data.mask_prob = 0.3
  c.data.max_predictions_per_seq = math.ceil(0.3 * c.data.seq_len)


def _pre_ln(c, scale):  # Xiong et al. 2020: pre-LN trains stably, converges faster than post-LN
  c.model.norm_placement = "pre"


def _geglu(c, scale):  # Shazeer 2020 ("GLU Variants"): GeGLU lowers perplexity at matched
  # parameters, its hidden width 2/3 of the dense one (512 -> 344, rounded up to a multiple of 8)
  c.model.mlp_type = "glu"
  c.model.intermediate_size = 344


def _rope(c, scale):  # Su et al. 2021 (RoFormer): rotary positions converge faster than a
  # learned absolute table; theta 10k, ModernBERT's while it trains at its base length
  c.model.position_embedding = "rope"
  c.model.rope_theta = 10_000.0
  c.model.local_rope_theta = 10_000.0


def _no_bias(c, scale):  # Cramming (Geiping & Goldstein 2022): dropping linear/LayerNorm biases
  # costs no quality and saves time; ModernBERT drops them. Without NSP every token has segment
  # 0, so the token-type table is one more bias: it goes too (ModernBERT has none).
  c.model.use_bias = False
  c.model.type_vocab_size = 0


def _packing(c, scale):  # Krell et al. 2021: packing whole examples into rows, no cross-example
  # attention, trains BERT ~2x faster at equal accuracy; ModernBERT unpads and packs
  c.data.packing = True


def _schedule(c, scale):  # StableAdamW (Wortsman et al. 2023): AdamW without loss spikes; the
  # trapezoid (warmup-stable-decay, 1-sqrt decay; Hägele et al. 2024) matches cosine/linear.
  # ModernBERT's betas, weight decay and no global clip; the peak lr stays the ladder's.
  c.train.optimizer = "stable_adamw"
  c.train.schedule = "wsd"
  c.train.decay_fraction = 0.1  # optim.py's default: the last 10% of the steps decay
  c.train.b2 = 0.98
  c.train.weight_decay = 1e-5
  c.train.clip_norm = 0.0


def _local_global(c, scale):  # Longformer (Beltagy et al. 2020): local windows plus global
  # layers keep full attention's quality at lower cost; ModernBERT: every 3rd layer global.
  # The window is a quarter of the sequence, as modern_tiny's; with 2 layers: 1 global, 1 local.
  c.model.local_attention = c.data.seq_len // 4
  c.model.global_every = 3


# name -> (change, the rung's edit), in ladder order; rung k applies edits 1..k.
RUNGS = {
    "bert": ("BERT", None),
    "no_nsp": ("no NSP", _no_nsp),
    "mask30": ("30% masking", _mask30),
    "pre_ln": ("pre-LN", _pre_ln),
    "geglu": ("GeGLU", _geglu),
    "rope": ("RoPE", _rope),
    "no_bias": ("no biases", _no_bias),
    "packing": ("packing", _packing),
    "schedule": ("StableAdamW + wsd", _schedule),
    "local_global": ("local/global attn", _local_global),
}


def get_config(arg: str = "demo,rung=bert") -> ml_collections.ConfigDict:
  """`arg`: SCALE,rung=NAME, SCALE in SCALES, NAME in RUNGS."""
  scale, *opts = arg.split(",")
  rung = None
  for opt in opts:
    key, _, value = opt.partition("=")
    if key != "rung" or value not in RUNGS:
      raise ValueError(
          f"experiments/modern.py: bad option {opt!r} in {arg!r}; expected SCALE,rung=NAME "
          f"with NAME one of {', '.join(RUNGS)}"
      )
    rung = value
  if scale not in SCALES or rung is None:
    raise ValueError(
        f"experiments/modern.py: {arg!r}: expected SCALE,rung=NAME with SCALE one of "
        f"{', '.join(SCALES)}, e.g. demo,rung=geglu"
    )
  c = _bert(scale)
  for name, (_, edit) in RUNGS.items():
    if edit is not None:
      edit(c, scale)
    if name == rung:
      break
  c.variant = f"modern/{scale},rung={rung}"
  return c


def _bert(scale: str) -> ml_collections.ConfigDict:
  """Rung 0: BERT's network and recipe (post-LN, dense GELU MLP, learned positions, biases,
  MLM + NSP at 15%, AdamW with warmup and linear decay) in one phase at the scale's shape."""
  seq_len, batch = SCALES[scale]
  c = pretrain.get_config("demo" if scale == "demo" else "tiny")
  c.phase2.fraction = 0.0  # one phase: every rung trains on the same shape throughout
  c.data.seq_len = seq_len
  c.data.mask_prob = 0.15  # BERT's rate (the demo trains at 30%: that is rung `mask30`)
  c.data.max_predictions_per_seq = math.ceil(0.15 * seq_len)
  c.train.batch_size = batch
  c.train.optimizer = "adamw"
  c.train.schedule = "warmup_linear"
  # No dropout in any rung: the demo's choice for a tiny model over few epochs, and
  # ModernBERT's (it is the same in every rung, so it is not one of the changes).
  c.model.hidden_dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  # Scored identically: 15% masking on single unpacked segments, the same examples per seed.
  c.eval.mask_prob = EVAL_MASK_PROB
  c.eval.pair_mode = "none"
  c.eval.packing = False
  c.eval.seed = 0
  c.eval.batch_size = 128
  c.eval.steps = 8  # 1,024 held-out examples per evaluation
  return c
