"""Model inputs of every task: special ids, pair truncation, [CLS] A [SEP] B [SEP] packing.

GLUE, SQuAD, NER and `extract` all feed BERT the same way; these are the only definitions.
RoBERTa and XLM-R frame a pair with two separators, `<s> A </s></s> B </s>`, as transformers'
tokenizers do: a tokenizer whose `pair_separators` is 2 (`encoder.load_encoder` sets it for a
RoBERTa-shaped model; a tokenizer.json with RoBERTa's template has it) gets that framing.
"""

from __future__ import annotations

from typing import Sequence

from bertjax import errors
from bertjax.data.tokenizer import Tokenizer


def special_ids(tok: Tokenizer) -> tuple[int, int, int]:
  """(cls, sep, pad): WordPiece vocabularies use 101/102/0, bertjax's SentencePiece 2/3/0."""
  return tok.cls_id, tok.sep_id, tok.pad_id


def pair_separators(tok: Tokenizer) -> int:
  """Separators between a pair's segments: 1 (BERT's [SEP]), 2 (RoBERTa's </s></s>)."""
  return getattr(tok, "pair_separators", 1)


def truncate_pair(
    a: Sequence[int], b: Sequence[int] | None, max_tokens: int
) -> tuple[list[int], list[int] | None]:
  """Drop tokens from the end of the longer segment until both fit in `max_tokens`, as
  google-research/bert's `_truncate_seq_pair`; a single segment is cut at the end."""
  if b is None:
    return list(a[:max_tokens]), None
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()
  return a, b


def segments(
    a: Sequence[int], b: Sequence[int] | None, max_seq_len: int, tok: Tokenizer
) -> tuple[list[int], list[int]]:
  """Unpadded ids and segment ids of [CLS] a [SEP] (b [SEP]), truncated to `max_seq_len`
  (RoBERTa's `pair_separators`: [CLS] a [SEP] [SEP] b [SEP])."""
  cls, sep, _ = special_ids(tok)
  mid = [sep] * pair_separators(tok)
  budget = max_seq_len - (2 + len(mid) if b is not None else 2)
  if budget < 1:
    raise errors.ConfigError(
        f"max_seq_len={max_seq_len} leaves no room for text after [CLS] and [SEP] — use at "
        f"least {max_seq_len - budget + 1}"
    )
  a, b = truncate_pair(a, b, budget)
  ids = [cls] + a + ([sep] if b is None else mid)
  types = [0] * len(ids)
  if b is not None:
    ids += b + [sep]
    types += [1] * (len(b) + 1)
  return ids, types


def pack(
    a: Sequence[int], b: Sequence[int] | None, max_seq_len: int, tok: Tokenizer
) -> tuple[list[int], list[int], list[int]]:
  """ids, segment ids and attention mask of one example, padded to `max_seq_len`."""
  ids, types = segments(a, b, max_seq_len, tok)
  n_pad = max_seq_len - len(ids)
  pad = special_ids(tok)[2]
  return ids + [pad] * n_pad, types + [0] * n_pad, [1] * len(ids) + [0] * n_pad
