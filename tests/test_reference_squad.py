"""SQuAD answers against google-research/bert's run_squad, run from the `bert-tensorflow`
package (the `bert_reference` fixture): get_final_text case by case, and the whole decode
(windows, n-best search, answer text) on the same logits."""

import json

import numpy as np
import pytest

from bertjax.data import wordpiece
from bertjax.tasks.squad import data, decode, features

_VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "band",
    "formed",
    "in",
    "1890",
    "##s",
    ",",
    "paris",
    "(",
    "france",
    ")",
    ".",
    "its",
    "founder",
    "edouard",
    "sorin",
    "'",
    "s",
    "friend",
    "left",
    "1895",
    "when",
    "who",
    "did",
    "?",
    "Paris",
    "Sorin",
    "a",
]

# (predicted text, original words): sub-word predictions, case and accents, punctuation, CJK,
# and the cases where the alignment fails and the whole words are the answer.
_CASES = [
    ("1890", "1890s"),
    ("1890", "(1890s)."),
    ("steve smith", "Steve Smith's"),
    ("cafe", "Café!"),
    ("café", "Café!"),
    ("edouard sorin", "Édouard Sorin's"),
    ("sorin", "Édouard Sorin's"),
    ("u . s .", "U.S."),
    ("s", "Sisters"),
    ("京 大", "北京大学"),
    ("paris", "Paris (France)."),
    ("france )", "Paris (France)."),
    ("xyz", "Steve Smith"),  # not found: the whole words
    ("abcd", "ab\u200bcd"),  # a zero-width space is dropped: lengths differ
    ("10", "10\u00a0km"),  # U+00A0 is inside a word for run_squad, a space for the tokenizer
    ("istanbul", "İstanbul"),
]


def _tokenizer(path, lower: bool):
  path.write_text("\n".join(_VOCAB) + "\n")
  return wordpiece.WordPieceTokenizer(path, lower_case=lower)


@pytest.mark.parametrize("lower", [True, False])
def test_get_final_text_as_the_reference(bert_reference, tmp_path, lower):
  rs = bert_reference("run_squad")
  tok = _tokenizer(tmp_path / "vocab.txt", lower)
  for pred, orig in _CASES + [("Paris", "Paris (France)."), ("Sorin", "Édouard Sorin's")]:
    assert features.get_final_text(pred, orig, tok) == rs.get_final_text(pred, orig, lower), (
        pred,
        orig,
    )
  assert features.get_final_text("1890", "1890s", tok) == "1890"


def _squad_file(path):
  paragraphs = [
      dict(
          context="The Band formed in the 1890s, in Paris (France). Its founder, Édouard "
          "Sorin's friend, left in 1895.",
          qas=[
              dict(
                  id="when",
                  question="When did the band form?",
                  answers=[dict(text="1890s", answer_start=23)],
              ),
              dict(
                  id="who",
                  question="Who formed the band?",
                  answers=[dict(text="Édouard Sorin", answer_start=62)],
              ),
          ],
      ),
      dict(
          context="Its  founder left\tParis in 1895 ; the band formed in 1890s France .",
          qas=[
              dict(
                  id="left",
                  question="When did its founder left?",
                  answers=[dict(text="1895", answer_start=27)],
              )
          ],
      ),
  ]
  path.write_text(json.dumps(dict(version="1.1", data=[dict(title="t", paragraphs=paragraphs)])))


def _reference_predictions(rs, path, vocab, logits, tmp_path, max_seq_len, stride, version):
  rs.FLAGS.version_2_with_negative = version == "2.0"
  tok = rs.tokenization.FullTokenizer(str(vocab), do_lower_case=True)
  examples = rs.read_squad_examples(str(path), is_training=False)
  feats = []
  rs.convert_examples_to_features(examples, tok, max_seq_len, stride, 16, False, feats.append)
  start, end = logits
  results = [
      rs.RawResult(f.unique_id, [float(x) for x in start[k]], [float(x) for x in end[k]])
      for k, f in enumerate(feats)
  ]
  out = [tmp_path / n for n in ("predictions.json", "nbest.json", "null_odds.json")]
  rs.write_predictions(examples, feats, results, 20, 30, True, *map(str, out))
  rs.FLAGS.version_2_with_negative = False
  return feats, [json.loads(p.read_text()) if p.exists() else None for p in out]


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_decode_as_the_reference_on_the_same_logits(bert_reference, tmp_path, version):
  rs = bert_reference("run_squad")
  path, vocab = tmp_path / "dev.json", tmp_path / "vocab.txt"
  _squad_file(path)
  tok = _tokenizer(vocab, True)
  examples, skipped = data.read(str(path), version, training=False)
  assert not skipped
  max_seq_len, stride = 32, 5
  ours = features.build(tok, examples, max_seq_len, stride, 16, training=False)
  rng = np.random.default_rng(0)
  # Multiples of 1/16: sums are exact in float32 and float64, so both rank spans alike.
  start, end = (rng.integers(0, 4000, (len(ours), max_seq_len)) / 16 for _ in range(2))
  # "when": the best span is the piece "1890" alone, which ends inside the word "1890s,".
  w = int(np.flatnonzero(ours.example_index_N == 0)[0])
  at = int(np.flatnonzero(ours.arrays["input_ids"][w] == tok.piece_to_id("1890"))[0])
  start[w, at] = end[w, at] = 1000.0
  ref_feats, (ref_pred, ref_nbest, ref_odds) = _reference_predictions(
      rs, path, vocab, (start, end), tmp_path, max_seq_len, stride, version
  )
  assert len(ref_feats) == len(ours) > len(examples)  # several windows per question
  for k, f in enumerate(ref_feats):
    assert ours.arrays["input_ids"][k].tolist() == f.input_ids
  got = decode.decode(
      examples, ours, start.astype(np.float32), end.astype(np.float32), version, tok
  )
  assert got.predictions["when"] == "1890" == ref_pred["when"]
  assert got.predictions == ref_pred
  if version == "1.1":
    for qid, nbest in ref_nbest.items():
      assert [d["text"] for d in got.nbest[qid]] == [d["text"] for d in nbest]
      np.testing.assert_allclose(
          [d["probability"] for d in got.nbest[qid]], [d["probability"] for d in nbest], rtol=1e-5
      )
  else:
    assert got.null_odds == pytest.approx(ref_odds)
