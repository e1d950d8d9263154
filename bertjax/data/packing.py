"""Several pretraining examples in one row: the plan, the packed layout, and its inverse.

An example is laid out and masked exactly as it would be in a row of its own (pretraining.py):
[CLS] A [SEP] (B [SEP]) with its own token type ids and MLM predictions. Packing only moves
it: the k examples of a packed row sit one after another from position 0, their masked
positions shifted by their offset in the row. So a packed and an unpacked stream see the same
tokens and the same masks for the same example.

Which packer. Krell et al. 2021 ("Efficient sequence packing without cross-contamination")
pack offline with SPFHP: walk the whole corpus's length histogram longest first and put each
sequence in the open pack with the most room left (the "shortest pack"), at most a few
sequences per pack. That needs every length before the first batch, but this stream builds
its instances on the fly, with new pairs and truncations every epoch, and resumes from
(epoch, block, offset) without replaying anything. So the stream packs what it already holds:
each block of shuffled instances (the buffer), longest first, each into the open row with the
least room that still fits it (best-fit decreasing, `plan_rows`: O(n log n) with a sorted
list of open rows; within 11/9 of the fewest rows where the cap on examples does not bind).
The rows are a pure function of the block, so a resumed stream rebuilds them, and a row's
examples are a random sample of the block (it was shuffled before sorting; ties keep that
order). A first-fit that streams through a
sliding buffer would make rows that depend on everything the buffer held before, which a
resume would have to replay. Measured on three blocks of the bundled corpus, best-fit,
first-fit decreasing and SPFHP's rule make the same number of rows within 0.02% (99.6% of the
slots real at L=128, 99.7% at 512, against 95.6% and 88.8% unpacked): packing whole blocks is
what matters, not which of these rules.

Layout of a packed batch (B rows, L = seq_len, E = max examples per row, R = `prediction_budget`):
    input_ids, token_type_ids, attention_mask (1 on real tokens) [B,L]
    segment_ids [B,L]     1..k for the row's k examples, 0 on padding: attention stays inside
                          an example (a block-diagonal mask)
    position_ids [B,L]    0, 1, ... restarting at each example's [CLS]; 0 on padding
    cls_positions [B,E]   where each example's [CLS] is; 0 for absent examples
    nsp_labels [B,E], nsp_weights [B,E] (1 = the example is there)
    masked_positions, masked_ids, masked_weights [B,R]   row positions, increasing
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

import numpy as np

# What a packed batch has besides the unpacked features (pretraining.FEATURES).
EXTRA_FEATURES = ("segment_ids", "position_ids", "cls_positions", "nsp_weights")


def plan_rows(lengths: Sequence[int], seq_len: int, max_examples: int) -> list[list[int]]:
  """Indices of `lengths` grouped into rows of at most `seq_len` tokens and `max_examples`
  examples: best-fit decreasing. Every index is in exactly one row; rows are in order of
  creation, a row's indices in the order they were placed (longest first)."""
  if not lengths:
    return []
  if max(lengths) > seq_len:
    raise ValueError(f"an example of {max(lengths)} tokens does not fit seq_len {seq_len}")
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep order
  shortest = min(lengths)
  rows: list[list[int]] = []
  open_rows: list[tuple[int, int]] = []  # sorted (room left, row) of rows that can take more
  for i in order:
    n = lengths[i]
    at = bisect.bisect_left(open_rows, (n, -1))  # the least room that still fits n
    if at == len(open_rows):
      row, room = len(rows), seq_len - n
      rows.append([i])
    else:
      room, row = open_rows.pop(at)
      room -= n
      rows[row].append(i)
    if len(rows[row]) < max_examples and room >= shortest:
      bisect.insort(open_rows, (room, row))
  return rows


def prediction_budget(
    seq_len: int, max_predictions: int, mask_prob: float, max_examples: int
) -> int:
  """MLM slots a packed row needs: R, the bound no row can exceed.

  An example of t tokens gets min(P, max(1, round(t * mask_prob))) <= t * mask_prob + 1
  predictions (masking.mask_batch), so k examples sharing L slots get at most
  floor(L * mask_prob) + k, and never more than k * P. (1e-9 absorbs the float product:
  0.29 * 100 is 28.999999999999996.)
  """
  return min(max_examples * max_predictions, math.floor(seq_len * mask_prob + 1e-9) + max_examples)


def real_token_fraction(attention_mask_BxL: np.ndarray) -> float:
  """Real tokens over row slots: the share of the batch's compute that is not padding."""
  return float(np.asarray(attention_mask_BxL).sum()) / max(1, np.asarray(attention_mask_BxL).size)


def _placements(
    rows: Sequence[Sequence[int]], length_N: np.ndarray, count_N: np.ndarray
) -> tuple[np.ndarray, ...]:
  """(example, row, slot, token offset, prediction offset) of every placed example."""
  ex, row, slot, offset, pred = [], [], [], [], []
  for r, members in enumerate(rows):
    at, p = 0, 0
    for s, i in enumerate(members):
      ex.append(i), row.append(r), slot.append(s), offset.append(at), pred.append(p)
      at, p = at + int(length_N[i]), p + int(count_N[i])
  return tuple(np.array(x, np.int64) for x in (ex, row, slot, offset, pred))


