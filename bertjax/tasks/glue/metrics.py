"""GLUE metrics in numpy: accuracy, binary F1, Matthews correlation, Pearson, Spearman.

Definitions follow the GLUE leaderboard (scikit-learn / scipy conventions): F1 of the positive
class (id 1), MCC 0 when a confusion-matrix margin is empty, Spearman as Pearson of average
ranks (ties share their mean rank). No scipy at run time; the tests check against it.
"""

from __future__ import annotations

import numpy as np

from bertjax.tasks.glue import tasks


def accuracy(pred: np.ndarray, gold: np.ndarray) -> float:
  pred, gold = np.asarray(pred), np.asarray(gold)
  return float(np.mean(pred == gold)) if gold.size else 0.0


def f1(pred: np.ndarray, gold: np.ndarray, positive: int = 1) -> float:
  """F1 of the positive class; 0 when there are no true positives."""
  p, g = np.asarray(pred) == positive, np.asarray(gold) == positive
  tp = float(np.sum(p & g))
  if tp == 0:
    return 0.0
  precision, recall = tp / np.sum(p), tp / np.sum(g)
  return float(2 * precision * recall / (precision + recall))


def mcc(pred: np.ndarray, gold: np.ndarray) -> float:
  """Matthews correlation (multi-class form of Gorodkin 2004; binary MCC for two classes)."""
  pred, gold = np.asarray(pred).astype(np.int64), np.asarray(gold).astype(np.int64)
  k = int(max(pred.max(initial=0), gold.max(initial=0))) + 1
  c = np.zeros((k, k), np.float64)  # c[true, predicted]
  np.add.at(c, (gold, pred), 1.0)
  t, p, n = c.sum(axis=1), c.sum(axis=0), c.sum()
  cov = np.trace(c) * n - t @ p
  denom = np.sqrt(n * n - p @ p) * np.sqrt(n * n - t @ t)
  return float(cov / denom) if denom > 0 else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  xc, yc = x - x.mean(), y - y.mean()
  denom = np.sqrt(np.sum(xc * xc) * np.sum(yc * yc))
  return float(np.sum(xc * yc) / denom) if denom > 0 else 0.0


def rankdata(x: np.ndarray) -> np.ndarray:
  """1-based ranks, ties given the mean of the ranks they span (scipy's 'average')."""
  x = np.asarray(x)
  order = np.argsort(x, kind="mergesort")
  sorted_x = x[order]
  starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
  group = np.cumsum(starts) - 1  # tie group of each sorted position
  first = np.flatnonzero(starts)
  last = np.r_[first[1:], len(x)] - 1
  mean_rank = (first + last) / 2.0 + 1.0
  ranks = np.empty(len(x), np.float64)
  ranks[order] = mean_rank[group]
  return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  return pearson(rankdata(x), rankdata(y))


def compute(
    task: tasks.Task, split: tasks.Split, pred: np.ndarray, gold: np.ndarray
) -> dict[str, float]:
  """The task's metrics on one dev split, named as in results.json (MNLI: matched_accuracy)."""
  out = {}
  for name in task.metrics:
    if not name.startswith(split.metric_prefix):
      continue
    base = name[len(split.metric_prefix) :]
    if base == "accuracy":
      out[name] = accuracy(pred, gold)
    elif base == "f1":
      out[name] = f1(pred, gold)
    elif base == "mcc":
      out[name] = mcc(pred, gold)
    elif base == "pearson":
      out[name] = pearson(pred, gold)
    elif base == "spearman":
      out[name] = spearman(pred, gold)
    else:
      raise ValueError(
          f"task {task.name}: unknown metric {name!r}; valid: accuracy, f1, mcc, "
          "pearson, spearman (MNLI adds matched_/mismatched_)"
      )
  return out


def majority_baseline(train_labels: np.ndarray, gold: np.ndarray) -> float:
  """Dev accuracy of always predicting the most frequent training class."""
  values, counts = np.unique(train_labels, return_counts=True)
  return accuracy(np.full_like(gold, values[np.argmax(counts)]), gold)
