"""Answers from start/end logits: google-research/bert's n-best span search (write_predictions).

For each question, over all its windows: the `n_best` highest start and end logits are paired;
a pair is a candidate when both tokens lie in the context, the start token is scored in its
best-centred window, end >= start and the span has at most `max_answer_length` tokens. The
candidates are ranked by start + end logit, turned into text by get_final_text (the context
characters the predicted pieces cover, `features.answer_text`) and deduplicated by that text.
For v2.0, the null score is start + end logit at [CLS] (the lowest over the question's
windows); the answer is "" when null score - best span score > `null_threshold` (the official
eval's best_f1_thresh is a good value to rerun with).

Shape letters: N features, L sequence length.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bertjax.tasks.squad.data import Example
from bertjax.tasks.squad.features import answer_text, Features


@dataclasses.dataclass
class Decoded:
  predictions: dict[str, str]  # qid -> answer ("" = no answer, v2.0)
  best_span: dict[str, str]  # qid -> best non-null answer, for the threshold search
  null_odds: dict[str, float]  # qid -> null score - best span score (v2.0; 0.0 for v1.1)
  nbest: dict[str, list[dict]]  # qid -> [{text, probability, start_logit, end_logit}]


def _top(x: np.ndarray, n: int) -> np.ndarray:
  return np.argsort(-x, kind="stable")[:n]


def _candidates(
    feats: Features,
    f: int,
    start_L: np.ndarray,
    end_L: np.ndarray,
    n_best: int,
    max_answer_length: int,
) -> list[tuple[float, float, float, int, int, int]]:
  """(score, start logit, end logit, window, start token, end token) of window f's valid
  spans."""
  unit_L, maxc_L = feats.token_unit_NxL[f], feats.max_context_NxL[f]
  out = []
  for s in _top(start_L, n_best):
    if unit_L[s] < 0 or not maxc_L[s]:
      continue
    for e in _top(end_L, n_best):
      if unit_L[e] < 0 or e < s or e - s + 1 > max_answer_length:
        continue
      out.append(
          (float(start_L[s] + end_L[e]), float(start_L[s]), float(end_L[e]), f, int(s), int(e))
      )
  return out


def decode(
    examples: list[Example],
    feats: Features,
    start_NxL: np.ndarray,
    end_NxL: np.ndarray,
    version: str,
    tok: Any,
    n_best: int = 20,
    max_answer_length: int = 30,
    null_threshold: float = 0.0,
) -> Decoded:
  """The answers of `examples` from the logits of their windows; `tok` built `feats`."""
  by_example: dict[int, list[int]] = {}
  for f, i in enumerate(feats.example_index_N):
    by_example.setdefault(int(i), []).append(f)
  out = Decoded({}, {}, {}, {})
  for i, ex in enumerate(examples):
    cands, null = [], None
    for f in by_example.get(i, []):
      null_f = float(start_NxL[f, 0] + end_NxL[f, 0])
      if null is None or null_f < null[0]:
        null = (null_f, float(start_NxL[f, 0]), float(end_NxL[f, 0]))
      cands += _candidates(feats, f, start_NxL[f], end_NxL[f], n_best, max_answer_length)
    cands.sort(key=lambda c: -c[0])
    nbest, seen = [], set()
    for score, sl, el, f, s, e in cands:
      unit_L = feats.token_unit_NxL[f]
      text = answer_text(
          tok,
          ex.context,
          feats.unit_spans[i],
          unit_L[s],
          unit_L[e],
          feats.arrays["input_ids"][f, s : e + 1],
      )
      if text in seen:
        continue
      seen.add(text)
      nbest.append(dict(text=text, score=score, start_logit=sl, end_logit=el))
      if len(nbest) == n_best:
        break
    best_text = nbest[0]["text"] if nbest else ""
    best_score = nbest[0]["score"] if nbest else -np.inf
    if version == "2.0" and null is not None:
      nbest.append(dict(text="", score=null[0], start_logit=null[1], end_logit=null[2]))
      nbest.sort(key=lambda d: -d["score"])
      nbest = nbest[:n_best]
      diff = null[0] - best_score
      out.null_odds[ex.qid] = float(diff) if np.isfinite(diff) else 1e9
      out.predictions[ex.qid] = "" if diff > null_threshold else best_text
    else:
      out.null_odds[ex.qid] = 0.0
      out.predictions[ex.qid] = best_text
    out.best_span[ex.qid] = best_text
    out.nbest[ex.qid] = _with_probabilities(nbest)
  return out


def _with_probabilities(nbest: list[dict]) -> list[dict]:
  if not nbest:
    return [dict(text="", probability=1.0, start_logit=0.0, end_logit=0.0)]
  scores = np.array([d["score"] for d in nbest])
  p = np.exp(scores - scores.max())
  p /= p.sum()
  return [
      dict(
          text=d["text"],
          probability=float(q),
          start_logit=d["start_logit"],
          end_logit=d["end_logit"],
      )
      for d, q in zip(nbest, p)
  ]