def pack(
    examples: dict[str, np.ndarray],
    rows: Sequence[Sequence[int]],
    *,
    max_examples: int,
    max_predictions: int,
    pad_id: int,
) -> dict[str, np.ndarray]:
  """Packed batch (layout in the module docstring) of `examples`, unpacked features of N
  examples ([N,L] tokens from position 0, [N,P] masks, [N] labels, masking applied);
  `rows[b]` lists the examples of row b in order. `max_predictions` is R."""
  L = examples["input_ids"].shape[1]
  B, E, R = len(rows), max_examples, max_predictions
  real_NxL = examples["attention_mask"].astype(bool)
  w_NxP = examples["masked_weights"].astype(bool)
  ex, row, slot, offset, pred = _placements(rows, real_NxL.sum(1), w_NxP.sum(1))
  if len(ex) and slot.max() >= E:
    raise ValueError(f"a row holds {slot.max() + 1} examples; max_examples is {E}")
  ends = offset + real_NxL[ex].sum(1)
  if len(ex) and ends.max() > L:
    raise ValueError(f"a packed row needs {ends.max()} tokens; seq_len is {L}")
  if len(ex) and (pred + w_NxP[ex].sum(1)).max() > R:
    raise ValueError(f"a packed row needs more than {R} predictions: raise max_predictions")

  # Token slots: row-major flat indices of every real token of every placed example.
  real = real_NxL[ex]
  to_BL = ((row * L + offset)[:, None] + np.arange(L))[real]
  out = {
      "input_ids": np.full(B * L, pad_id, np.int32),
      "token_type_ids": np.zeros(B * L, np.int32),
      "attention_mask": np.zeros(B * L, np.int32),
      "segment_ids": np.zeros(B * L, np.int32),
      "position_ids": np.zeros(B * L, np.int32),
  }
  out["input_ids"][to_BL] = examples["input_ids"][ex][real]
  out["token_type_ids"][to_BL] = examples["token_type_ids"][ex][real]
  out["attention_mask"][to_BL] = 1
  out["segment_ids"][to_BL] = np.broadcast_to((slot + 1)[:, None], real.shape)[real]
  out["position_ids"][to_BL] = np.broadcast_to(np.arange(L), real.shape)[real]
  out = {k: v.reshape(B, L) for k, v in out.items()}

  per_example = {
      "cls_positions": offset,
      "nsp_labels": examples["nsp_labels"][ex],
      "nsp_weights": 1,
  }
  for name, value in per_example.items():
    out[name] = np.zeros((B, E), np.int32)
    out[name][row, slot] = value

  # Predictions: each example's (a prefix of its P slots) after those of the examples before it.
  w = w_NxP[ex]
  to_BR = ((row * R + pred)[:, None] + np.arange(w.shape[1]))[w]
  for name, value in (
      ("masked_positions", examples["masked_positions"][ex] + offset[:, None]),
      ("masked_ids", examples["masked_ids"][ex]),
      ("masked_weights", np.ones_like(w, np.int32)),
  ):
    flat = np.zeros(B * R, np.int32)
    flat[to_BR] = value[w]
    out[name] = flat.reshape(B, R)
  return out


def unpack(batch: dict[str, np.ndarray], max_predictions: int, pad_id: int) -> list[list[dict]]:
  """The inverse of `pack`: per row, its examples as unpacked features of one row each
  ([L], [P] with P = `max_predictions`, scalar label) plus "offset", the [CLS] position."""
  B, L = batch["input_ids"].shape
  out = []
  for b in range(B):
    seg, examples = batch["segment_ids"][b], []
    for s in range(batch["nsp_weights"].shape[1]):
      if not batch["nsp_weights"][b, s]:
        continue
      at = np.flatnonzero(seg == s + 1)
      start, n = int(batch["cls_positions"][b, s]), len(at)
      e = {"offset": start, "nsp_labels": int(batch["nsp_labels"][b, s])}
      for name, fill in (("input_ids", pad_id), ("token_type_ids", 0), ("attention_mask", 0)):
        e[name] = np.full(L, fill, np.int32)
        e[name][:n] = batch[name][b, start : start + n]
      pos, w = batch["masked_positions"][b], batch["masked_weights"][b].astype(bool)
      mine = w & (pos >= start) & (pos < start + n)
      k = int(mine.sum())
      for name, value in (
          ("masked_positions", pos[mine] - start),
          ("masked_ids", batch["masked_ids"][b][mine]),
          ("masked_weights", np.ones(k)),
      ):
        e[name] = np.zeros(max_predictions, np.int32)
        e[name][:k] = value
      examples.append(e)
    out.append(examples)
  return out
