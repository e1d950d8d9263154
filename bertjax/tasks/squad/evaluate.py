"""The official SQuAD scores: exact match and token F1 against the best of the gold answers.

Re-implements the v1.1 and v2.0 evaluation scripts line for line, so numbers compare with
published ones: answers are normalized (lowercase, punctuation removed, the articles a/an/the
removed, whitespace collapsed); EM and F1 take the max over the gold answers and are reported
in percent. v1.1 scores an empty prediction 0. v2.0 treats a question with no (non-empty) gold
answer as having the gold answer "", scores "" vs "" as EM 1 / F1 1, splits the totals into
HasAns_* and NoAns_*, and, given the null odds, reports the best no-answer threshold
(best_exact/best_f1 and their *_thresh).
"""

from __future__ import annotations

import collections
import re
import string

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
  """Lower text and remove punctuation, articles and extra whitespace (the official order)."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCT)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def exact_match(gold: str, pred: str) -> int:
  return int(normalize_answer(gold) == normalize_answer(pred))


def f1_v1(gold: str, pred: str) -> float:
  pred_toks, gold_toks = normalize_answer(pred).split(), normalize_answer(gold).split()
  common = collections.Counter(pred_toks) & collections.Counter(gold_toks)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_toks), same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def f1_v2(gold: str, pred: str) -> float:
  gold_toks = normalize_answer(gold).split() if gold else []
  pred_toks = normalize_answer(pred).split() if pred else []
  if not gold_toks or not pred_toks:  # no-answer: right only if both are empty
    return float(gold_toks == pred_toks)
  return f1_v1(gold, pred)


def raw_scores(
    gold: dict[str, list[str]], preds: dict[str, str], version: str
) -> tuple[dict[str, float], dict[str, float], dict[str, bool]]:
  """Per question: exact, f1, has_answer. A question without a prediction scores 0."""
  exact, f1, has_ans = {}, {}, {}
  for qid, answers in gold.items():
    if version == "2.0":
      answers = [a for a in answers if normalize_answer(a)] or [""]
      f1_fn = f1_v2
    else:
      f1_fn = f1_v1
    has_ans[qid] = answers != [""]
    if qid not in preds:
      exact[qid] = f1[qid] = 0.0
      continue
    exact[qid] = float(max(exact_match(a, preds[qid]) for a in answers))
    f1[qid] = max(f1_fn(a, preds[qid]) for a in answers)
  return exact, f1, has_ans


def _mean(scores: dict[str, float], qids) -> float:
  qids = list(qids)
  return 100.0 * sum(scores[q] for q in qids) / len(qids) if qids else 0.0


def best_threshold(
    preds: dict[str, str],
    scores: dict[str, float],
    null_odds: dict[str, float],
    has_ans: dict[str, bool],
) -> tuple[float, float]:
  """(best score, its threshold) when questions with null odds above the threshold answer ""
  (the official find_best_thresh; `preds` should be the best non-null spans)."""
  cur = best = sum(1 for q in scores if not has_ans[q])
  thresh = 0.0
  for qid in sorted(null_odds, key=lambda q: null_odds[q]):
    if qid not in scores:
      continue
    diff = scores[qid] if has_ans[qid] else (-1 if preds.get(qid) else 0)
    cur += diff
    if cur > best:
      best, thresh = cur, null_odds[qid]
  return 100.0 * best / max(len(scores), 1), float(thresh)


def score(
    gold: dict[str, list[str]],
    preds: dict[str, str],
    version: str,
    null_odds: dict[str, float] | None = None,
    best_span: dict[str, str] | None = None,
) -> dict[str, float]:
  """exact, f1, total (and for v2.0 the HasAns/NoAns breakdown and best thresholds)."""
  exact, f1, has_ans = raw_scores(gold, preds, version)
  out = dict(exact=_mean(exact, gold), f1=_mean(f1, gold), total=float(len(gold)))
  if version != "2.0":
    return out
  for name, keep in (("HasAns", True), ("NoAns", False)):
    qids = [q for q in gold if has_ans[q] == keep]
    if qids:
      out.update(
          {
              f"{name}_exact": _mean(exact, qids),
              f"{name}_f1": _mean(f1, qids),
              f"{name}_total": float(len(qids)),
          }
      )
  if null_odds is not None:
    spans = best_span if best_span is not None else preds
    e_raw, f_raw, _ = raw_scores(gold, spans, version)
    out["best_exact"], out["best_exact_thresh"] = best_threshold(spans, e_raw, null_odds, has_ans)
    out["best_f1"], out["best_f1_thresh"] = best_threshold(spans, f_raw, null_odds, has_ans)
  return out
