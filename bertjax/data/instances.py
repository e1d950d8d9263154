"""Segment pairs from documents, as google-research/bert's create_pretraining_data.py.

A document is walked sentence by sentence into chunks of about `target` tokens; each chunk
becomes one instance. In `nsp` mode segment A is a random prefix of the chunk and B is either
the rest of the chunk (IsNext, label 0) or sentences from another document (NotNext, label 1);
unused sentences are put back. `sop` always takes B from the chunk and swaps A and B half of the
time (label 1 = swapped). `none` makes single segments. Differences from the original, all to
keep the labels at 50/50 and the examples full:
  - the short-sequence coin is tossed per instance, not once per document;
  - a chunk of one sentence is split inside the sentence (the original always makes it
    NotNext, which skews the NSP labels on corpora with long sentences).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

import numpy as np

from bertjax import errors

Document = Sequence[np.ndarray]  # sentences of int32 token ids


@dataclasses.dataclass(frozen=True)
class PairSpec:
  seq_len: int  # L, including [CLS] and [SEP]s
  pair_mode: str  # "nsp" | "sop" | "none"
  short_seq_prob: float  # chance an instance targets a random shorter length

  @property
  def max_tokens(self) -> int:
    return self.seq_len - (2 if self.pair_mode == "none" else 3)


@dataclasses.dataclass
class Instance:
  tokens_a: np.ndarray
  tokens_b: np.ndarray  # empty in "none" mode
  label: int  # nsp: 1 = NotNext; sop: 1 = swapped; none: 0
  index: int  # instance number within its document, part of the masking key

  @property
  def length(self) -> int:
    """Tokens of its row: [CLS] A [SEP], and B [SEP] when there is a B."""
    lb = len(self.tokens_b)
    return len(self.tokens_a) + 2 + (lb + 1 if lb else 0)


_EMPTY = np.zeros((0,), np.int32)


def truncate_pair(
    a: np.ndarray, b: np.ndarray, max_tokens: int, rng: random.Random
) -> tuple[np.ndarray, np.ndarray]:
  """google-research/bert's truncate_seq_pair in closed form: trims the longer segment one
  token at a time (ties trim B), each token from the front or the back at random."""
  la, lb = len(a), len(b)
  excess = la + lb - max_tokens
  if excess <= 0:
    return a, b
  ra = min(excess, max(0, la - lb))
  rb = min(excess - ra, max(0, lb - la))
  rest = excess - ra - rb
  ra, rb = ra + rest // 2, rb + rest - rest // 2

  def trim(x: np.ndarray, k: int) -> np.ndarray:
    if k == 0:
      return x
    front = bin(rng.getrandbits(k)).count("1")
    return x[front : len(x) - (k - front)]

  return trim(a, ra), trim(b, rb)


def _random_segment(
    others: Sequence[Document], current: int, target: int, rng: random.Random
) -> np.ndarray:
  """Sentences from a random document other than `current` (itself only if it is alone)."""
  j = current
  if len(others) > 1:
    j = rng.randrange(len(others) - 1)
    j += j >= current
  doc = others[j]
  start = rng.randrange(len(doc))
  picked, n = [], 0
  for sentence in doc[start:]:
    picked.append(sentence)
    n += len(sentence)
    if n >= target:
      break
  return np.concatenate(picked)


def _split_chunk(chunk: list[np.ndarray], rng: random.Random) -> tuple[np.ndarray, np.ndarray, int]:
  """A random split into A and B; returns (A, B, sentences of the chunk used by A)."""
  if len(chunk) >= 2:
    a_end = rng.randint(1, len(chunk) - 1)
    return np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:]), a_end
  only = chunk[0]
  if len(only) < 2:
    return only, _EMPTY, 1
  cut = rng.randint(1, len(only) - 1)
  return only[:cut], only[cut:], 1


def _pair(
    chunk: list[np.ndarray],
    target: int,
    spec: PairSpec,
    others: Sequence[Document],
    current: int,
    rng: random.Random,
) -> tuple[np.ndarray, np.ndarray, int, int]:
  """(A, B, label, sentences to put back) for one chunk."""
  if spec.pair_mode == "none":
    return np.concatenate(chunk), _EMPTY, 0, 0
  a, b, a_end = _split_chunk(chunk, rng)
  if spec.pair_mode == "sop":
    if len(b) and rng.random() < 0.5:
      return b, a, 1, 0
    return a, b, 0, 0
  if len(b) == 0 or rng.random() < 0.5:
    # NotNext: B from another document; the chunk's sentences after A are reused.
    b = _random_segment(others, current, max(1, target - len(a)), rng)
    return a, b, 1, len(chunk) - a_end
  return a, b, 0, 0


def create_instances(
    others: Sequence[Document], current: int, spec: PairSpec, rng: random.Random
) -> list[Instance]:
  """All instances of document `others[current]`; NotNext segments come from a uniformly
  random other document of `others` (the stream passes a block of shuffled documents)."""
  if spec.pair_mode not in ("nsp", "sop", "none"):
    raise errors.ConfigError(f"pair_mode {spec.pair_mode!r}: valid options are nsp, sop, none")
  doc = others[current]
  out: list[Instance] = []

  def new_target() -> int:
    if rng.random() < spec.short_seq_prob:
      return rng.randint(2, spec.max_tokens)
    return spec.max_tokens

  target, chunk, length, i = new_target(), [], 0, 0
  while i < len(doc):
    chunk.append(doc[i])
    length += len(doc[i])
    if i == len(doc) - 1 or length >= target:
      a, b, label, put_back = _pair(chunk, target, spec, others, current, rng)
      i -= put_back
      a, b = truncate_pair(a, b, spec.max_tokens, rng)
      out.append(Instance(a, b, label, len(out)))
      target, chunk, length = new_target(), [], 0
    i += 1
  return out


def layout(
    instances: Sequence[Instance], seq_len: int, cls_id: int, sep_id: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Each instance in a row of its own: [CLS] A [SEP] (B [SEP]) from position 0, then padding.
  Returns input_ids [N,L], token_type_ids [N,L] (1 on B and its [SEP]) and labels [N]."""
  N = len(instances)
  ids = np.full((N, seq_len), pad_id, np.int32)
  types = np.zeros((N, seq_len), np.int32)
  labels = np.zeros((N,), np.int32)
  for row, inst in enumerate(instances):
    a, b = inst.tokens_a, inst.tokens_b
    la, lb = len(a), len(b)
    ids[row, 0], ids[row, 1 : 1 + la], ids[row, 1 + la] = cls_id, a, sep_id
    if lb:
      ids[row, 2 + la : 2 + la + lb], ids[row, 2 + la + lb] = b, sep_id
      types[row, 2 + la : 3 + la + lb] = 1
    labels[row] = inst.label
  return ids, types, labels
