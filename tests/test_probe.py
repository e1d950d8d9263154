"""experiments/probe.py: linear probes on frozen features, on a task whose label is one word."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.training import pretrained
from conftest import REPO
from experiments import probe


def test_mean_cosine_is_one_for_one_vector_and_near_zero_for_noise():
  assert probe.mean_cosine(np.ones((10, 4))) == pytest.approx(1.0)
  noise = np.random.default_rng(0).normal(size=(500, 256))
  assert abs(probe.mean_cosine(noise)) < 0.05


@pytest.mark.slow
def test_a_word_that_decides_the_label_is_found_in_the_mean_of_the_embeddings(tmp_path):
  cfg = model_lib.from_preset("tiny", vocab_size=8000, max_position_embeddings=64)
  net = model_lib.BertForPreTraining(cfg)
  d = model_lib.dummy_inputs(1, 8)
  params = net.init(jax.random.key(0), d["input_ids"], masked_positions_BxP=d["masked_positions"])
  ckpt = tmp_path / "ckpt"
  pretrained.save_pretrained(
      str(ckpt), cfg, nn.unbox(params)["params"], str(REPO / "data/tokenizer.model")
  )
  words = "the house was quiet and she read a letter by the window".split()
  rng = np.random.default_rng(0)
  task = tmp_path / "task"
  task.mkdir()
  for split, n in (("train", 300), ("dev", 100)):
    rows = ["sentence\tlabel"]
    for _ in range(n):
      label = int(rng.integers(2))
      sent = list(rng.choice(words, int(rng.integers(4, 9))))
      if label:
        sent.insert(int(rng.integers(len(sent) + 1)), "carriage")
      rows.append(f"{' '.join(sent)}\t{label}")
    (task / f"{split}.tsv").write_text("\n".join(rows) + "\n")
  out = tmp_path / "out"
  argv = ["--init", str(ckpt), "--task", str(task), "--random-seeds", "2", "--out", str(out)]
  assert probe.main(argv + ["--max-seq-len", "16"]) == 0
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert set(rows) == {"pooled"} | {
      f"{pool}@{layer}" for pool in ("cls", "mean") for layer in ("embeddings", "layer0", "layer1")
  }
  assert set(rows["pooled"]) == {"pretrained", "random0", "random1"}
  # One word decides the label: its embedding shifts the mean of the embeddings.
  assert all(r["dev_accuracy"] > 0.9 for r in rows["mean@embeddings"].values())
  # [CLS] before the first layer is the same vector for every sentence: chance, cosine 1.
  for r in rows["cls@embeddings"].values():
    assert r["dev_accuracy"] < 0.7 and r["mean_cosine"] == pytest.approx(1.0)
  assert "| mean@embeddings |" in (out / "results.md").read_text()
