"""Whole-word masking of Chinese with a word segmenter (`prepare --word-segmenter jieba`).

Every masked span is made of whole words of jieba's segmentation of the original text, with a
WordPiece vocabulary (one token per ideograph) and a SentencePiece one (three byte pieces per
ideograph here), packed or not, in the stream's worker processes too; the share of masked
tokens stays at the masking rate; `data stats` reports the mean masked-span length; without
the segmenter nothing changes. The corpus is generated here from a word list, so no fixture
holds it.
"""

import dataclasses
import json
import pathlib
import random
import sys

import numpy as np
import pytest

from bertjax import cli, errors
from bertjax.data import (
    inspect,
    packing,
    prepare as prepare_lib,
    pretraining,
    records,
    segment,
    tokenizer as tok_lib,
    wordpiece_train,
)
from bertjax.data import wordpiece

jieba = pytest.importorskip("jieba")

REPO = pathlib.Path(__file__).resolve().parents[1]
# Words of one to four ideographs (jieba's dictionary has them), joined without spaces.
WORDS = (
    "我们 你们 他们 今天 明天 昨天 学习 研究 语言 自然语言 处理 模型 训练 数据 北京 上海 大学 "
    "学生 老师 中国 世界 经济 发展 问题 重要 非常 已经 可以 没有 因为 所以 但是 如果 时候 "
    "工作 公司 技术 科学 计算机 人工智能 方法 结果 一个 这个 那个 什么 喜欢 看 说 去 来 好 大 "
    "新 的 了 在 是 和 也 都 很 就 还 又 书 水 山 电话 城市 政府 市场 文化 历史 音乐 电影 朋友"
).split()
STOPS = "。、"  # neither changes under SentencePiece's NFKC, so a token's bytes are the text's


