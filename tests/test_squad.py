"""SQuAD: the official EM/F1, the reader, windows with doc stride, n-best decoding, fine-tuning."""

import json
import os
import random

import numpy as np
import pytest
import flax.linen as nn

from bertjax.tasks.squad import data, decode, evaluate, features

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER = os.path.join(REPO, "data", "tokenizer.model")
FIXTURES = os.path.join(REPO, "tests", "fixtures", "squad")

_WP_VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "(",
    ")",
    ".",
    ",",
    "?",
    "the",
    "university",
    "was",
    "found",
    "##ed",
    "in",
    "18",
    "##42",
    "by",
    "father",
    "edward",
    "sorin",
    "indiana",
    "when",
    "who",
    "it",
    "a",
    "long",
    "story",
    "about",
]


@pytest.fixture(scope="module")
def wordpiece_tok(tmp_path_factory):
  from bertjax.data import wordpiece

  path = tmp_path_factory.mktemp("wp") / "vocab.txt"
  path.write_text("\n".join(_WP_VOCAB) + "\n")
  return wordpiece.WordPieceTokenizer(path, lower_case=True)


# ------------------------------------------------------------------------- official scoring


def test_normalize_answer_as_the_official_script():
  assert evaluate.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
  assert evaluate.normalize_answer("an apple a day") == "apple day"
  assert evaluate.normalize_answer("theatre") == "theatre"  # articles only as whole words
  assert evaluate.normalize_answer("U.S.A.") == "usa"


def test_em_f1_hand_computed_with_several_gold_answers():
  gold = {
      "q1": ["Denver Broncos", "the Denver Broncos"],
      "q2": ["an apple"],
      "q3": ["Saint Bernadette Soubirous"],
      "q4": ["1842"],
  }
  preds = {"q1": "Broncos", "q2": "Apple.", "q3": "Bernadette, the saint"}  # q4 unanswered
  # q1: pred {broncos} vs gold {denver, broncos}: P 1, R 1/2 -> F1 2/3, EM 0.
  # q2: "apple" == "apple" after normalization: EM 1, F1 1.
  # q3: pred {bernadette, saint} vs gold {saint, bernadette, soubirous}: P 1, R 2/3 -> 0.8.
  # q4: no prediction scores 0.
  got = evaluate.score(gold, preds, "1.1")
  assert got["exact"] == pytest.approx(100 * 1 / 4)
  assert got["f1"] == pytest.approx(100 * (2 / 3 + 1 + 0.8 + 0) / 4)
  assert got["total"] == 4
  # The best of the gold answers counts: "in 1842" vs gold ["1842", "in 1842"] is exact.
  assert evaluate.score({"q": ["1842", "in 1842"]}, {"q": "in 1842"}, "1.1")["exact"] == 100.0
  assert evaluate.f1_v1("1842", "") == 0.0


def test_v2_no_answer_scoring_and_breakdown():
  gold = {"has1": ["Denver Broncos"], "has2": ["1842"], "no1": [], "no2": [""]}
  preds = {"has1": "Denver", "has2": "", "no1": "", "no2": "something"}
  got = evaluate.score(gold, preds, "2.0")
  # has1: EM 0, F1 2/3; has2: "" vs an answer 0/0; no1: "" vs no answer 1/1; no2: 0/0.
  assert got["exact"] == pytest.approx(100 * 1 / 4)
  assert got["f1"] == pytest.approx(100 * (2 / 3 + 1) / 4)
  assert (got["HasAns_total"], got["NoAns_total"]) == (2, 2)
  assert got["HasAns_exact"] == 0.0 and got["HasAns_f1"] == pytest.approx(100 * (2 / 3) / 2)
  assert got["NoAns_exact"] == 50.0 and got["NoAns_f1"] == 50.0


def test_v2_best_threshold():
  gold = {"a": ["x"], "b": [], "c": ["y"]}
  spans = {"a": "x", "b": "z", "c": "w"}  # a right, b should abstain, c wrong
  odds = {"a": -2.0, "b": 1.0, "c": 3.0}
  got = evaluate.score(gold, {"a": "x", "b": "", "c": ""}, "2.0", odds, spans)
  # Answer when odds <= t: t < -2 -> 1/3 (only b right); t = -2 -> 2/3; higher t adds b/c wrong.
  assert got["best_exact"] == pytest.approx(200 / 3) and got["best_exact_thresh"] == -2.0
  assert got["exact"] == pytest.approx(200 / 3)


# ------------------------------------------------------------------------------------ reader


