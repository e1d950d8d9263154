"""WordPiece: the Python tokenizer and the tf.data op both equal transformers' BertTokenizer."""

import json
import pathlib

import numpy as np
import pytest

from bertjax.data import wordpiece

# Small enough to read, large enough that every rule (casing, accents, CJK, punctuation,
# "##" continuations, [UNK] for unsplittable words) is exercised on the texts below.
_VOCAB = """[PAD] [UNK] [CLS] [SEP] [MASK] [unused0]
the The quick Quick brown fox jump ##s ##ed over lazy dog . , ! ' ? - ( ) $ "
un ##aff ##able run ##ning caf ##e ##é cafe café naive na ##ï ##ve resume res ##um
Å ##ng ##str ##ö ##m angstrom ang ##trom über uber ü ##ber
我 爱 北 京 天 安 门 中 国 人 。 ， こ ##ん ##に ##ち ##は 한 ##국 1 ##9 ##8 ##4 19 ##84
""".split()

TEXTS = [
    "The quick brown fox jumped over the lazy dog.",
    "the QUICK brown fox jumps!  Unaffable running dogs?",
    "Café résumé naïve Ångström über (uber) -- $19.84",
    "我爱北京天安门。中国人，quick fox",
    "こんにちは 한국 1984",
    "\tThe\u00a0quick\u3000brown\nfox\r\n",  # tab, NBSP, ideographic space, CRLF
    "fox\x00es run\u200bning the\ufffddog",  # NUL, zero-width space (Cf), U+FFFD: deleted
    "xyzzy unaffableness the-dog's 'quick'",  # unknown words -> [UNK]
    "",
]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("wp") / "vocab.txt"
  path.write_text("\n".join(_VOCAB) + "\n", encoding="utf-8")
  return path


def _hf_slow(vocab_file, lower_case):
  legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
  return legacy.BertTokenizerLegacy(str(vocab_file), do_lower_case=lower_case)


@pytest.mark.parametrize("lower_case", [False, True])
def test_python_matches_transformers_slow(vocab_file, lower_case):
  ours = wordpiece.WordPieceTokenizer(vocab_file, lower_case=lower_case)
  hf = _hf_slow(vocab_file, lower_case)
  for text in TEXTS:
    want = hf.encode(text, add_special_tokens=False)
    assert ours.encode(text) == want, (text, ours.tokenize(text), hf.tokenize(text))
  # The texts really exercise casing and accents: the two modes disagree on some of them.
  cased = wordpiece.WordPieceTokenizer(vocab_file, lower_case=not lower_case)
  assert any(ours.encode(t) != cased.encode(t) for t in TEXTS)


@pytest.mark.parametrize("lower_case", [False, True])
def test_python_matches_transformers_fast(vocab_file, lower_case):
  transformers = pytest.importorskip("transformers")
  hf = transformers.BertTokenizer.from_pretrained(str(vocab_file.parent), do_lower_case=lower_case)
  ours = wordpiece.WordPieceTokenizer(vocab_file, lower_case=lower_case)
  for text in TEXTS:
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text


@pytest.mark.slow
@pytest.mark.parametrize("lower_case", [False, True])
def test_tf_op_matches_python(vocab_file, lower_case):
  tf = pytest.importorskip("tensorflow")
  pytest.importorskip("tensorflow_text")
  ours = wordpiece.WordPieceTokenizer(vocab_file, lower_case=lower_case)
  tokenize = wordpiece.wordpiece_tf_tokenize(vocab_file, lower_case)
  got = tokenize(tf.constant(TEXTS)).to_list()
  assert got == [ours.encode(t) for t in TEXTS]
  assert tokenize(tf.constant(TEXTS[0])).numpy().tolist() == ours.encode(TEXTS[0])
  # Inside a tf.data graph (parallel map), as the input pipeline uses it.
  ds = tf.data.Dataset.from_tensor_slices(TEXTS).map(
      tokenize, num_parallel_calls=2, deterministic=True
  )
  assert [x.numpy().tolist() for x in ds] == got


def test_special_ids_and_word_starts(vocab_file):
  tok = wordpiece.WordPieceTokenizer(vocab_file, lower_case=True)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.vocab_size == len(_VOCAB)
  ids = tok.encode("unaffable fox")
  assert [tok.id_to_piece(i) for i in ids] == ["un", "##aff", "##able", "fox"]
  assert [tok.is_word_start(i) for i in ids] == [True, False, False, True]
  assert tok.word_start_table()[ids[1]] is False
  assert tok.decode([tok.cls_id] + ids + [tok.sep_id, tok.pad_id]) == "unaffable fox"
  assert len(tok.sha256) == 64


def test_special_ids_follow_the_vocab(tmp_path):
  # Google's released vocabularies put [PAD] at 0 and [UNK], [CLS], [SEP], [MASK] at 100-103.
  pieces = (
      ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]
  )
  (tmp_path / "vocab.txt").write_text("\n".join(pieces) + "\n")
  tok = wordpiece.WordPieceTokenizer(tmp_path / "vocab.txt")
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
  assert tok.encode("a b") == [104, 100]


def test_lower_case_inference(tmp_path, vocab_file):
  # Our test vocab has capitalised pieces: cased.
  assert wordpiece.infer_lower_case(vocab_file) is False
  (tmp_path / "vocab.txt").write_text("\n".join(wordpiece.SPECIAL_PIECES + ("a", "b")) + "\n")
  assert wordpiece.infer_lower_case(tmp_path / "vocab.txt") is True
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
  assert wordpiece.infer_lower_case(tmp_path / "vocab.txt") is False


def test_load_tokenizer_picks_the_kind(vocab_file, tmp_path):
  assert isinstance(wordpiece.load_tokenizer(vocab_file), wordpiece.WordPieceTokenizer)
  assert isinstance(wordpiece.load_tokenizer(vocab_file.parent), wordpiece.WordPieceTokenizer)
  sp = wordpiece.load_tokenizer(pathlib.Path(__file__).parents[1] / "data" / "tokenizer.model")
  from bertjax.data.tokenizer import Tokenizer

  assert isinstance(sp, Tokenizer)
  with pytest.raises(wordpiece.WordPieceError, match="unknown tokenizer type"):
    wordpiece.load_tokenizer(tmp_path / "x.bin")
  from bertjax.data import tokenizer as tokenizer_lib

  with pytest.raises(tokenizer_lib.TokenizerError, match="x.json: tokenizer file not found"):
    wordpiece.load_tokenizer(tmp_path / "x.json")  # transformers' tokenizer.json: its reader


def test_errors_name_the_file(tmp_path):
  with pytest.raises(wordpiece.WordPieceError, match="vocab.txt: vocabulary not found"):
    wordpiece.WordPieceTokenizer(tmp_path / "vocab.txt")
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
  with pytest.raises(
      wordpiece.WordPieceError, match=r"vocab.txt: special token \[CLS\] is missing"
  ):
    wordpiece.WordPieceTokenizer(tmp_path / "vocab.txt")