def _sentence(rng: random.Random) -> str:
  return "".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + rng.choice(STOPS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
  rng = random.Random(7)
  docs = ["\n".join(_sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(400)]
  path = tmp_path_factory.mktemp("zh") / "zh.txt"
  path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
  return path


def _prepare(out, corpus, tokenizer, **kw) -> str:
  cfg = prepare_lib.PrepareConfig(
      output=str(out),
      tokenizer=str(tokenizer),
      inputs=(str(corpus),),
      num_shards=3,
      eval_fraction=0.05,
      processes=1,
      progress=False,
      **kw,
  )
  prepare_lib.prepare(cfg)
  return str(out)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus) -> dict[str, str]:
  """The corpus prepared with jieba, with a WordPiece vocab trained on it and with the bundled
  SentencePiece model; and with the WordPiece vocab without a segmenter."""
  base = tmp_path_factory.mktemp("prepared")
  vocab = wordpiece_train.train_wordpiece([str(corpus)], str(base / "vocab"))
  return {
      "wordpiece": _prepare(base / "wp", corpus, vocab.path, word_segmenter="jieba"),
      "sentencepiece": _prepare(
          base / "sp", corpus, REPO / "data" / "tokenizer.model", word_segmenter="jieba"
      ),
      "plain": _prepare(base / "plain", corpus, vocab.path),
  }


def _cfg(path, **kw) -> pretraining.InputConfig:
  # Documents of at most ~50 ideographs and no pairs: every example is one whole document.
  base = dict(
      path=path,
      seq_len=200,
      max_predictions_per_seq=40,
      pair_mode="none",
      short_seq_prob=0.0,
      whole_word_mask=True,
      shuffle_buffer=64,
      reader="python",
      seed=5,
  )
  return pretraining.InputConfig(**{**base, **kw})


def _batches(cfg, n=3, batch=64):
  stream = pretraining.make_stream(cfg, global_batch_size=batch, process_index=0, process_count=1)
  try:
    return [next(stream) for _ in range(n)]
  finally:
    getattr(stream, "close", lambda: None)()


def _examples(batch, cfg):
  """(original ids, masked positions) of every example, unpacked, [CLS]/[SEP] included."""
  rows = [{k: v[r] for k, v in batch.items()} for r in range(len(batch["input_ids"]))]
  if cfg.packing:
    rows = packing.unpack(batch, cfg.max_predictions_per_seq, 0)
    rows = [e for row in rows for e in row]
  for e in rows:
    w = np.asarray(e["masked_weights"]).astype(bool)
    ids = np.array(e["input_ids"])[: int(np.sum(e["attention_mask"]))]
    positions = np.asarray(e["masked_positions"])[w]
    ids[positions] = np.asarray(e["masked_ids"])[w]
    yield ids, set(positions.tolist())


def _char_of_tokens(tok, ids: list[int], text: str) -> list[int]:
  """The character of `text` each token of it begins with, from the tokens' own text: one
  ideograph per WordPiece token; the UTF-8 bytes of SentencePiece pieces ("▁" a space)."""
  if isinstance(tok, wordpiece.WordPieceTokenizer):
    assert len(ids) == len(text)
    return list(range(len(text)))
  byte_to_char = np.repeat(np.arange(len(text)), [len(c.encode()) for c in text])
  out, at = [], -1  # bytes of `text` consumed; the leading "▁" stands for no byte of it
  for i in ids:
    piece = tok.id_to_piece(i)
    raw = bytes([int(piece[3:5], 16)]) if piece.startswith("<0x") else piece.encode()
    raw = raw.replace("\u2581".encode(), b"")
    out.append(int(byte_to_char[max(0, at + 1)]) if at + 1 < len(byte_to_char) else len(text))
    at += len(raw)
  return out


def _segmented_documents(path) -> dict[bytes, list[int]]:
  """tokens of each document -> jieba's word number of each token, from the corpus text."""
  tok = wordpiece.load_tokenizer(
      pathlib.Path(path) / records.load_metadata(path)["tokenizer"]["file"]
  )
  out = {}
  for line in pathlib.Path(records.load_metadata(path)["inputs"][0]).read_text().split("\n\n"):
    ids, words = [], []
    for sentence in line.split():
      sentence_ids = tok.encode(sentence)
      chars = _char_of_tokens(tok, sentence_ids, sentence)
      word_of_char = np.repeat(
          np.arange(len(words), len(words) + len(jieba.lcut(sentence))),
          [len(w) for w in jieba.lcut(sentence)],
      )
      ids += sentence_ids
      words += [int(word_of_char[min(c, len(sentence) - 1)]) for c in chars]
    out[np.array(ids, np.int32).tobytes()] = words
  return out


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_every_masked_span_is_whole_segmenter_words(prepared, kind, packed):
  cfg = _cfg(prepared[kind], packing=packed)
  documents = _segmented_documents(prepared[kind])
  seen_words = checked = 0
  for batch in _batches(cfg):
    for ids, masked in _examples(batch, cfg):
      words = documents[ids[1:-1].astype(np.int32).tobytes()]  # the document, whole
      masked_words = {words[p - 1] for p in masked}
      for w in masked_words:  # every token of a masked word is masked, and no other
        assert {p + 1 for p, x in enumerate(words) if x == w} <= masked
      assert masked <= {p + 1 for p, x in enumerate(words) if x in masked_words}
      seen_words += sum(1 for w in masked_words if words.count(w) > 1)
      checked += 1
  assert checked >= 150 and seen_words >= 100  # many words of several tokens were masked


def test_the_share_of_masked_tokens_stays_at_the_rate(prepared):
  whole = inspect.stats(_cfg(prepared["wordpiece"]), 1500)
  chars = inspect.stats(_cfg(prepared["wordpiece"], whole_word_mask=False), 1500)
  assert whole["word_segmenter"] == "jieba" and whole["whole_word_mask"]
  # n = round(0.15 * tokens) predictions, [CLS]/[SEP] counted: a little over 0.15 of the text.
  assert abs(whole["masked_fraction"] - chars["masked_fraction"]) < 0.003
  assert 0.15 <= whole["masked_fraction"] <= 0.17
  assert whole["mean_masked_span_length"] > 1.6 > 1.2 > chars["mean_masked_span_length"] >= 1.0


def test_without_a_segmenter_nothing_changes(prepared):
  seg, plain = prepared["wordpiece"], prepared["plain"]
  assert "word_segmenter" not in records.load_metadata(plain)
  meta = records.load_metadata(seg)
  assert meta["word_segmenter"]["name"] == "jieba"
  # The same documents in the same shards; only the records of the segmented data hold words.
  for s, p in zip(records.load_metadata(seg)["shards"], records.load_metadata(plain)["shards"]):
    assert (s["file"], s["documents"], s["tokens"]) == (p["file"], p["documents"], p["tokens"])
    a = list(records.read_documents(str(pathlib.Path(seg) / s["file"])))
    b = list(records.read_documents(str(pathlib.Path(plain) / p["file"])))
    assert all(np.array_equal(np.concatenate(x), np.concatenate(y)) for x, y in zip(a, b))
  # Whole-word masking off, the segmented data gives the plain data's batches.
  for x, y in zip(
      _batches(_cfg(seg, whole_word_mask=False)), _batches(_cfg(plain, whole_word_mask=False))
  ):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)
  # On, the plain data masks the tokenizer's words (each ideograph one), as before.
  plain_wwm = inspect.stats(_cfg(plain), 500)
  assert plain_wwm["word_segmenter"] is None and plain_wwm["mean_masked_span_length"] < 1.2


