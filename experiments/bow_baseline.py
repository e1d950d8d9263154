r"""Bag-of-words baseline for a single-sentence TSV classification task (numpy only).

Purpose: the floor a pretrained encoder has to beat on a custom task such as the bundled
`data/movie_snippets` (see data/README.md). Two linear models on unigram+bigram counts:
  * multinomial naive Bayes, add-alpha smoothing;
  * multinomial (softmax) logistic regression, L2 penalty, full-batch Adam.
Each model's smoothing / penalty is picked on a held-out slice of train (`--holdout`, seeded),
then the model is refit on all of train and scored on dev. The majority class of train,
predicted for every dev row, is printed as the floor below both.

Command:
  python -m experiments.bow_baseline --train data/movie_snippets/train.tsv \
      --dev data/movie_snippets/dev.tsv --json runs/bow_movie_snippets.json

Files are read with the GLUE reader (`bertjax.tasks.glue.tsv`, header row, columns by name), so
rows it would skip are skipped here too. Hardware: one CPU core, a few seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys
import time
from typing import Sequence

import numpy as np

from bertjax.tasks.glue import tsv

NB_ALPHAS = (0.03, 0.1, 0.3, 1.0, 3.0)
LR_L2 = (1e-6, 1e-5, 1e-4, 1e-3)
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text: str) -> list[str]:
  """Lowercased words (with an apostrophe suffix: "don't", "film's") and punctuation marks."""
  return _TOKEN.findall(text.lower())


def ngrams(text: str) -> list[str]:
  """Unigrams and bigrams (bigrams joined by a space, with <s> / </s> at the edges)."""
  toks = tokenize(text)
  padded = ["<s>"] + toks + ["</s>"]
  return toks + [f"{a} {b}" for a, b in zip(padded, padded[1:])]


@dataclasses.dataclass
class Counts:
  """A sparse [N, V] count matrix in COO form (rows sorted), plus N."""

  rows: np.ndarray  # [nnz] int64
  cols: np.ndarray  # [nnz] int64
  vals: np.ndarray  # [nnz] float64
  n: int

  def matmul(self, w: np.ndarray) -> np.ndarray:
    """X @ w for w [V, K] -> [N, K]."""
    return np.stack(
        [np.bincount(self.rows, self.vals * w[self.cols, k], self.n) for k in range(w.shape[1])],
        axis=1,
    )

  def rmatmul(self, g: np.ndarray, v: int) -> np.ndarray:
    """X.T @ g for g [N, K] -> [V, K]."""
    return np.stack(
        [np.bincount(self.cols, self.vals * g[self.rows, k], v) for k in range(g.shape[1])], axis=1
    )


class Vocab:
  """n-gram -> column, built from training texts; unseen n-grams are ignored."""

  def __init__(self, texts: Sequence[str], min_count: int = 1):
    freq: dict[str, int] = {}
    for t in texts:
      for g in ngrams(t):
        freq[g] = freq.get(g, 0) + 1
    self.index = {g: i for i, g in enumerate(sorted(g for g, c in freq.items() if c >= min_count))}

  def __len__(self) -> int:
    return len(self.index)

  def counts(self, texts: Sequence[str]) -> Counts:
    rows, cols, vals = [], [], []
    for r, t in enumerate(texts):
      ids, c = np.unique([self.index[g] for g in ngrams(t) if g in self.index], return_counts=True)
      rows.append(np.full(len(ids), r, np.int64))
      cols.append(ids.astype(np.int64))
      vals.append(c.astype(np.float64))
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)
    return Counts(cat(rows, np.int64), cat(cols, np.int64), cat(vals, np.float64), len(texts))


def _softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(axis=1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=1, keepdims=True)


class NaiveBayes:
  """Multinomial naive Bayes with add-alpha smoothing."""

  def __init__(self, alpha: float):
    self.alpha = alpha

  def fit(self, x: Counts, y: np.ndarray, k: int, v: int) -> "NaiveBayes":
    onehot = np.eye(k)[y]
    feat = x.rmatmul(onehot, v) + self.alpha  # [V, K]
    self.log_prob = np.log(feat) - np.log(feat.sum(axis=0, keepdims=True))
    prior = np.bincount(y, minlength=k) + 1.0
    self.log_prior = np.log(prior / prior.sum())
    return self

  def predict(self, x: Counts) -> np.ndarray:
    return np.argmax(x.matmul(self.log_prob) + self.log_prior, axis=1)


class LogisticRegression:
  """Softmax regression on log(1 + counts), mean cross-entropy + l2/2 |W|^2, full-batch Adam."""

  def __init__(self, l2: float, steps: int = 300, lr: float = 0.05):
    self.l2, self.steps, self.lr = l2, steps, lr

  @staticmethod
  def _features(x: Counts) -> Counts:
    return Counts(x.rows, x.cols, np.log1p(x.vals), x.n)

  def fit(self, x: Counts, y: np.ndarray, k: int, v: int) -> "LogisticRegression":
    x = self._features(x)
    onehot = np.eye(k)[y]
    w, b = np.zeros((v, k)), np.zeros(k)
    m, s = np.zeros((v + 1, k)), np.zeros((v + 1, k))
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(1, self.steps + 1):
      g_logits = (_softmax(x.matmul(w) + b) - onehot) / x.n
      grad = np.vstack([x.rmatmul(g_logits, v) + self.l2 * w, g_logits.sum(axis=0)])
      m = b1 * m + (1 - b1) * grad
      s = b2 * s + (1 - b2) * grad * grad
      step = self.lr * (m / (1 - b1**t)) / (np.sqrt(s / (1 - b2**t)) + eps)
      w, b = w - step[:-1], b - step[-1]
    self.w, self.b = w, b
    return self

  def predict(self, x: Counts) -> np.ndarray:
    return np.argmax(self._features(x).matmul(self.w) + self.b, axis=1)


MODELS = {
    "naive_bayes": (NaiveBayes, "alpha", NB_ALPHAS),
    "logistic_regression": (LogisticRegression, "l2", LR_L2),
}


def run(
    train_texts: Sequence[str],
    train_y: np.ndarray,
    dev_texts: Sequence[str],
    dev_y: np.ndarray,
    num_labels: int,
    holdout: float = 0.1,
    seed: int = 0,
) -> dict:
  """Pick each model's hyperparameter on a held-out slice of train, refit on train, score dev."""
  train_y, dev_y = np.asarray(train_y, np.int64), np.asarray(dev_y, np.int64)
  n = len(train_texts)
  perm = np.random.default_rng(seed).permutation(n)
  n_held = max(1, int(round(holdout * n)))
  held, fit_idx = perm[:n_held], perm[n_held:]
  # The selection uses a vocabulary of the fitting part only, so held-out n-grams stay unseen.
  sel_vocab = Vocab([train_texts[i] for i in fit_idx])
  x_fit = sel_vocab.counts([train_texts[i] for i in fit_idx])
  x_held = sel_vocab.counts([train_texts[i] for i in held])
  vocab = Vocab(train_texts)
  x_train, x_dev = vocab.counts(train_texts), vocab.counts(dev_texts)

  majority = int(np.argmax(np.bincount(train_y, minlength=num_labels)))
  out = {
      "train_examples": n,
      "dev_examples": len(dev_texts),
      "vocab_size": len(vocab),
      "holdout_examples": int(n_held),
      "seed": seed,
      "majority_class": majority,
      "majority_dev_accuracy": float(np.mean(dev_y == majority)),
      "models": {},
  }
  for name, (cls, param, grid) in MODELS.items():
    t0 = time.time()
    held_acc = {}
    for value in grid:
      model = cls(value).fit(x_fit, train_y[fit_idx], num_labels, len(sel_vocab))
      held_acc[value] = float(np.mean(model.predict(x_held) == train_y[held]))
    best = max(grid, key=lambda v: (held_acc[v], -grid.index(v)))  # ties: the first in grid
    model = cls(best).fit(x_train, train_y, num_labels, len(vocab))
    out["models"][name] = {
        param: best,
        "holdout_accuracy": {str(k): v for k, v in held_acc.items()},
        "dev_accuracy": float(np.mean(model.predict(x_dev) == dev_y)),
        "seconds": round(time.time() - t0, 2),
    }
  out["mean_dev_accuracy"] = float(np.mean([m["dev_accuracy"] for m in out["models"].values()]))
  return out