def test_reader_skips_bad_questions_naming_file_and_id():
  path = os.path.join(FIXTURES, "train-v1.1.json")
  examples, skipped = data.read(path, "1.1", training=True)
  assert [e.qid for e in examples] == ["q-founded", "q-founder"]
  assert examples[1].answer_text == "Father Edward Sorin" and examples[1].answer_start == 39
  text = "\n".join(skipped)
  assert len(skipped) == 5, text
  assert "train-v1.1.json: question q-bad-offset: answer_start 3 points at" in text
  assert "train-v1.1.json: question q-no-answers: no answers" in text
  assert 'question data[0].paragraphs[0].qas[4]: no "id"' in text
  assert "question q-founded: duplicate id" in text
  assert "question q-empty-context: its paragraph has no context" in text
  with pytest.raises(data.SquadDataError, match='not-squad.json: field "data" is missing'):
    data.read(os.path.join(FIXTURES, "not-squad.json"), "1.1", True)


def test_reader_names_the_line_of_malformed_json(tmp_path):
  path = tmp_path / "train.json"
  path.write_text('{"data": [\n  {"paragraphs": [}\n]}')
  with pytest.raises(data.SquadDataError, match=r"train.json:2: not valid JSON \(Expecting value"):
    data.read(str(path), "1.1", True)
  path.write_bytes(b'{"data": "\xff"}')
  with pytest.raises(data.SquadDataError, match=r"train.json: not UTF-8 text \(byte 10\)"):
    data.read(str(path), "1.1", True)


def test_reader_v2_impossible_questions():
  examples, skipped = data.read(os.path.join(FIXTURES, "dev-v2.0.json"), "2.0", training=False)
  assert not skipped
  assert [(e.qid, e.is_impossible, e.answers) for e in examples] == [
      ("d-founded", False, ["1842", "in 1842"]),
      ("d-closed", True, []),
      ("d-state", False, ["Indiana"]),
  ]
  _, skipped = data.read(os.path.join(FIXTURES, "dev-v2.0.json"), "1.1", training=False)
  assert skipped == [
      "dev-v2.0.json: question d-closed: is_impossible is set, which v1.1 does "
      "not have (read the file as version 2.0)"
  ]


# ---------------------------------------------------------------------------------- features


def _check_windows_recover_answers(tok, examples, feats):
  """Every training target, decoded as a prediction would be, is the answer's own text."""
  windows_with_answer = 0
  for f in range(len(feats)):
    ex = examples[feats.example_index_N[f]]
    s, e = feats.arrays["start_positions"][f], feats.arrays["end_positions"][f]
    if s == 0:
      continue
    windows_with_answer += 1
    unit = feats.token_unit_NxL[f]
    text = features.answer_text(
        tok,
        ex.context,
        feats.unit_spans[feats.example_index_N[f]],
        unit[s],
        unit[e],
        feats.arrays["input_ids"][f, s : e + 1],
    )
    assert text == ex.answer_text
  return windows_with_answer


def test_windows_with_doc_stride_map_answers_back_to_the_exact_text(wordpiece_tok):
  filler = "a long story about the university . " * 6
  context = filler + "It was founded in 1842 (by Father Edward Sorin) in Indiana. " + filler
  examples = []
  for answer in ("1842", "Father Edward Sorin", "Indiana", "founded"):
    start = context.index(answer, len(filler))
    examples.append(data.Example(answer, "Who founded it?", context, [answer], start, False))
  feats = features.build(
      wordpiece_tok, examples, max_seq_len=24, doc_stride=6, max_query_length=8, training=True
  )
  per_example = np.bincount(feats.example_index_N)
  assert (per_example > 3).all()  # really several windows each
  assert (feats.arrays["attention_mask"].sum(1) <= 24).all()
  assert _check_windows_recover_answers(wordpiece_tok, examples, feats) >= 4
  # Punctuation is its own unit: "1842" is cut from "1842" without the "(" of "(by".
  ex = examples[0]
  spans = feats.unit_spans[0]
  words = [ex.context[s:e] for s, e in spans]
  k = words.index("It")
  assert words[k : k + 14] == [
      "It",
      "was",
      "founded",
      "in",
      "1842",
      "(",
      "by",
      "Father",
      "Edward",
      "Sorin",
      ")",
      "in",
      "Indiana",
      ".",
  ]
  # Every context token is scored in exactly one window.
  for i in range(len(examples)):
    rows = feats.example_index_N == i
    units = feats.token_unit_NxL[rows][feats.max_context_NxL[rows]]
    assert len(units) == len(features.tokenize_context(wordpiece_tok, context)[1])


