"""Preparing and streaming with a WordPiece vocab.txt: BERT's special ids, never masked."""

import collections
import itertools
import json
import pathlib
import re

import numpy as np
import pytest

from bertjax.commands import prepare as prepare_cmd
from bertjax.data import inspect, masking, pretraining, records, wordpiece

REPO = pathlib.Path(__file__).resolve().parents[1]
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103  # as in BERT's released vocabs
SPECIAL = [PAD, UNK, CLS, SEP, MASK]


def _write_vocab(path: pathlib.Path, text: str) -> None:
  """BERT's layout: [PAD], [unused0-98], [UNK] [CLS] [SEP] [MASK], then words and pieces.

  Frequent words are whole pieces; every character is a piece and a "##" piece, so nothing
  becomes [UNK] and rare words split into several pieces (whole-word masking has work to do).
  """
  words = collections.Counter(
      w for line in text.splitlines() for w in wordpiece.basic_tokenize(line, lower_case=True)
  )
  chars = sorted({c for w in words for c in w})
  pieces = (
      ["[PAD]"]
      + [f"[unused{i}]" for i in range(99)]
      + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
      + chars
      + ["##" + c for c in chars]
      + [w for w, _ in words.most_common(400) if len(w) > 1]
  )
  path.write_text("\n".join(pieces) + "\n")


@pytest.fixture(scope="module")
def wp_data(tmp_path_factory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("wp")
  docs = (REPO / "data" / "austen.txt").read_text().split("\n\n")
  text = "\n\n".join(docs[1:9]) + "\n"  # ~80 KB: eight chapters
  (root / "corpus.txt").write_text(text)
  _write_vocab(root / "vocab.txt", text)
  rc = prepare_cmd.main(
      [
          "--input",
          str(root / "corpus.txt"),
          "--tokenizer",
          str(root / "vocab.txt"),
          "--output",
          str(root / "out"),
          "--num-shards",
          "2",
          "--processes",
          "1",
          "--no-progress",
      ]
  )
  assert rc == 0
  return root / "out"


def _stream(data, **kw):
  base = dict(path=str(data), seq_len=64, max_predictions_per_seq=12, seed=2, shuffle_buffer=4)
  cfg = pretraining.InputConfig(**{**base, **kw})
  return pretraining.make_stream(cfg, global_batch_size=32, process_index=0, process_count=1)


def test_metadata_records_wordpiece_and_its_special_ids(wp_data):
  meta = records.load_metadata(wp_data)
  assert meta["tokenizer"]["file"] == "vocab.txt" and meta["tokenizer"]["type"] == "wordpiece"
  assert records.special_ids(meta) == dict(pad=PAD, unk=UNK, cls=CLS, sep=SEP, mask=MASK)
  assert meta["tokenizer"]["lower_case"] is True
  assert json.loads((wp_data / "tokenizer_config.json").read_text()) == {"do_lower_case": True}
  tok = wordpiece.load_tokenizer(wp_data / "vocab.txt")
  assert meta["tokenizer"]["sha256"] == tok.sha256 and tok.lower_case
  first = next(records.read_documents(records.split_shards(meta, wp_data, "train")[0]["path"]))
  assert UNK not in np.concatenate(first)


@pytest.mark.parametrize("reader", ["tf.data", "python"])
@pytest.mark.parametrize("pair_mode", ["nsp", "none"])
def test_framing_uses_wordpiece_ids_and_specials_are_never_masked(wp_data, pair_mode, reader):
  for b in itertools.islice(_stream(wp_data, pair_mode=pair_mode, reader=reader, mask_prob=0.3), 4):
    ids, w = b["input_ids"], b["masked_weights"].astype(bool)
    n_B = b["attention_mask"].sum(1)
    assert (ids[:, 0] == CLS).all()
    assert (ids[np.arange(len(ids)), n_B - 1] == SEP).all()
    assert ((ids == SEP).sum(1) == (1 if pair_mode == "none" else 2)).all()
    assert (ids[np.arange(64)[None, :] >= n_B[:, None]] == PAD).all()
    assert not np.isin(b["masked_ids"][w], SPECIAL).any()
    now = np.take_along_axis(ids, b["masked_positions"], 1)[w]
    assert (now == MASK).mean() > 0.6  # [MASK] is 103 here
    assert not np.isin(now[now != MASK], SPECIAL).any()  # random tokens are not special
    for row in range(len(ids)):  # [CLS]/[SEP] positions are never predicted
      specials = set(np.flatnonzero(np.isin(ids[row], [CLS, SEP, PAD])))
      assert not specials & set(b["masked_positions"][row][w[row]])


def test_whole_word_masking_uses_double_hash_continuations(wp_data):
  tok = wordpiece.load_tokenizer(wp_data / "vocab.txt")
  cont = ~np.array(tok.word_start_table())
  checked = 0
  for b in itertools.islice(_stream(wp_data, whole_word_mask=True), 4):
    for row in range(32):
      w = b["masked_weights"][row].astype(bool)
      masked = set(b["masked_positions"][row][w])
      orig = b["input_ids"][row].copy()
      orig[b["masked_positions"][row][w]] = b["masked_ids"][row][w]
      for p in range(2, int(b["attention_mask"][row].sum()) - 1):
        if cont[orig[p]] and orig[p - 1] not in (CLS, SEP):  # "##x" after its word
          assert (p in masked) == (p - 1 in masked), (row, p)
          checked += p in masked
  assert checked > 10


def test_stats_and_preview_read_the_wordpiece_ids(wp_data):
  cfg = pretraining.InputConfig(path=str(wp_data), seq_len=64, max_predictions_per_seq=12)
  s = inspect.stats(cfg, n=512)
  assert 0.7 < s["mask_token_fraction"] < 0.9 and 0.12 < s["masked_fraction"] < 0.18
  text = inspect.preview(cfg, 3)
  segments = [l for l in text.splitlines() if l.startswith("segment")]
  assert "[MASK]" in text and re.search(r"segment B: \w", text)
  assert not any("##" in l for l in segments)  # continuations are joined to their word


def test_sentencepiece_replacement_table_gives_the_old_masks():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 1000, size=(8, 48)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  keys = masking.key(9, np.arange(8))
  plain = masking.MaskSpec(vocab_size=1000, max_predictions=10, mask_prob=0.3)
  table = masking.MaskSpec(
      vocab_size=1000,
      max_predictions=10,
      mask_prob=0.3,
      random_ids=masking.replacement_ids(1000, dict(pad=0, unk=1, cls=2, sep=3, mask=4)),
  )
  a, b = masking.mask_batch(ids, keys, plain), masking.mask_batch(ids, keys, table)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
