"""Data and tokenization against google-research/bert's own code (run, not copied).

The `bert_reference` fixture imports `create_pretraining_data.py` and `tokenization.py` from the
`bert-tensorflow` package; each test runs them and our code on the same input.
"""

import itertools
import random

import numpy as np
import pytest

from bertjax.data import masking, prepare, pretraining, wordpiece

# Surrounding whitespace on some lines: google's load_vocab strips it ("fox", "dog").
_VOCAB_LINES = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "[unused0]",
    "the",
    "The",
    "quick",
    "brown",
    "fox \t",
    " dog",
    "jump",
    "##s",
    "##ed",
    "over",
    ".",
    ",",
    "!",
    "'",
    "?",
    "-",
    "(",
    ")",
    "$",
    '"',
    "¿",
    "«",
    "»",
    "caf",
    "##e",
    "##é",
    "café",
    "cafe",
    "naive",
    "na",
    "##ï",
    "##ve",
    "über",
    "uber",
    "ab",
    "##ab",
    "x",
    "##y",
    "y",
    "我",
    "爱",
    "北",
    "京",
    "中",
    "国",
    "。",
    "，",
    "こ",
    "##ん",
    "##に",
    "##ち",
    "##は",
    "東",
    "日",
    "本",
    "مرحبا",
    "بالعالم",
    "привет",
    "мир",
    "Привет",
    "##ы",
]

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK (brown) fox jumped! ¿dog? «café» naïve Über $5-the",
    "我爱北京。中国，日本東京 こんにちは",
    "مرحبا بالعالم привет мир Привет, миры",
    "x\x01y fox\u200bdog the\x7fdog tab\there new\nline cr\rret nbsp\u00a0x \u2028x\u3000y",
    "\ue000 x\ue000y \U000f0001 \u0378 fox",  # private use and unassigned: kept, as [UNK]
    "ab" * 75 + " " + "ab" * 50 + "a" + " " + "ab" * 101,  # 150, 101 and 202 characters
    "fox\x00dog the\ufffddog ''' --- ...",
    "",
]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("ref_wp") / "vocab.txt"
  path.write_text("\n".join(_VOCAB_LINES) + "\n", encoding="utf-8")
  return path


@pytest.mark.parametrize("lower_case", [False, True])
def test_wordpiece_matches_reference_full_tokenizer(bert_reference, vocab_file, lower_case):
  tok = bert_reference("tokenization")
  ref = tok.FullTokenizer(str(vocab_file), do_lower_case=lower_case)
  ours = wordpiece.WordPieceTokenizer(vocab_file, lower_case=lower_case)
  assert ours.vocab_size == len(ref.vocab)
  for text in TEXTS:
    want = ref.tokenize(text)
    assert ours.tokenize(text) == want, text
    assert ours.encode(text) == ref.convert_tokens_to_ids(want), text
  # The sample exercises what differs from transformers: kept private-use characters, the
  # 200-character word limit and stripped vocab lines.
  assert ref.tokenize(TEXTS[5]).count("[UNK]") == 4
  assert ref.tokenize(TEXTS[6]) == ["ab"] + ["##ab"] * 74 + ["[UNK]", "[UNK]"]
  assert "fox" in ref.tokenize(TEXTS[0]) and "dog" in ref.tokenize(TEXTS[0])


def _framed(length: int) -> list[str]:
  """[CLS] A [SEP] B [SEP] of `length` tokens ([CLS] A [SEP] below 5)."""
  if length < 5:
    return ["[CLS]"] + ["a"] * (length - 2) + ["[SEP]"]
  a = (length - 3) // 2
  return ["[CLS]"] + ["a"] * a + ["[SEP]"] + ["b"] * (length - 3 - a) + ["[SEP]"]


@pytest.mark.parametrize("max_predictions", [20, 80])
def test_mask_count_matches_reference_at_every_length(bert_reference, max_predictions):
  cpd = bert_reference("create_pretraining_data")
  rng = random.Random(0)
  words = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3, "a": 5, "b": 6}
  lengths = range(3, 513)
  want = [
      len(cpd.create_masked_lm_predictions(_framed(n), 0.15, max_predictions, list(words), rng)[1])
      for n in lengths
  ]
  ids = np.zeros((len(lengths), 512), np.int32)
  for row, n in enumerate(lengths):
    ids[row, :n] = [words[t] for t in _framed(n)]
  spec = masking.MaskSpec(
      vocab_size=8, max_predictions=max_predictions, pad_id=0, cls_id=1, sep_id=2, mask_id=3
  )
  got = masking.mask_batch(ids, masking.key(7, np.arange(len(lengths))), spec)
  assert got["masked_weights"].sum(1).tolist() == want


NUM_DOCS = 201  # with shuffle_buffer 25, the last block holds a single document


def _corpus_docs() -> list[list[list[str]]]:
  """Document k: 2-6 sentences of 4-12 tokens, every token "dk", so any token names it."""
  return [[[f"d{k}"] * (4 + (7 * k + s) % 9) for s in range(2 + k % 5)] for k in range(NUM_DOCS)]


