"""`bertjax demo`: the README's main job. Until pretraining lands it runs the model forward."""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="bertjax demo", description=__doc__)
  p.add_argument("--workdir", default="runs/demo", help="output directory")
  p.add_argument("--preset", default="tiny", help="model preset")
  args = p.parse_args(argv)
  import jax
  import numpy as np

  from bertjax import model as model_lib

  cfg = model_lib.from_preset(args.preset, vocab_size=8000)
  d = model_lib.dummy_inputs(2, 16, 3)
  m = model_lib.BertForPreTraining(cfg)
  v = m.init(jax.random.key(0), d["input_ids"], d["token_type_ids"], d["attention_mask"],
             d["masked_positions"])
  out = m.apply(v, d["input_ids"], d["token_type_ids"], d["attention_mask"],
                d["masked_positions"])
  print(f"{args.preset}: {model_lib.count_params(v['params']):,} parameters")
  print("mlm_logits", out.mlm_logits.shape, "nsp_logits", np.asarray(out.nsp_logits))
  return 0
