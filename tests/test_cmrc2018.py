"""CMRC 2018 through `bertjax squad`: unspaced Chinese contexts split so an answer can start and
end at any character, the answer recovered exactly by the n-best decoding, and CMRC 2018's EM
and character-level F1 on hand-computed cases."""

import json
import os
import random

import numpy as np
import pytest

from bertjax.tasks.squad import cmrc2018, data, decode, features, train

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER = os.path.join(REPO, "data", "tokenizer.model")

# From CMRC 2018's trial paragraph (CLUE's README): digits, a decimal and full-width punctuation
# between Chinese characters, and no spaces.
CONTEXT = "工商协进会报告，12月消费者信心上升到78.1，明显高于11月的72。"


@pytest.fixture(scope="module")
def wordpiece_tok(tmp_path_factory):
  from bertjax.data import wordpiece

  chars = sorted({c for c in CONTEXT if wordpiece.is_cjk(c)} | set("什么是"))
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "12", "11", "72", "78", ".", "1", "，"]
  path = tmp_path_factory.mktemp("zh") / "vocab.txt"
  path.write_text("\n".join(pieces + chars) + "\n", encoding="utf-8")
  return wordpiece.WordPieceTokenizer(path, lower_case=True)


def _tok(kind, wordpiece_tok):
  from bertjax.data.tokenizer import SentencePieceTokenizer

  return wordpiece_tok if kind == "wordpiece" else SentencePieceTokenizer(TOKENIZER)


def _decode_gold(tok, ex: data.Example) -> str:
  """The answer the n-best decoding gives when the logits point at the training target."""
  feats = features.build(
      tok, [ex], max_seq_len=128, doc_stride=32, max_query_length=8, training=True
  )
  (f,) = np.flatnonzero(feats.arrays["start_positions"] > 0)
  start = np.full(feats.arrays["input_ids"].shape, -10.0, np.float32)
  end = start.copy()
  start[f, feats.arrays["start_positions"][f]] = 5.0
  end[f, feats.arrays["end_positions"][f]] = 5.0
  return decode.decode([ex], feats, start, end, "1.1", tok, max_answer_length=128).predictions["q"]


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_every_span_of_chinese_characters_is_recovered_exactly(wordpiece_tok, kind):
  tok = _tok(kind, wordpiece_tok)
  run = CONTEXT.index("消费者信心上升到")  # eight characters between a digit and a digit
  for i in range(run, run + 8):
    for j in range(i + 1, run + 9):
      answer = CONTEXT[i:j]
      ex = data.Example("q", "什么是", CONTEXT, [answer], i, False)
      assert _decode_gold(tok, ex) == answer, (i, j)


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
@pytest.mark.parametrize("answer", ["工商协进会", "78.1", "12月", "11月的72", "72"])
def test_answers_with_digits_and_at_the_edges(wordpiece_tok, kind, answer):
  tok = _tok(kind, wordpiece_tok)
  at = CONTEXT.index(answer) if answer != "72" else CONTEXT.rindex("72")
  ex = data.Example("q", "什么是", CONTEXT, [answer], at, False)
  assert _decode_gold(tok, ex) == answer


def test_a_chinese_character_is_a_unit_for_both_tokenizers():
  spans = features.unit_spans("在2018年BERT模型", split_punctuation=False)
  assert [("在2018年BERT模型")[s:e] for s, e in spans] == ["在", "2018", "年", "BERT", "模", "型"]
  # No CJK character: the whitespace words of run_squad, as before.
  spans = features.unit_spans("founded in 1842, by", split_punctuation=False)
  assert [("founded in 1842, by")[s:e] for s, e in spans] == ["founded", "in", "1842,", "by"]


def test_the_official_cmrc_reader_layout_is_read_as_squad(tmp_path):
  # CMRC 2018's squad-style files: {"version", "data": [{"paragraphs": [{"id", "context",
  # "qas": [{"question", "id", "answers": [{"text", "answer_start"}]}]}], "id", "title"}]}
  doc = {
      "version": "v1.0",
      "data": [
          {
              "paragraphs": [
                  {
                      "id": "TRIAL_0",
                      "context": CONTEXT,
                      "qas": [
                          {
                              "question": "12月的消费者信心指数是多少？",
                              "id": "TRIAL_0_QUERY_1",
                              "answers": [{"text": "78.1", "answer_start": CONTEXT.index("78.1")}],
                          }
                      ],
                  }
              ],
              "id": "TRIAL_0",
              "title": "傻钱策略",
          }
      ],
  }
  path = tmp_path / "cmrc2018_trial.json"
  path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
  (ex,), skipped = data.read(str(path), "1.1", training=True)
  assert skipped == [] and ex.answer_text == "78.1" and ex.answer_start == CONTEXT.index("78.1")


