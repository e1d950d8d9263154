"""Entity-level precision, recall and F1, as seqeval's default (conlleval-compatible) mode.

An entity is a maximal run of tags of one type, started and ended by the prefix rules below,
which read IOB1 (I- starts an entity unless it continues one of the same type; B- only splits
two adjacent entities of a type) and IOB2 (every entity starts with B-) alike, and also
tolerate IOBES. A predicted entity counts only when its type, start and end all match a gold
one. Sentences are joined with an "O" between them, so no entity crosses a sentence break.
"""

from __future__ import annotations

from typing import Sequence


def _split(tag: str) -> tuple[str, str]:
  if tag == "O" or "-" not in tag:
    return "O", ""
  prefix, _, kind = tag.partition("-")
  return prefix, kind


def _ends(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
  """Whether the entity open before this token ends before it (seqeval's end_of_chunk)."""
  return (
      prev in ("E", "S")
      or (prev in ("B", "I") and tag in ("B", "S", "O"))
      or (prev != "O" and prev_kind != kind)
  )


def _starts(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
  """Whether an entity starts at this token (seqeval's start_of_chunk)."""
  return (
      tag in ("B", "S")
      or (prev in ("E", "S", "O") and tag in ("E", "I"))
      or (tag != "O" and prev_kind != kind)
  )


def entities(sentences: Sequence[Sequence[str]]) -> set[tuple[str, int, int]]:
  """(type, first, last) token positions of every entity, positions running over all
  sentences (each followed by one "O")."""
  tags = [t for sent in sentences for t in list(sent) + ["O"]]
  out, start, prev, prev_kind = set(), None, "O", ""
  for i, tag in enumerate(tags + ["O"]):
    pre, kind = _split(tag)
    if start is not None and _ends(prev, pre, prev_kind, kind):
      out.add((prev_kind, start, i - 1))
      start = None
    if _starts(prev, pre, prev_kind, kind):
      start = i
    prev, prev_kind = pre, kind
  return out


def _prf(n_correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
  p = n_correct / n_pred if n_pred else 0.0
  r = n_correct / n_gold if n_gold else 0.0
  return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def score(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
  """Micro precision/recall/f1 over all entities, per-type f1 (f1_PER, ...), token accuracy."""
  if len(gold) != len(pred) or any(len(g) != len(p) for g, p in zip(gold, pred)):
    raise ValueError("gold and predicted tag sequences differ in length")
  g, p = entities(gold), entities(pred)
  precision, recall, f1 = _prf(len(g & p), len(p), len(g))
  out = dict(precision=precision, recall=recall, f1=f1)
  for kind in sorted({k for k, _, _ in g | p}):
    gk = {e for e in g if e[0] == kind}
    pk = {e for e in p if e[0] == kind}
    out[f"f1_{kind}"] = _prf(len(gk & pk), len(pk), len(gk))[2]
  n = sum(len(s) for s in gold)
  out["accuracy"] = sum(a == b for gs, ps in zip(gold, pred) for a, b in zip(gs, ps)) / max(n, 1)
  return out
