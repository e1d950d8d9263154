"""Sentences of tagged words as [CLS] pieces [SEP] rows, labelled on each word's first piece.

Each word is tokenized on its own; its tag is the label of its first piece and the other
pieces are not scored (label -1, as BERT's CoNLL-2003 experiment). A word that tokenizes to
nothing (a control character) becomes [UNK] so every word gets a prediction. A sentence longer
than `max_seq_len - 2` pieces is cut into consecutive rows at word boundaries (a single word
longer than a row keeps only its first pieces), so every word is predicted exactly once.

Shape letters: N rows, L max sequence length.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bertjax import errors
from bertjax.tasks.inputs import special_ids
from bertjax.tasks.ner.conll import Sentences

IGNORE = -1  # label of pieces that are not scored


@dataclasses.dataclass
class Features:
  arrays: dict[str, np.ndarray]  # input_ids/token_type_ids/attention_mask/labels [N,L] int32
  sentence_N: np.ndarray  # int32: the sentence of each row
  first_word_N: np.ndarray  # int32: index in its sentence of the row's first word
  word_pos: list[np.ndarray]  # per row: the position of each of its words' first piece

  def __len__(self) -> int:
    return len(self.sentence_N)


def _rows_of(pieces: list[list[int]], room: int) -> list[tuple[int, int]]:
  """(first word, end word) of each row: greedy packing of whole words into `room` pieces."""
  rows, start, used = [], 0, 0
  for w, p in enumerate(pieces):
    n = min(len(p), room)
    if used and used + n > room:
      rows.append((start, w))
      start, used = w, 0
    used += n
  rows.append((start, len(pieces)))
  return rows


def build(tok: Any, sents: Sentences, labels: list[str], max_seq_len: int = 128) -> Features:
  if max_seq_len < 3:
    raise errors.ConfigError(f"max_seq_len={max_seq_len} must be >= 3 ([CLS] word [SEP])")
  cls, sep, pad = special_ids(tok)
  unk = tok.unk_id
  label_id = {t: i for i, t in enumerate(labels)}
  room = max_seq_len - 2
  ids_rows, label_rows, sent_of, first_of, positions = [], [], [], [], []
  for s, (words, tags) in enumerate(zip(sents.tokens, sents.tags)):
    pieces = [p or [unk] for p in tok.encode_batch(words)]
    for w0, w1 in _rows_of(pieces, room):
      ids, labs, pos = [cls], [IGNORE], []
      for w in range(w0, w1):
        p = pieces[w][:room]
        pos.append(len(ids))
        ids += p
        # A tag unseen in training is scored as gold but cannot be learned: label "O".
        labs += [label_id.get(tags[w], 0)] + [IGNORE] * (len(p) - 1)
      ids.append(sep)
      labs.append(IGNORE)
      ids_rows.append(ids)
      label_rows.append(labs)
      sent_of.append(s)
      first_of.append(w0)
      positions.append(np.asarray(pos, np.int32))
  n = len(ids_rows)
  arrays = dict(
      input_ids=np.full((n, max_seq_len), pad, np.int32),
      token_type_ids=np.zeros((n, max_seq_len), np.int32),
      attention_mask=np.zeros((n, max_seq_len), np.int32),
      labels=np.full((n, max_seq_len), IGNORE, np.int32),
  )
  for i, (ids, labs) in enumerate(zip(ids_rows, label_rows)):
    arrays["input_ids"][i, : len(ids)] = ids
    arrays["attention_mask"][i, : len(ids)] = 1
    arrays["labels"][i, : len(labs)] = labs
  return Features(arrays, np.asarray(sent_of, np.int32), np.asarray(first_of, np.int32), positions)


def word_tags(
    feats: Features, sents: Sentences, pred_NxL: np.ndarray, labels: list[str]
) -> list[list[str]]:
  """Predicted tag of every word of every sentence, read at its first piece."""
  out = [["O"] * len(words) for words in sents.tokens]
  for r in range(len(feats)):
    s, w0 = int(feats.sentence_N[r]), int(feats.first_word_N[r])
    for k, pos in enumerate(feats.word_pos[r]):
      out[s][w0 + k] = labels[int(pred_NxL[r, pos])]
  return out