# ------------------------------------------------------------------------------ EM and F1


def test_f1_is_over_the_longest_common_run_of_characters():
  # 9 characters in common ("买入并持有美国股票"); 13 predicted, 16 gold: F1 = 18 / 29.
  assert cmrc2018.f1(
      "买入并持有美国股票这样的普通组合", "其实就是买入并持有美国股票"
  ) == pytest.approx(18 / 29)
  # A contiguous run, not a bag: "丙丁" in common, 2 of 4 each way.
  assert cmrc2018.f1("甲乙丙丁", "甲丙丁乙") == pytest.approx(0.5)
  assert cmrc2018.f1("北京", "上海") == 0.0


def test_punctuation_is_cmrcs_list():
  # Full-width quotes, comma and full stop are removed; EM compares what is left.
  assert cmrc2018.exact_match("“傻钱”策略", "傻钱策略。") == 1
  assert cmrc2018.remove_punctuation("《战国无双3》") == "战国无双3"
  # "…" is not in the list (the script's "……" is two characters), nor "‘", nor ASCII "." ",".
  assert cmrc2018.exact_match("等等…", "等等") == 0
  assert cmrc2018.remove_punctuation("‘a’, b.") == "‘a, b."
  assert cmrc2018.exact_match("ABC", " abc ") == 1  # lower-cased, stripped


def test_segments_keep_words_between_chinese_characters():
  # "-" is punctuation, so "BERT-base" is the one word "bertbase"; "78.1" stays whole.
  assert cmrc2018.segments("BERT-base模型得分78.1。") == [
      "bertbase",
      "模",
      "型",
      "得",
      "分",
      "78.1",
  ]
  # F1 of "BERT模型" vs "bert-base模型": gold [bert 模 型], predicted [bertbase 模 型],
  # "模型" in common: 2/3 each way.
  assert cmrc2018.f1("BERT模型", "bert-base模型") == pytest.approx(2 / 3)
  assert cmrc2018.segments("the model (2018).") == ["the", "model", "(", "2018", ")", "."]


def test_score_over_questions_with_a_missing_prediction():
  gold = {"a": ["工商协进会", "协进会"], "b": ["78.1"], "c": ["72"]}
  preds = {"a": "协进会", "b": "78.1，"}  # c unanswered
  got = cmrc2018.score(gold, preds)
  assert got == dict(
      exact=pytest.approx(200 / 3),
      f1=pytest.approx(200 / 3),
      average=pytest.approx(200 / 3),
      total=3.0,
      skip=1.0,
  )
  preds["c"] = "11月的72"  # [11 月 的 72] against [72]: P 1/4, R 1, F1 2/5
  got = cmrc2018.score(gold, preds)
  assert got["f1"] == pytest.approx(100 * (2 + 2 / 5) / 3)
  assert got["exact"] == pytest.approx(200 / 3) and got["skip"] == 0.0


def test_squad_scores_with_cmrc_when_asked():
  ex = data.Example("q", "什么是", CONTEXT, ["工商协进会"], 0, False)
  dec = decode.Decoded({"q": "工商协进会报告"}, {"q": "工商协进会报告"}, {"q": 0.0}, {})
  cmrc = train.score([ex], dec, train.Options(metric="cmrc2018"))
  assert cmrc["exact"] == 0.0 and cmrc["f1"] == pytest.approx(100 * 2 * 5 / 12)
  # SQuAD's F1 splits on spaces: one word against another, 0.
  assert train.score([ex], dec, train.Options())["f1"] == 0.0


# Non-Chinese runs are split as NLTK's word_tokenize splits them (its NLTKWordTokenizer rules;
# these are what NLTK 3.10.4 gives for each one-sentence string).
_WORDS = {
    "78.1": ["78.1"],
    "1,000 people": ["1,000", "people"],
    "the bert model.": ["the", "bert", "model", "."],
    "(2018)": ["(", "2018", ")"],
    "don't go": ["do", "n't", "go"],
    'a "quoted" word': ["a", "``", "quoted", "''", "word"],
    "'hello'": ["'", "hello", "'"],
    "12:30": ["12:30"],
    "it's 5% off!": ["it", "'s", "5", "%", "off", "!"],
    "#1 $5 @x &y": ["#", "1", "$", "5", "@", "x", "&", "y"],
    "wait...": ["wait", "..."],
    "a--b": ["a", "--", "b"],
    "u.s. army": ["u.s.", "army"],
    "cannot gonna 'tis": ["can", "not", "gon", "na", "'", "tis"],
    "a–b — c": ["a", "–", "b", "—", "c"],
    '"hi," she said': ["``", "hi", ",", "''", "she", "said"],
    "it’s": ["it", "’", "s"],
    "«a»": ["«", "a", "»"],
}


