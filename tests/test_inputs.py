"""Model inputs shared by every task (bertjax/tasks/inputs.py), and the Tokenizer protocol that
both tokenizers satisfy."""

import numpy as np
import pytest

from bertjax import errors
from bertjax.data import tokenizer as tokenizer_lib, wordpiece
from bertjax.tasks import extract, inputs
from bertjax.tasks.glue import features
from conftest import REPO, write_vocab


def _tokenizers(tmp_path):
  sp = tokenizer_lib.SentencePieceTokenizer(REPO / "data" / "tokenizer.model")
  wp = wordpiece.WordPieceTokenizer(write_vocab(tmp_path / "vocab.txt", 64))
  return sp, wp


def test_both_tokenizers_satisfy_the_protocol(tmp_path):
  for tok in _tokenizers(tmp_path):
    assert isinstance(tok, tokenizer_lib.Tokenizer), type(tok)
    assert inputs.special_ids(tok) == (tok.cls_id, tok.sep_id, tok.pad_id)
    assert tok.encode_batch(["the dog", "fox"]) == [tok.encode("the dog"), tok.encode("fox")]
  sp, wp = _tokenizers(tmp_path)
  assert inputs.special_ids(sp) == (2, 3, 0) and inputs.special_ids(wp) == (2, 3, 0)


def test_truncation_drops_from_the_longer_segment_as_google():
  assert inputs.truncate_pair([1, 2, 3], [4, 5, 6, 7], 4) == ([1, 2], [4, 5])
  assert inputs.truncate_pair([1, 2, 3, 4, 5], [6], 4) == ([1, 2, 3], [6])
  assert inputs.truncate_pair([1, 2, 3], None, 2) == ([1, 2], None)


def test_every_task_packs_a_pair_the_same_way(tmp_path):
  # glue's padded rows and extract's unpadded examples come from the one definition
  for tok in _tokenizers(tmp_path):
    a, b = "the quick brown fox jumped over", "the lazy dog"
    ids, types = inputs.segments(tok.encode(a), tok.encode(b), 9, tok)
    assert len(ids) == 9 and ids[0] == tok.cls_id and ids.count(tok.sep_id) == 2
    assert types == [0] * (ids.index(tok.sep_id) + 1) + [1] * (9 - ids.index(tok.sep_id) - 1)
    padded, ptypes, mask = inputs.pack(tok.encode(a), tok.encode(b), 9, tok)
    assert (padded, ptypes, mask) == (ids, types, [1] * 9)
    short = tok.encode("fox")
    padded, _, mask = inputs.pack(short, None, len(short) + 4, tok)
    assert padded == [tok.cls_id, *short, tok.sep_id, tok.pad_id, tok.pad_id]
    assert mask == [1] * (len(short) + 2) + [0, 0]
    ex = extract.make_example(0, f"{a} ||| {b}", tok, 9)
    assert ex.input_ids == ids and ex.token_type_ids == types
    f = features.encode(tok, features.Examples([a], [b], np.zeros(1, np.int32), ["0"]), 9)
    assert f.input_ids_NxL[0].tolist() == ids and f.token_type_ids_NxL[0].tolist() == types


def test_a_window_without_room_for_text_names_the_argument(tmp_path):
  sp, _ = _tokenizers(tmp_path)
  assert inputs.segments([7], [8], 4, sp) == ([2, 7, 3, 3], [0, 0, 0, 1])  # B truncated away
  with pytest.raises(
      errors.ConfigError, match=r"max_seq_len=3 leaves no room for text .* at least 4"
  ):
    inputs.segments([7], [8], 3, sp)
