"""CMRC 2018's official scores: exact match and character-level F1 for Chinese span answers.

Implemented from the definitions of CMRC 2018's evaluation script (cmrc2018_evaluate.py, v5),
so numbers compare with published ones; it needs no NLTK:
  * An answer is lower-cased and stripped of surrounding whitespace.
  * Its punctuation is CMRC's list: - : _ * ^ / \\ ~ ` + = and the full-width ，。：？！“”；’《》·、
    「」（）－～『』. The list also names "……", two characters, which no single character
    equals, so "…" is kept (as the script keeps it); "‘" is not in the list either.
  * EM: 1 when the answer without its punctuation equals one of the gold answers without theirs
    (spaces inside count).
  * F1 segments each text (punctuation dropped): every CJK ideograph U+4E00..U+9FA5 is a
    segment of its own; the text between them is split into words as NLTK's word_tokenize
    does (`word_tokenize`: NLTKWordTokenizer's rules; punkt's sentence split approximated). Precision and recall come from the longest common
    *contiguous* run of segments (the script's find_lcs), not a bag of tokens; the F1 of a
    question is the best over its gold answers.
  * Totals are percentages over every gold question; a question without a prediction scores 0
    and is counted in `skip`. `average` is (EM + F1) / 2, the leaderboard's figure.
"""

from __future__ import annotations

import re

# CMRC's punctuation, character by character ("……" is in the script's list as one entry of
# two characters, which never matches one character).
PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
_CJK = re.compile("[\u4e00-\u9fa5]")

# NLTK's word_tokenize: sentences (`_sentences`), then in each the rules of NLTK's
# NLTKWordTokenizer (3.x) in its order: opening quotes, punctuation off words, brackets,
# dashes, closing quotes and contractions.
_STARTING_QUOTES = [
    (re.compile("([\u00ab\u201c\u2018\u201e]|[`]+)"), r" \1 "),
    (re.compile(r'^"'), "``"),
    (re.compile(r"(``)"), r" \1 "),
    (re.compile(r'([ \(\[{<])("|\'{2})'), r"\1 `` "),
    (re.compile(r"(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)"), r"\1 "),
]
_PUNCTUATION = [
    (re.compile("([^\\.])(\\.)([\\]\\)}>\"'\u00bb\u201d\u2019 ]*)\\s*$"), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])"), r" \1 \2"),
    (re.compile(r"([:,])$"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"[;@#$%&]"), r" \g<0> "),
    (re.compile("[\u2012-\u2015]"), r" \g<0> "),
    (re.compile(r'([^\.])(\.)([\]\)}>"\']*)\s*$'), r"\1 \2\3 "),
    (re.compile(r"[?!]"), r" \g<0> "),
    (re.compile(r"([^'])' "), r"\1 ' "),
    (re.compile(r"[*]"), r" \g<0> "),
    (re.compile(r"[\]\[\(\)\{\}\<\>]"), r" \g<0> "),
    (re.compile(r"--"), r" -- "),
]
_ENDING_QUOTES = [
    (re.compile("([\u00bb\u201d\u2019])"), r" \1 "),
    (re.compile(r"''"), " '' "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"\s+"), " "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
]
_CONTRACTIONS = [
    re.compile(p)
    for p in (
        r"(?i)\b(can)(not)\b",
        r"(?i)\b(d)('ye)\b",
        r"(?i)\b(gim)(me)\b",
        r"(?i)\b(gon)(na)\b",
        r"(?i)\b(got)(ta)\b",
        r"(?i)\b(lem)(me)\b",
        r"(?i)\b(more)('n)\b",
        r"(?i)\b(wan)(na)(?=\s)",
        r"(?i) ('t)(is)\b",
        r"(?i) ('t)(was)\b",
    )
]
# NLTK's sentence splitter (punkt) ends a sentence at a word ending in ".", "?" or "!" before
# whitespace, unless the word is an abbreviation. Punkt's English model is data NLTK downloads;
# this keeps its usual cases: a word with an inner period ("u.s.", "e.g."), a single letter (an
# initial) and these common abbreviations.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr co ltd inc corp vs etc no fig jan feb mar apr jun jul aug sep "
    "sept oct nov dec".split()
)


def _sentences(text: str) -> list[str]:
  out, start = [], 0
  for m in re.finditer(r"\S+[.?!](?=\s)", text):
    word = m.group()
    stem = word[:-1].lstrip("\"'([{<`\u2018\u201c")
    if word.endswith(".") and ("." in stem or len(stem) == 1 or stem.lower() in _ABBREVIATIONS):
      continue
    out.append(text[start : m.end()])
    start = m.end()
  out.append(text[start:])
  return [s for s in out if s.strip()]


def word_tokenize(text: str) -> list[str]:
  """Words of a non-Chinese run, as NLTK's word_tokenize splits them: "78.1" and "1,000" stay
  whole, "bert." -> "bert", "."; "(2018)" -> "(", "2018", ")"; "don't" -> "do", "n't"."""
  out = []
  for sentence in _sentences(text):
    for pattern, repl in _STARTING_QUOTES + _PUNCTUATION:
      sentence = pattern.sub(repl, sentence)
    sentence = " " + sentence + " "
    for pattern, repl in _ENDING_QUOTES:
      sentence = pattern.sub(repl, sentence)
    for pattern in _CONTRACTIONS:
      sentence = pattern.sub(r" \1 \2 ", sentence)
    out += sentence.split()
  return out


def normalize(text: str) -> str:
  return text.lower().strip()


def remove_punctuation(text: str) -> str:
  return "".join(ch for ch in normalize(text) if ch not in PUNCTUATION)


def segments(text: str) -> list[str]:
  """The units F1 counts: each CJK ideograph, and the words of the text between them;
  punctuation removed."""
  out, run = [], ""
  for ch in normalize(text):
    if ch in PUNCTUATION:
      continue
    if _CJK.match(ch):
      if run:
        out += word_tokenize(run)
        run = ""
      out.append(ch)
    else:
      run += ch
  if run:
    out += word_tokenize(run)
  return out


def longest_common_run(a: list[str], b: list[str]) -> int:
  """Length of the longest contiguous run of segments in both `a` and `b`."""
  best, prev = 0, [0] * (len(b) + 1)
  for x in a:
    cur = [0] * (len(b) + 1)
    for j, y in enumerate(b):
      if x == y:
        cur[j + 1] = prev[j] + 1
        best = max(best, cur[j + 1])
    prev = cur
  return best


def f1(gold: str, pred: str) -> float:
  gold_segs, pred_segs = segments(gold), segments(pred)
  same = longest_common_run(gold_segs, pred_segs)
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_segs), same / len(gold_segs)
  return 2 * precision * recall / (precision + recall)


def exact_match(gold: str, pred: str) -> int:
  return int(remove_punctuation(gold) == remove_punctuation(pred))


def score(gold: dict[str, list[str]], preds: dict[str, str]) -> dict[str, float]:
  """exact, f1 and average in percent over every question of `gold`, total and skip (the
  questions without a prediction, scored 0)."""
  em = f = skip = 0.0
  for qid, answers in gold.items():
    if qid not in preds:
      skip += 1
      continue
    em += max(exact_match(a, preds[qid]) for a in answers) if answers else 0
    f += max(f1(a, preds[qid]) for a in answers) if answers else 0.0
  n = max(len(gold), 1)
  exact, f1_score = 100.0 * em / n, 100.0 * f / n
  return dict(
      exact=exact,
      f1=f1_score,
      average=(exact + f1_score) / 2,
      total=float(len(gold)),
      skip=skip,
  )
