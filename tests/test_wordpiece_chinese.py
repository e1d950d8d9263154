"""A Chinese WordPiece vocabulary: `tokenizer train --kind wordpiece` writes a BERT vocab.txt with
every CJK ideograph its own entry, and `WordPieceTokenizer` gives transformers' ids for it on
mixed text generated here (hypothesis) from character classes: ideographs (in the vocab and
not, the extension blocks too), Latin words, accents, digits, full-width forms and punctuation,
ASCII punctuation, kana, emoji (with skin tones, variation selectors and ZWJ sequences),
control and format characters, and whitespace of several kinds. The tf.data op
(`wordpiece_tf_tokenize`) gives the same ids on them.

Two classes are left out on purpose, where this tokenizer follows google-research/bert and
transformers does not (wordpiece.py's docstring): private-use characters, which transformers
deletes, and words of 101-200 characters (texts here are at most 80 characters).
"""

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertjax import cli, errors
from bertjax.data import wordpiece, wordpiece_train

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from transformers.models.bert import tokenization_bert_legacy  # noqa: E402

# Ideographs the training corpus uses, and ones it never does (so [UNK] words occur too):
# the basic block, extension A (U+3400), extension B (U+20000) and compatibility (U+F900).
COMMON = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产"
RARE = "龘齉爨麤\u3400\u3401\u4db5\U00020000\U00020001\U0002a6d6\uf900\uf901\u9fa5"
LATIN = ["the", "bert", "model", "Beijing", "Python", "GPU", "token", "data", "Transformer", "mask"]
ACCENTED = "éèÅñüçøßİ"
DIGITS = "0123456789０１２３４５６７８９"
FULLWIDTH = "，。！？；：「」『』（）、《》〈〉…—·～【】“”‘’％＃＠ＡＢＣａｂｃ"
ASCII_PUNCT = ".,!?'\"$^`~@#%&*()-_=+[]{}|\\/:;<>"
KANA = "こんにちはカタカナ"
EMOJI = ["😀", "🎉", "👍🏽", "❤️", "👨‍👩‍👧", "🇨🇳", "🤖", "☕"]
CONTROL = "\x00\x01\x07\x1b\x7f\x85\u200b\u200d\ufeff\u00ad\u2060\ufffd"
SPACE = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\u00a0", "\u2028"]