@pytest.mark.slow  # imports TensorFlow
def test_the_tf_data_reader_gives_the_same_batches(prepared):
  pytest.importorskip("tensorflow")
  cfg = _cfg(prepared["sentencepiece"], packing=True)
  for x, y in zip(_batches(cfg), _batches(dataclasses.replace(cfg, reader="tf.data"))):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.process  # Grain's worker processes
def test_worker_processes_give_the_same_batches(prepared):
  cfg = _cfg(prepared["wordpiece"], packing=True)
  for x, y in zip(_batches(cfg), _batches(dataclasses.replace(cfg, workers=2))):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_offsets_and_word_lengths_agree_with_encode():
  sp = tok_lib.SentencePieceTokenizer(REPO / "data" / "tokenizer.model")
  seg = segment.load("jieba")
  for text in [
      "我们在北京大学学习自然语言处理。",
      "  BERT模型 2023年，GPU训练 café ΣΑΣ!",
      "",
      "\x00",
  ]:
    ids, lengths = segment.encode_words(sp, seg, text)
    assert ids == sp.encode(text) and sum(lengths) == len(ids) and min(lengths, default=1) >= 1
  # A word of one token, of several ideographs (3 byte pieces each), a Latin word of pieces.
  ids, lengths = segment.encode_words(sp, seg, "我们在北京大学学习")
  assert [sp.decode(ids[a:b]) for a, b in zip(np.cumsum([0] + lengths), np.cumsum(lengths))] == [
      "我们",
      "在",
      "北京大学",
      "学习",
  ]


def test_the_flag_and_its_errors(corpus, tmp_path, capsys, monkeypatch):
  argv = ["prepare", "--input", str(corpus), "--tokenizer", str(REPO / "data" / "tokenizer.model")]
  argv += ["--processes", "1", "--no-progress", "--num-shards", "2"]
  assert cli.main(argv + ["--output", str(tmp_path / "a"), "--word-segmenter", "jieba"]) == 0
  capsys.readouterr()
  assert records.load_metadata(tmp_path / "a")["word_segmenter"]["name"] == "jieba"
  assert cli.main(argv + ["--output", str(tmp_path / "b"), "--word-segmenter", "ltp"]) == 2
  assert "--word-segmenter: invalid choice: 'ltp'" in capsys.readouterr().err
  monkeypatch.setitem(sys.modules, "jieba", None)  # not installed
  assert cli.main(argv + ["--output", str(tmp_path / "c"), "--word-segmenter", "jieba"]) == 2
  err = capsys.readouterr().err
  assert "--word-segmenter jieba: the `jieba` package is not installed" in err
  assert len(err.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
  with pytest.raises(errors.ConfigError, match="PrepareConfig.word_segmenter='x'"):
    prepare_lib.check_config(
        prepare_lib.PrepareConfig(output="o", tokenizer="t", inputs=("a",), word_segmenter="x")
    )


def test_the_pretrain_config_turns_it_on(prepared):
  from bertjax.training import loop, phases
  from experiments import pretrain as pretrain_exp

  c = pretrain_exp.get_config("tiny")
  c.data.path, c.data.workers = prepared["wordpiece"], 1  # in this process
  assert c.data.whole_word_mask is False and c.eval.whole_word_mask is None
  c.data.whole_word_mask = True  # --config.data.whole_word_mask=true
  for split, whole in (("train", True), ("eval", True)):
    spec = loop.make_stream(c, phases.phases(c)[0], None, split=split).builder.spec
    assert (spec.whole_word, spec.segmented) == (whole, whole), split
  c.eval.whole_word_mask = False  # the held-out stream scored on single tokens
  spec = loop.make_stream(c, phases.phases(c)[0], None, split="eval").builder.spec
  assert (spec.whole_word, spec.segmented) == (False, False)
