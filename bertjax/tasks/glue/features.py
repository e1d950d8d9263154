"""Examples (texts + labels) and their encoding as [CLS] A [SEP] B [SEP] (`bertjax.tasks.inputs`).

Shape letters: N examples, L max sequence length.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax import errors
from bertjax.data.tokenizer import Tokenizer
from bertjax.tasks import inputs


@dataclasses.dataclass
class Examples:
  """One split of a task, as plain Python/numpy (small enough for host memory: MNLI is ~400k)."""

  text_a: list[str]
  text_b: list[str] | None  # None for single-sentence tasks
  labels: np.ndarray | None  # [N] int32 class ids or float32 scores; None for test splits
  index: list[str]  # leaderboard row ids (test) or source positions ("file:line" for TSVs)
  skipped: list[str] = dataclasses.field(default_factory=list)  # "file:line: why" per bad row

  def __len__(self) -> int:
    return len(self.text_a)


@dataclasses.dataclass
class Features:
  input_ids_NxL: np.ndarray  # int32
  token_type_ids_NxL: np.ndarray  # int32: 0 for [CLS] A [SEP], 1 for B [SEP]
  attention_mask_NxL: np.ndarray  # int32: 1 on real tokens, 0 on padding
  labels_N: np.ndarray | None

  def __len__(self) -> int:
    return self.input_ids_NxL.shape[0]


def encode(tok: Tokenizer, ex: Examples, max_seq_len: int) -> Features:
  """Tokenize and pack every example of a split."""
  if max_seq_len < 4:
    raise errors.ConfigError(
        f"max_seq_len={max_seq_len} must be >= 4 ([CLS] a [SEP] b [SEP] holds 3 special tokens)"
    )
  ids_a = tok.encode_batch(list(ex.text_a))
  ids_b = tok.encode_batch(list(ex.text_b)) if ex.text_b is not None else [None] * len(ids_a)
  n = len(ids_a)
  out = np.full((3, n, max_seq_len), 0, np.int32)
  for i, (a, b) in enumerate(zip(ids_a, ids_b)):
    out[0, i], out[1, i], out[2, i] = inputs.pack(a, b, max_seq_len, tok)
  return Features(out[0], out[1], out[2], ex.labels)