def _notnext_pairs_ours(tmp_path) -> list[tuple[int, int]]:
  """(document of A, document of B) of NotNext examples of our stream, 8 epochs."""
  docs = _corpus_docs()
  pieces = list(wordpiece.SPECIAL_PIECES) + [f"d{k}" for k in range(NUM_DOCS)]
  (tmp_path / "vocab.txt").write_text("\n".join(pieces) + "\n")
  (tmp_path / "corpus.txt").write_text(
      "\n\n".join("\n".join(" ".join(s) for s in d) for d in docs) + "\n"
  )
  prepare.prepare(
      prepare.PrepareConfig(
          output=str(tmp_path / "out"),
          tokenizer=str(tmp_path / "vocab.txt"),
          inputs=(str(tmp_path / "corpus.txt"),),
          num_shards=1,
          eval_fraction=0,
          processes=1,
          progress=False,
      )
  )
  cfg = pretraining.InputConfig(
      path=str(tmp_path / "out"),
      seq_len=64,
      max_predictions_per_seq=10,
      seed=1,
      shuffle_buffer=25,
      reader="python",
  )
  stream = pretraining.make_stream(cfg, global_batch_size=64, process_index=0, process_count=1)
  doc_of = np.full(len(pieces), -1)
  doc_of[len(wordpiece.SPECIAL_PIECES) :] = np.arange(NUM_DOCS)
  pairs = []
  while stream.get_state()["epoch"] < 8:
    b = next(stream)
    ids = b["input_ids"].copy()  # the original tokens back at the masked positions
    r, c = np.nonzero(b["masked_weights"])
    ids[r, b["masked_positions"][r, c]] = b["masked_ids"][r, c]
    for row in np.flatnonzero(b["nsp_labels"] == 1):
      real, types = b["attention_mask"][row] == 1, b["token_type_ids"][row]
      a = set(doc_of[ids[row][real & (types == 0)][1:-1]])
      b_ = set(doc_of[ids[row][real & (types == 1)][:-1]])
      assert len(a) == 1 and len(b_) == 1
      pairs.append((int(a.pop()), int(b_.pop())))
  return pairs


def _notnext_pairs_reference(cpd) -> list[tuple[int, int]]:
  """The same for create_instances_from_document over the shuffled documents, 8 times."""
  rng = random.Random(12345)
  docs = _corpus_docs()
  rng.shuffle(docs)  # as create_training_instances does
  vocab_words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"d{k}" for k in range(NUM_DOCS)]
  pairs = []
  for _, i in itertools.product(range(8), range(len(docs))):
    for inst in cpd.create_instances_from_document(docs, i, 64, 0.1, 0.15, 10, vocab_words, rng):
      if not inst.is_random_next:
        continue
      tokens = list(inst.tokens)
      for pos, label in zip(inst.masked_lm_positions, inst.masked_lm_labels):
        tokens[pos] = label
      seg = np.array(inst.segment_ids)
      a = {int(t[1:]) for t, s in zip(tokens, seg) if s == 0 and t.startswith("d")}
      b = {int(t[1:]) for t, s in zip(tokens, seg) if s == 1 and t.startswith("d")}
      assert len(a) == 1 and len(b) == 1
      pairs.append((a.pop(), b.pop()))
  return pairs


def _ks(x: np.ndarray, y: np.ndarray) -> float:
  """Two-sample Kolmogorov-Smirnov statistic."""
  grid = np.union1d(x, y)
  cdf = lambda v: np.searchsorted(np.sort(v), grid, side="right") / len(v)  # noqa: E731
  return float(np.abs(cdf(x) - cdf(y)).max())


@pytest.mark.slow
def test_notnext_comes_from_a_random_other_document_as_in_reference(bert_reference, tmp_path):
  ours = np.array(_notnext_pairs_ours(tmp_path))
  ref = np.array(_notnext_pairs_reference(bert_reference("create_pretraining_data")))
  assert len(ours) > 500 and len(ref) > 500
  # Never the current document (the reference retries 10 times, so it almost never is).
  assert (ours[:, 0] != ours[:, 1]).all()
  assert (ref[:, 0] != ref[:, 1]).mean() > 0.99
  d_ours, d_ref = (np.abs(p[:, 0] - p[:, 1]) for p in (ours, ref))
  # Uniform random pairs of documents: mean |i - j| ~ N/3; neighbours (|i - j| <= 10) ~ 10%.
  for d in (d_ours, d_ref):
    assert 0.28 < d.mean() / NUM_DOCS < 0.39
    assert (d <= 10).mean() < 0.2
  assert _ks(d_ours, d_ref) < 0.1
  # Sources spread over the corpus: most documents are a NotNext source at some point.
  assert len(set(ours[:, 1])) > 0.8 * NUM_DOCS


@pytest.mark.parametrize("lower_case", [False, True])
def test_tf_op_matches_reference_full_tokenizer(bert_reference, vocab_file, lower_case):
  tf = pytest.importorskip("tensorflow")
  pytest.importorskip("tensorflow_text")
  ref = bert_reference("tokenization").FullTokenizer(str(vocab_file), do_lower_case=lower_case)
  got = wordpiece.wordpiece_tf_tokenize(vocab_file, lower_case)(tf.constant(TEXTS)).to_list()
  assert got == [ref.convert_tokens_to_ids(ref.tokenize(t)) for t in TEXTS]