def _corpus_lines(n: int = 300, seed: int = 0) -> list[str]:
  rng = random.Random(seed)
  lines = []
  for _ in range(n):
    parts = []
    for _ in range(rng.randint(3, 12)):
      kind = rng.random()
      if kind < 0.55:
        parts.append("".join(rng.choices(COMMON, k=rng.randint(1, 6))))
      elif kind < 0.75:
        parts.append(" " + rng.choice(LATIN) + " ")
      elif kind < 0.85:
        parts.append(str(rng.randint(0, 3000)))
      elif kind < 0.95:
        parts.append(rng.choice(FULLWIDTH[:20]))
      else:
        parts.append(rng.choice(EMOJI[:3]))
    lines.append("".join(parts))
  return lines


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("zh") / "zh.txt"
  path.write_text("\n".join(_corpus_lines()) + "\n", encoding="utf-8")
  return path


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def trained(request, corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("vocab") / "zh-vocab"
  tok = wordpiece_train.train_wordpiece([str(corpus)], str(out), lower_case=request.param)
  fast = transformers.BertTokenizer.from_pretrained(str(out))
  slow = tokenization_bert_legacy.BertTokenizerLegacy(
      str(out / "vocab.txt"), do_lower_case=request.param
  )
  return out, tok, fast, slow, wordpiece.read_vocab(out / "vocab.txt")


def test_every_ideograph_of_the_corpus_is_its_own_entry(trained, corpus):
  out, tok, _, _, _ = trained
  pieces = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
  assert pieces[:5] == list(wordpiece.SPECIAL_PIECES)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  text = corpus.read_text(encoding="utf-8")
  ideographs = {ch for ch in text if wordpiece.is_cjk(ch)}
  assert ideographs and ideographs <= set(pieces)
  # Each ideograph is a word, so its piece starts one (whole-word masking without a segmenter).
  assert all(tok.is_word_start(tok.piece_to_id(ch)) for ch in ideographs)
  assert len(set(pieces)) == len(pieces)
  # The vocabulary is more than characters: merged Latin words and ## continuations.
  assert "##" + "e" in pieces and any(len(p) > 3 and p.isascii() and p.isalpha() for p in pieces)
  config = json.loads((out / "tokenizer_config.json").read_text())
  assert config["do_lower_case"] is tok.lower_case
  assert wordpiece.load_tokenizer(out).lower_case is tok.lower_case
  assert tok.encode(text) and tok.unk_id not in tok.encode(text.replace("\n", " ")[:2000])


def _piece_words(pieces):
  """Words built from the vocabulary's own pieces: long matches and ## continuations."""
  starts = [p for p in pieces[5:] if not p.startswith("##")]
  rest = [p[2:] for p in pieces if p.startswith("##")]
  return st.builds(
      lambda a, b, upper: (a + "".join(b)).upper() if upper else a + "".join(b),
      st.sampled_from(starts),
      st.lists(st.sampled_from(rest), max_size=3),
      st.booleans(),
  )


def _mixed_text(pieces):
  atom = st.one_of(
      st.sampled_from(COMMON + RARE),
      st.sampled_from(LATIN),
      st.sampled_from(ACCENTED),
      st.text(st.sampled_from(DIGITS), min_size=1, max_size=6),
      st.sampled_from(FULLWIDTH),
      st.sampled_from(ASCII_PUNCT),
      st.sampled_from(KANA),
      st.sampled_from(EMOJI),
      st.sampled_from(CONTROL),
      st.sampled_from(SPACE),
      _piece_words(pieces),
  )
  return st.lists(atom, max_size=30).map("".join).map(lambda t: t[:80])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_ids_equal_transformers_bert_tokenizer_on_mixed_text(trained, data):
  _, tok, fast, slow, pieces = trained
  text = data.draw(_mixed_text(pieces), label="text")
  ours = tok.encode(text)
  assert ours == fast.encode(text, add_special_tokens=False), (text, tok.tokenize(text))
  assert ours == slow.encode(text, add_special_tokens=False), (text, tok.tokenize(text))
  # The offsets a word segmenter aligns with (segment.py): the same ids, each at a character
  # its word begins with, in order.
  ids, offsets = tok.encode_with_offsets(text)
  assert ids == ours and offsets == sorted(offsets) and len(offsets) == len(ids)
  assert all(0 <= o < len(text) for o in offsets)


def test_the_mixed_texts_exercise_every_rule(trained):
  # One fixed text from each class: pieces found, [UNK], ## continuations and dropped characters.
  _, tok, fast, _, _ = trained
  text = "我在Beijing用GPU训练bertmodel，２０２３年🎉\x00\u200b龘 tokens！"
  ids = tok.encode(text)
  assert ids == fast.encode(text, add_special_tokens=False)
  pieces = tok.tokenize(text)
  assert tok.unk_id in ids and any(p.startswith("##") for p in pieces)
  assert "我" in pieces and "，" in pieces and "\x00" not in "".join(pieces)


def test_training_is_deterministic(corpus, tmp_path):
  a = wordpiece_train.train_wordpiece([str(corpus)], str(tmp_path / "a"))
  b = wordpiece_train.train_wordpiece([str(corpus)], str(tmp_path / "b"))
  assert a.sha256 == b.sha256


def test_cli_train_and_its_errors(corpus, tmp_path, capsys):
  out = tmp_path / "zh"
  argv = ["tokenizer", "train", "--kind", "wordpiece", "--input", str(corpus), "--output", str(out)]
  assert cli.main(argv) == 0
  said = capsys.readouterr()
  assert f"wrote {out}/vocab.txt: vocab_size" in said.out and "CJK ideographs" in said.err
  size = wordpiece.WordPieceTokenizer(out / "vocab.txt").vocab_size
  # An existing vocab.txt; a size below the characters' entries; SentencePiece-only flags.
  for extra, needle in (
      ([], "vocab.txt already exists — pass --overwrite"),
      (["--overwrite", "--vocab-size", "20"], "--vocab-size 20 is less than the"),
      (["--overwrite", "--vocab-size", str(size + 1000)], f"use --vocab-size <= {size}"),
      (["--model-type", "bpe"], "--model-type: a SentencePiece option"),
      (["--character-coverage", "0.99"], "--character-coverage: a SentencePiece option"),
  ):
    assert cli.main(argv + extra) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
  assert wordpiece.WordPieceTokenizer(out / "vocab.txt").vocab_size == size
  # An explicit size between the characters' entries and the corpus's most is exact.
  assert cli.main(argv + ["--overwrite", "--vocab-size", str(size - 5)]) == 0
  assert wordpiece.WordPieceTokenizer(out / "vocab.txt").vocab_size == size - 5
  assert cli.main(["tokenizer", "train", "--input", str(corpus), "--output", "x", "--cased"]) == 2
  assert "--cased: a WordPiece option" in capsys.readouterr().err


@pytest.mark.slow  # imports TensorFlow
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_tf_data_op_gives_the_same_ids(trained, data):
  tf = pytest.importorskip("tensorflow")
  pytest.importorskip("tensorflow_text")
  out, tok, _, _, pieces = trained
  op = _tf_op(out / "vocab.txt", tok.lower_case)
  text = data.draw(_mixed_text(pieces), label="text")
  assert op(tf.constant(text)).numpy().tolist() == tok.encode(text), tok.tokenize(text)


_TF_OPS = {}


def _tf_op(path, lower_case):
  if (path, lower_case) not in _TF_OPS:
    _TF_OPS[path, lower_case] = wordpiece.wordpiece_tf_tokenize(path, lower_case)
  return _TF_OPS[path, lower_case]