def test_sentencepiece_windows_map_answers_back_to_the_exact_text():
  from bertjax.data.tokenizer import SentencePieceTokenizer

  tok = SentencePieceTokenizer(TOKENIZER)
  examples, _ = data.read(os.path.join(FIXTURES, "train-v1.1.json"), "1.1", training=True)
  feats = features.build(
      tok, examples, max_seq_len=24, doc_stride=4, max_query_length=8, training=True
  )
  assert len(feats) > len(examples)
  assert _check_windows_recover_answers(tok, examples, feats) >= 2


def test_impossible_and_out_of_window_answers_point_at_cls(wordpiece_tok):
  ex = data.Example("q", "when?", "the university was founded in 1842 .", [], -1, True)
  feats = features.build(
      wordpiece_tok, [ex], max_seq_len=16, doc_stride=2, max_query_length=4, training=True
  )
  assert (feats.arrays["start_positions"] == 0).all() and (feats.arrays["end_positions"] == 0).all()


# ---------------------------------------------------------------------------------- decoding


def test_nbest_decoding_on_hand_made_logits(wordpiece_tok):
  context = "the university was founded in 1842 by father edward sorin"
  ex = data.Example("q", "who?", context, ["father edward sorin"], context.index("father"), False)
  feats = features.build(
      wordpiece_tok, [ex], max_seq_len=32, doc_stride=8, max_query_length=4, training=False
  )
  assert len(feats) == 1
  unit = feats.token_unit_NxL[0]
  pos = {
      context[s:e]: int(np.flatnonzero(unit == u)[0])
      for u, (s, e) in enumerate(feats.unit_spans[0])
  }
  start = np.full((1, 32), -10.0, np.float32)
  end = np.full((1, 32), -10.0, np.float32)
  start[0, pos["father"]], end[0, pos["sorin"]] = 5.0, 5.0
  start[0, pos["university"]], end[0, pos["sorin"]] = 6.0, 5.0  # a longer span scores higher
  end[0, pos["was"]] = 1.0
  start[0, 0], end[0, 0] = 2.0, 2.0  # null score 4
  got = decode.decode([ex], feats, start, end, "1.1", wordpiece_tok, n_best=5, max_answer_length=30)
  assert got.predictions == {"q": "university was founded in 1842 by father edward sorin"}
  got = decode.decode([ex], feats, start, end, "1.1", wordpiece_tok, n_best=5, max_answer_length=3)
  assert got.predictions == {"q": "father edward sorin"}  # the long span is cut
  assert [d["text"] for d in got.nbest["q"]][:2] == ["father edward sorin", "university was"]
  assert sum(d["probability"] for d in got.nbest["q"]) == pytest.approx(1.0)
  # v2.0: null 4 vs best span 10 -> diff -6; "" only when the threshold is below -6.
  got = decode.decode([ex], feats, start, end, "2.0", wordpiece_tok, n_best=5, max_answer_length=3)
  assert got.predictions == {"q": "father edward sorin"} and got.null_odds["q"] == -6.0
  got = decode.decode(
      [ex],
      feats,
      start,
      end,
      "2.0",
      wordpiece_tok,
      n_best=5,
      max_answer_length=3,
      null_threshold=-7.0,
  )
  assert got.predictions == {"q": ""} and got.best_span == {"q": "father edward sorin"}
  # An end before the start is never a span, even with the best logits.
  start[0, pos["sorin"]], end[0, pos["the"]] = 50.0, 50.0
  got = decode.decode([ex], feats, start, end, "1.1", wordpiece_tok, n_best=5, max_answer_length=30)
  assert got.predictions["q"] != "" and "sorin" in got.predictions["q"].split()[-1]


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_a_span_ending_inside_a_word_answers_only_its_pieces(wordpiece_tok, kind):
  # run_squad's get_final_text: "18" + "##42" of "1842," or "1" "8" "4" of "1842,".
  from bertjax.data.tokenizer import SentencePieceTokenizer

  tok = wordpiece_tok if kind == "wordpiece" else SentencePieceTokenizer(TOKENIZER)
  context = "The University was founded in 1842, by Father Edward Sorin."
  ex = data.Example("q", "when?", context, ["1842"], context.index("1842"), False)
  feats = features.build(tok, [ex], max_seq_len=48, doc_stride=16, max_query_length=4)
  pieces = [tok.id_to_piece(i) for i in feats.arrays["input_ids"][0]]
  first = pieces.index("18") if kind == "wordpiece" else pieces.index("1")
  last = first + (1 if kind == "wordpiece" else 2)
  start = np.full((1, 48), -10.0, np.float32)
  end = np.full((1, 48), -10.0, np.float32)
  start[0, first], end[0, last] = 5.0, 5.0
  want = "1842" if kind == "wordpiece" else "184"
  assert decode.decode([ex], feats, start, end, "1.1", tok).predictions == {"q": want}
  start[0, first], start[0, pieces.index("the" if kind == "wordpiece" else "▁The")] = -10.0, 9.0
  assert decode.decode([ex], feats, start, end, "1.1", tok).predictions == {
      "q": "The University was founded in 1842"
      if kind == "wordpiece"
      else "The University was founded in 184"
  }


