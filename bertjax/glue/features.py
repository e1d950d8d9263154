"""Examples (texts + labels) and their encoding as [CLS] A [SEP] B [SEP] with segment ids.

Shape letters: N examples, L max sequence length.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from bertjax import tokenizer as tokenizer_lib


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


def special_ids(tok: Any) -> tuple[int, int, int]:
  """(cls, sep, pad) of a tokenizer: its own attributes if it has them (WordPiece vocabularies
  use 101/102/0), else the SentencePiece constants of bertjax.tokenizer."""
  return (getattr(tok, "cls_id", tokenizer_lib.CLS_ID),
          getattr(tok, "sep_id", tokenizer_lib.SEP_ID),
          getattr(tok, "pad_id", tokenizer_lib.PAD_ID))


def truncate_pair(a: list[int], b: list[int] | None, max_tokens: int) -> tuple[list, list | None]:
  """Drop tokens from the end of the longer segment until both fit, as BERT's run_classifier."""
  if b is None:
    return a[:max_tokens], None
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()
  return a, b


def pack(a: list[int], b: list[int] | None, max_seq_len: int, cls: int, sep: int, pad: int
         ) -> tuple[list[int], list[int], list[int]]:
  """ids, segment ids, mask of one example, padded to max_seq_len."""
  a, b = truncate_pair(a, b, max_seq_len - (3 if b is not None else 2))
  ids = [cls] + a + [sep]
  types = [0] * len(ids)
  if b is not None:
    ids += b + [sep]
    types += [1] * (len(b) + 1)
  mask = [1] * len(ids)
  n_pad = max_seq_len - len(ids)
  return ids + [pad] * n_pad, types + [0] * n_pad, mask + [0] * n_pad


def _encode_all(tok: Any, texts: Sequence[str]) -> list[list[int]]:
  if hasattr(tok, "encode_batch"):
    return tok.encode_batch(list(texts))
  return [tok.encode(t) for t in texts]


def encode(tok: Any, ex: Examples, max_seq_len: int) -> Features:
  """Tokenize and pack every example of a split."""
  if max_seq_len < 4:
    raise ValueError(f"--max-seq-len={max_seq_len}: need at least 4 ([CLS] a [SEP] b [SEP])")
  cls, sep, pad = special_ids(tok)
  ids_a = _encode_all(tok, ex.text_a)
  ids_b = _encode_all(tok, ex.text_b) if ex.text_b is not None else [None] * len(ids_a)
  n = len(ids_a)
  out = np.full((3, n, max_seq_len), 0, np.int32)
  for i, (a, b) in enumerate(zip(ids_a, ids_b)):
    out[0, i], out[1, i], out[2, i] = pack(a, b, max_seq_len, cls, sep, pad)
  return Features(out[0], out[1], out[2], ex.labels)