def load(path: str, text_column: str, label_column: str) -> tuple[list[str], list[str], list[str]]:
  """Texts, raw labels and skipped-row reasons of one TSV, as `bertjax glue` reads it."""
  rows, skipped = tsv.read_rows(path, tsv.Columns((text_column,), label_column))
  return [r[1][0] for r in rows], [r[2] for r in rows], skipped


def main(argv: Sequence[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--train", required=True, help="training TSV with a header row")
  p.add_argument("--dev", required=True, help="dev TSV (same columns)")
  p.add_argument("--text-column", default="sentence")
  p.add_argument("--label-column", default="label")
  p.add_argument(
      "--holdout", type=float, default=0.1, help="fraction of train held out to pick alpha / l2"
  )
  p.add_argument("--seed", type=int, default=0, help="seed of the held-out slice")
  p.add_argument("--json", help="also write the results here")
  args = p.parse_args(argv)

  train_x, train_raw, skipped = load(args.train, args.text_column, args.label_column)
  dev_x, dev_raw, dev_skipped = load(args.dev, args.text_column, args.label_column)
  labels = sorted(set(train_raw))  # the class order of `bertjax glue --task custom`
  lookup = {l: i for i, l in enumerate(labels)}
  unknown = sum(l not in lookup for l in dev_raw)
  keep = [i for i, l in enumerate(dev_raw) if l in lookup]
  dev_x, dev_y = [dev_x[i] for i in keep], [lookup[dev_raw[i]] for i in keep]
  for what, n in (
      ("train", len(skipped)),
      ("dev", len(dev_skipped)),
      ("dev (unknown label)", unknown),
  ):
    if n:
      print(f"bow_baseline: skipped {n} {what} rows", file=sys.stderr)

  res = run(
      train_x,
      [lookup[l] for l in train_raw],
      dev_x,
      dev_y,
      len(labels),
      holdout=args.holdout,
      seed=args.seed,
  )
  res.update(train=args.train, dev=args.dev, labels=labels)
  print(
      f"train {res['train_examples']} rows, dev {res['dev_examples']} rows, "
      f"{len(labels)} labels, {res['vocab_size']} unigram+bigram features"
  )
  for name, m in res["models"].items():
    setting = f"alpha={m['alpha']:g}" if "alpha" in m else f"l2={m['l2']:g}"
    print(f"{name:20s} {setting:12s} dev accuracy {100 * m['dev_accuracy']:.2f}")
  print(f"{'mean of the two':20s} {'':12s} dev accuracy {100 * res['mean_dev_accuracy']:.2f}")
  majority = "label " + labels[res["majority_class"]]
  print(
      f"{'majority class':20s} {majority:12s} dev accuracy "
      f"{100 * res['majority_dev_accuracy']:.2f}"
  )
  if args.json:
    pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
  return res


if __name__ == "__main__":
  main()