# ------------------------------------------------------------------------------- fine-tuning

_NOUNS = "house sister mother father day time man lady way room family evening morning".split()
_FILLER = "the a of and to in was is that it her his he she had for with as not be".split()


def _marker_squad(path, n, seed):
  """Questions whose answer is always the word after "letter"."""
  r = random.Random(seed)
  paragraphs = []
  for i in range(n):
    words = [r.choice(_FILLER) for _ in range(r.randint(6, 12))]
    k = r.randint(0, len(words))
    answer = r.choice(_NOUNS)
    words[k:k] = ["letter", answer]
    context = " ".join(words)
    start = len(" ".join(words[: k + 1])) + 1
    assert context[start : start + len(answer)] == answer
    paragraphs.append(
        dict(
            context=context,
            qas=[
                dict(
                    id=f"q{i}",
                    question="what came with the letter ?",
                    answers=[dict(text=answer, answer_start=start)],
                )
            ],
        )
    )
  path.write_text(json.dumps(dict(version="1.1", data=[dict(title="t", paragraphs=paragraphs)])))


@pytest.mark.slow
def test_finetune_learns_the_word_after_the_marker(tmp_path):
  from bertjax.commands import squad

  _marker_squad(tmp_path / "train.json", 256, 0)
  _marker_squad(tmp_path / "dev.json", 64, 1)
  out = tmp_path / "out"
  rc = squad.main(
      [
          "--init",
          "random",
          "--tokenizer",
          TOKENIZER,
          "--train",
          str(tmp_path / "train.json"),
          "--dev",
          str(tmp_path / "dev.json"),
          "--version",
          "1.1",
          "--workdir",
          str(out),
          "--max-seq-len",
          "32",
          "--doc-stride",
          "16",
          "--max-query-length",
          "8",
          "--epochs",
          "2",
          "--learning-rate",
          "1e-3",
          "--dropout",
          "0.0",
          "--eval-untrained",
          "--no-progress",
      ]
  )
  assert rc == 0
  results = json.loads((out / "results.json").read_text())
  untrained, dev = results["untrained"]["exact"], results["dev"]["exact"]
  assert dev > untrained + 30, (untrained, dev, results["history"])
  preds = json.loads((out / "predictions.json").read_text())
  assert len(preds) == 64 and sum(p in _NOUNS for p in preds.values()) >= 32
  assert (out / "best").is_dir() and (out / "nbest_predictions.json").is_file()


def test_heads_share_the_pretrained_bert_subtree():
  import jax

  from bertjax import model as model_lib

  cfg = model_lib.from_preset("tiny", vocab_size=64, max_position_embeddings=16)
  d = model_lib.dummy_inputs(2, 8, 2)
  shapes = lambda m, *a: jax.tree.map(
      lambda x: x.shape,
      nn.unbox(jax.eval_shape(lambda k: m.init(k, *a)["params"], jax.random.key(0))),
  )
  pre = shapes(
      model_lib.BertForPreTraining(cfg),
      d["input_ids"],
      d["token_type_ids"],
      d["attention_mask"],
      d["masked_positions"],
  )
  args = (d["input_ids"], d["token_type_ids"], d["attention_mask"])
  qa = shapes(model_lib.BertForQuestionAnswering(cfg), *args)
  tc = shapes(model_lib.BertForTokenClassification(cfg, 5), *args)
  assert qa["bert"] == pre["bert"] == tc["bert"]
  assert qa["qa_outputs"]["kernel"] == (128, 2) and tc["classifier"]["kernel"] == (128, 5)
  start, end = jax.eval_shape(
      lambda: model_lib.BertForQuestionAnswering(cfg).apply(
          {
              "params": jax.tree.map(
                  lambda s: jax.numpy.zeros(s), qa, is_leaf=lambda x: isinstance(x, tuple)
              )
          },
          *args,
      )
  )
  assert start.shape == end.shape == (2, 8)
