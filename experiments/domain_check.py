r"""How well a pretrained checkpoint fills masks on the task's text against its own corpus.

Purpose: one measurement behind "why does the checkpoint not transfer?": if the encoder
predicts masked tokens of the task's sentences much worse than those of its pretraining
corpus, or the tokenizer cuts the task's words into many more pieces, the two domains differ.
For each text, 15% of every sentence's tokens (at least one, at most 10) are replaced by
[MASK] with a fixed seed; the report is the accuracy at those positions beside the best
constant guess (the most frequent masked token) and the pieces per whitespace word.

Command (after `make demo`):
  python -m experiments.domain_check --init runs/demo

Hardware: seconds on one CPU core for the default 600 sentences per text. Expected result
with the demo checkpoint: about 0.27 at [MASK] on Austen (5.5x the constant guess) and 0.13
on the movie reviews (3.4x); 1.24 against 1.85 pieces per word.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import random

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import locations
from bertjax import model as model_lib
from bertjax.data import wordpiece
from bertjax.training import pretrained

_DATA = locations.DATA_DIR
SEQ_LEN, MAX_MASKED = 64, 10


def sentences_of_tsv(path: pathlib.Path, column: str) -> list[str]:
  with open(path, encoding="utf-8-sig", newline="") as f:
    return [row[column] for row in csv.DictReader(f, delimiter="\t") if row.get(column)]


def sentences_of_corpus(path: pathlib.Path, n: int, seed: int) -> list[str]:
  """`n` lines of six or more words from a one-sentence-per-line corpus."""
  lines = [l.strip() for l in open(path, encoding="utf-8") if len(l.split()) >= 6]
  return random.Random(seed).sample(lines, min(n, len(lines)))


def mask_accuracy(pre, tok, sentences: list[str], seed: int = 1) -> dict:
  """Accuracy at [MASK] of `pre` (pretrained.load_pretrained) on `sentences`."""
  rng = random.Random(seed)
  ids_rows, pos_rows, lab_rows = [], [], []
  for s in sentences:
    ids = [tok.cls_id] + tok.encode(s)[: SEQ_LEN - 2] + [tok.sep_id]
    inner = list(range(1, len(ids) - 1))
    if not inner:
      continue
    k = min(len(inner), max(1, min(MAX_MASKED, round(0.15 * len(ids)))))
    pos = sorted(rng.sample(inner, k))
    lab = [ids[p] for p in pos]
    for p in pos:
      ids[p] = tok.mask_id
    ids_rows.append(ids + [tok.pad_id] * (SEQ_LEN - len(ids)))
    pos_rows.append(pos + [0] * (MAX_MASKED - k))
    lab_rows.append(lab + [-1] * (MAX_MASKED - k))
  ids, pos, lab = (np.array(x, np.int32) for x in (ids_rows, pos_rows, lab_rows))
  net = model_lib.BertForPreTraining(pre.config)

  @jax.jit
  def predict(params, ids_BxL, pos_BxP):
    mask_BxL = (ids_BxL != tok.pad_id).astype(jnp.int32)
    out = net.apply({"params": params}, ids_BxL, jnp.zeros_like(ids_BxL), mask_BxL, pos_BxP)
    return out.mlm_logits.argmax(-1)

  pred = np.concatenate(
      [np.asarray(predict(pre.params, ids[i : i + 100], pos[i : i + 100])) for i in
       range(0, len(ids), 100)]
  )  # fmt: skip
  real = lab >= 0
  _, counts = np.unique(lab[real], return_counts=True)
  acc, const = float((pred[real] == lab[real]).mean()), float(counts.max() / real.sum())
  words = sum(len(s.split()) for s in sentences)
  pieces = sum(len(tok.encode(s)) for s in sentences)
  return dict(sentences=len(ids), positions=int(real.sum()), mask_accuracy=acc,
              constant_guess=const, pieces_per_word=pieces / max(words, 1))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
  p.add_argument("--init", required=True, help="the pretrained checkpoint (a pretrain workdir)")
  p.add_argument("--corpus", type=pathlib.Path, default=_DATA / "austen.txt")
  p.add_argument("--task", type=pathlib.Path, default=_DATA / "movie_snippets" / "dev.tsv")
  p.add_argument("--text-column", default="sentence")
  p.add_argument("--sentences", type=int, default=600, help="corpus lines to sample")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  pre = pretrained.load_pretrained(args.init)
  if not pre.tokenizer_path:
    raise SystemExit(f"domain_check: {args.init}: no tokenizer recorded with the checkpoint")
  tok = wordpiece.load_tokenizer(pre.tokenizer_path)
  texts = {
      f"corpus {args.corpus.name}": sentences_of_corpus(args.corpus, args.sentences, args.seed),
      f"task {args.task}": sentences_of_tsv(args.task, args.text_column)[: args.sentences],
  }
  results = {}
  for name, sents in texts.items():
    r = results[name] = mask_accuracy(pre, tok, sents)
    print(f"{name}: {r['sentences']} sentences, {r['pieces_per_word']:.2f} pieces per word, "
          f"accuracy at [MASK] {r['mask_accuracy']:.3f} vs {r['constant_guess']:.3f} for the "
          f"best constant guess ({r['mask_accuracy'] / r['constant_guess']:.1f}x), "
          f"{r['positions']} positions")  # fmt: skip
  print(json.dumps(results))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
