"""experiments/domain_check.py on a randomly initialised tiny checkpoint."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.training import pretrained
from conftest import REPO
from experiments import domain_check


@pytest.mark.slow
def test_counts_the_masked_positions_and_reports_both_texts(tmp_path, capsys):
  cfg = model_lib.from_preset("tiny", vocab_size=8000, max_position_embeddings=64)
  net = model_lib.BertForPreTraining(cfg)
  d = model_lib.dummy_inputs(1, 8)
  params = net.init(jax.random.key(0), d["input_ids"], masked_positions_BxP=d["masked_positions"])
  ckpt = tmp_path / "ckpt"
  params = nn.unbox(params)["params"]
  pretrained.save_pretrained(str(ckpt), cfg, params, str(REPO / "data/tokenizer.model"))
  task = REPO / "data" / "movie_snippets" / "dev.tsv"
  assert domain_check.main(["--init", str(ckpt), "--sentences", "20", "--task", str(task)]) == 0
  results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert len(results) == 2
  pre = pretrained.load_pretrained(str(ckpt))
  tok = domain_check.wordpiece.load_tokenizer(pre.tokenizer_path)
  sents = domain_check.sentences_of_tsv(task, "sentence")[:20]
  # 15% of each sentence's tokens with [CLS]/[SEP], at least 1 and at most 10
  n = [len(tok.encode(s)[:62]) + 2 for s in sents]
  want = sum(min(m - 2, max(1, min(10, round(0.15 * m)))) for m in n)
  r = results[f"task {task}"]
  assert r["positions"] == want and r["sentences"] == 20
  assert 0.0 <= r["mask_accuracy"] <= 1.0 and 0.0 < r["constant_guess"] <= 1.0
  assert r["pieces_per_word"] > 1.0
  assert np.isfinite(results["corpus austen.txt"]["mask_accuracy"])
