r"""MLM or ELECTRA: the same network pretrained by masked LM or by replaced-token detection.

Purpose: does ELECTRA's objective (Clark et al. 2020) transfer where MLM did not at this
machine's budget (docs/experiments.md, "Does pretraining transfer?")? Each arm is a block of the
modern ladder (experiments/modern.py) with one objective:

  block  bert    the ladder's rung 0: BERT's post-LN block and recipe (AdamW, warmup + linear
                 decay; MLM + NSP at 15% for the MLM arm)
         modern  the ladder's best rung, `local_global`: every ModernBERT change (pre-LN, GeGLU,
                 RoPE, no biases, packing, StableAdamW + wsd, local/global attention; MLM alone
                 at 30% for the MLM arm)
  objective mlm     the block's own masked LM
            electra replaced-token detection: a generator a quarter of the encoder's width (the
                    paper's 1/4 for Small; same depth and block), its embeddings shared, λ = 50,
                    15% of the tokens masked (85% [MASK], 15% kept, as google-research/electra),
                    no pair task. The encoder (the discriminator) is the MLM arm's network
                    exactly (embeddings not factorised), so both arms fine-tune the same
                    architecture and share one random-init row.

Everything else (data, optimizer, schedule, peak learning rate, sequence length, batch, the
held-out scoring) is the block's. `ablate --sweep objective` gives each arm the same model
FLOPs (bertjax.training.flops, the generator and its sampling included), so an ELECTRA arm runs
fewer steps than its MLM arm.

Command (`arg` is SCALE,block=bert|modern,objective=mlm|electra; SCALE demo or tiny):
  bertjax pretrain --config experiments/objective.py:demo,block=modern,objective=electra \
      --workdir runs/electra_modern
  python -m experiments.ablate --sweep objective --steps 1000 --seeds 0,1 --out runs/ablate_objective

Hardware: demo (seq 32 x batch 128, 2 layers x 128): 2 CPU cores, minutes per arm.

Expected result: the paper's Table 1 has ELECTRA-Small above BERT-Small by 4.8 GLUE points at
the same compute; at a few thousand CPU steps the generator may not leave the unigram plateau
(docs/training.md, "ELECTRA"), and then the discriminator learns little beyond it.
"""

from __future__ import annotations

import math
import pathlib
import sys

import ml_collections

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # see no_nsp.py
from experiments import modern  # noqa: E402

BLOCKS = {"bert": "bert", "modern": "local_global"}  # block -> the ladder's rung
OBJECTIVES = ("mlm", "electra")
GENERATOR_FRACTION = 0.25  # Table 6 (Small): the generator a quarter of the encoder's width
MASK_PROB = 0.15  # Table 6: mask percent 15 (Small and Base)


def get_config(arg: str = "demo,block=bert,objective=electra") -> ml_collections.ConfigDict:
  """`arg`: SCALE,block=NAME,objective=NAME (SCALE in modern.SCALES, NAME in BLOCKS /
  OBJECTIVES)."""
  scale, *opts = arg.split(",")
  got = {}
  for opt in opts:
    key, _, value = opt.partition("=")
    valid = {"block": BLOCKS, "objective": OBJECTIVES}.get(key)
    if valid is None or value not in valid:
      raise ValueError(
          f"experiments/objective.py: bad option {opt!r} in {arg!r}; expected "
          f"SCALE,block={'|'.join(BLOCKS)},objective={'|'.join(OBJECTIVES)}"
      )
    got[key] = value
  if scale not in modern.SCALES or len(got) != 2:
    raise ValueError(
        f"experiments/objective.py: {arg!r}: expected SCALE,block=NAME,objective=NAME with "
        f"SCALE one of {', '.join(modern.SCALES)}, e.g. demo,block=bert,objective=electra"
    )
  c = modern.get_config(f"{scale},rung={BLOCKS[got['block']]}")
  if got["objective"] == "electra":
    c.objective = "electra"
    c.data.pair_mode = "none"  # ELECTRA has no pair task
    c.data.mask_prob = MASK_PROB
    c.data.max_predictions_per_seq = math.ceil(MASK_PROB * c.data.seq_len)
    c.data.mask_token_prob = 0.85  # pretrain_helpers.mask: [MASK] at 85%, the original at 15%
    c.data.random_token_prob = 0.0
    c.electra.generator_hidden_fraction = GENERATOR_FRACTION
    c.electra.disc_weight = 50.0  # λ, paper section 3.1
  c.variant = f"objective/{scale},block={got['block']},objective={got['objective']}"
  return c