@pytest.mark.parametrize("text", list(_WORDS))
def test_words_between_chinese_characters_are_nltks(text):
  assert cmrc2018.word_tokenize(text) == _WORDS[text]


def test_the_word_rules_are_nltks_where_nltk_is_installed():
  tokenize = pytest.importorskip("nltk.tokenize").NLTKWordTokenizer().tokenize
  for text in _WORDS:
    assert cmrc2018.word_tokenize(text) == tokenize(text), text


def test_a_sentence_ends_at_a_period_but_not_an_abbreviation():
  assert cmrc2018.word_tokenize("hello world. next one") == ["hello", "world", ".", "next", "one"]
  assert cmrc2018.word_tokenize("mr. smith went. then") == ["mr.", "smith", "went", ".", "then"]


# ------------------------------------------------------------------ test set (CLUE's file)


def test_test_questions_need_no_answers_and_are_decoded_as_their_own_split(wordpiece_tok, tmp_path):
  doc = {
      "data": [
          {
              "paragraphs": [
                  {"context": CONTEXT, "qas": [{"id": "T1", "question": "什么是"}]},
              ]
          }
      ]
  }
  path = tmp_path / "test.json"
  path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
  (test_ex,), skipped = data.read(str(path), "1.1", training=False, labelled=False)
  assert skipped == [] and test_ex.answers == []
  _, skipped = data.read(str(path), "1.1", training=False)  # a dev file needs its answers
  assert skipped == ["test.json: question T1: no answers (and not is_impossible)"]

  gold = data.Example("q", "什么是", CONTEXT, ["消费者信心"], CONTEXT.index("消费者"), False)
  opts = train.Options(max_seq_len=64, doc_stride=32, max_query_length=8, metric="cmrc2018")
  task = train.SquadTask(wordpiece_tok, [gold], [gold], opts, 64, test=[test_ex])
  splits = task.features()
  assert set(splits.final) == {"dev", "test"} and set(splits.scored) == {"dev"}
  # Point the test window's logits where the training target of the same span points.
  target = task.windows[0].arrays
  start = np.full(splits.final["test"]["input_ids"].shape, -10.0, np.float32)
  end = start.copy()
  start[0, target["start_positions"][0]] = end[0, target["end_positions"][0]] = 5.0
  assert task.predictions("test", (start, end)).predictions == {"T1": "消费者信心"}
  assert train.test_predictions_name(opts) == "submission/cmrc2018_predict.json"
  assert train.test_predictions_name(train.Options()) == "test_predictions.json"


def test_em_and_f1_agree_with_a_plain_reading_of_the_script_where_nltk_is_installed():
  """The script's EM and F1 written out plainly (character loop, full LCS table, NLTK's own
  tokenizer for the text between Chinese characters), against `cmrc2018` on random pairs."""
  tokenize = pytest.importorskip("nltk.tokenize").NLTKWordTokenizer().tokenize
  punct = set(cmrc2018.PUNCTUATION)

  def segs(s):
    out, run = [], ""
    for c in s.lower().strip():
      if c in punct:
        continue
      if "\u4e00" <= c <= "\u9fa5":
        out += tokenize(run) if run else []
        out.append(c)
        run = ""
      else:
        run += c
    return out + (tokenize(run) if run else [])

  def f1(gold, pred):
    a, b = segs(gold), segs(pred)
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    n = 0
    for i in range(len(a)):
      for j in range(len(b)):
        if a[i] == b[j]:
          table[i + 1][j + 1] = table[i][j] + 1
          n = max(n, table[i + 1][j + 1])
    return 0.0 if n == 0 else 2 * n / (len(a) + len(b))

  def em(gold, pred):
    strip = lambda s: "".join(c for c in s.lower().strip() if c not in punct)
    return int(strip(gold) == strip(pred))

  r = random.Random(0)
  alphabet = list("北京大学的一是在了ab12.,%()-:“”‘’《》…， ") + ["bert", "78.1", "1,000", "don't"]
  for _ in range(2000):
    gold = "".join(r.choice(alphabet) for _ in range(r.randint(1, 8)))
    pred = "".join(r.choice(alphabet) for _ in range(r.randint(1, 8)))
    assert cmrc2018.exact_match(gold, pred) == em(gold, pred), (gold, pred)
    assert cmrc2018.f1(gold, pred) == pytest.approx(f1(gold, pred)), (gold, pred)
