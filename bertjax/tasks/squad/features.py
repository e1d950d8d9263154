"""SQuAD examples as [CLS] question [SEP] context-window [SEP] features, google-research/bert style.

The context is cut into *units* with character spans, each tokenized on its own, so every
token maps back to characters of the original text. Words are separated by run_squad's
whitespace (space, tab, CR, LF, U+202F), and every CJK ideograph is a word of its own, so that
in Chinese text, which has no spaces, an answer can start and end at any character (CMRC
2018's baseline splits its contexts so, with BERT's basic tokenizer's CJK ranges):
  * WordPiece: each word is split further on punctuation, as BERT's basic tokenizer does
    anyway, so the pieces are those of the whole text and an answer "1895" is cut out of
    "(1895)" exactly;
  * SentencePiece: each word is one unit (its pieces carry the word's "▁"; a CJK character is
    then tokenized on its own, where the model may have learnt pieces of several).
A predicted span's answer is cut from the words holding it by run_squad's get_final_text
(`answer_text`): the characters its pieces cover, "1890" inside "1890s". A context without CJK
characters is cut exactly as run_squad cuts it.
A long context becomes several windows of at most `max_seq_len - len(question) - 3` tokens,
each starting `doc_stride` tokens after the last; a token scored in several windows counts in
the one where it has the most context on both sides (`max_context`). The training target is
the token span of the answer's characters, tightened to the answer's own pieces where they
match (`_improve_span`); a window without the answer (and a v2.0 unanswerable question)
points at [CLS] (position 0).

Shape letters: N features (windows), L max sequence length.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import bisect
import numpy as np

from bertjax import errors
from bertjax.data import wordpiece
from bertjax.tasks.inputs import pair_separators, special_ids
from bertjax.tasks.squad.data import Example


@dataclasses.dataclass
class Features:
  arrays: dict[str, np.ndarray]  # input_ids/token_type_ids/attention_mask [N,L] int32;
  # start_positions/end_positions [N] int32 (0 = [CLS]: no answer in this window)
  example_index_N: np.ndarray  # int32: which example each window belongs to
  token_unit_NxL: np.ndarray  # int32: the context unit under each token, -1 off the context
  max_context_NxL: np.ndarray  # bool: this window is the token's best-centred one
  unit_spans: list[list[tuple[int, int]]]  # per example: [start, end) chars of each unit

  def __len__(self) -> int:
    return len(self.example_index_N)


# run_squad's _is_whitespace: what separates the context's words (other Unicode spaces, e.g.
# U+00A0, are inside a word there, and WordPiece's basic tokenization splits on them later).
_DOC_SPACES = " \t\r\n\u202f"


def _is_space(ch: str) -> bool:
  return ch in _DOC_SPACES


def unit_spans(text: str, split_punctuation: bool) -> list[tuple[int, int]]:
  """[start, end) character spans of the whitespace words of `text`, each CJK character its
  own span, and each punctuation character too when `split_punctuation`."""
  spans, start = [], None
  for i, ch in enumerate(text):
    if (
        _is_space(ch)
        or wordpiece.is_cjk(ch)
        or (split_punctuation and wordpiece.is_punctuation(ch))
    ):
      if start is not None:
        spans.append((start, i))
        start = None
      if not _is_space(ch):
        spans.append((i, i + 1))
    elif start is None:
      start = i
  if start is not None:
    spans.append((start, len(text)))
  return spans


def _word_edge(left: str, right: str) -> bool:
  """Whether a word of the context ends between the characters `left` and `right`."""
  return _is_space(left) or _is_space(right) or wordpiece.is_cjk(left) or wordpiece.is_cjk(right)


def tokenize_context(tok: Any, context: str) -> tuple[list[tuple[int, int]], list[int], list[int]]:
  """(unit spans, token ids, unit index of each token)."""
  spans = unit_spans(context, isinstance(tok, wordpiece.WordPieceTokenizer))
  pieces = tok.encode_batch([context[s:e] for s, e in spans])
  ids, unit_of = [], []
  for u, p in enumerate(pieces):
    ids.extend(p)
    unit_of.extend([u] * len(p))
  return spans, ids, unit_of


def answer_token_span(ex: Example, spans, ids, unit_of, tok) -> tuple[int, int]:
  """Inclusive token span of the answer's characters; (-1, -1) if no token covers them."""
  first_char, last_char = ex.answer_start, ex.answer_start + len(ex.answer_text) - 1
  ends = [e for _, e in spans]
  start_unit = bisect.bisect_right(ends, first_char)  # first unit ending after first_char
  end_unit = bisect.bisect_right([s for s, _ in spans], last_char) - 1
  t0 = bisect.bisect_left(unit_of, start_unit)
  t1 = bisect.bisect_right(unit_of, end_unit) - 1
  if t0 > t1 or t0 >= len(ids):
    return -1, -1
  span = _improve_span(ids, t0, t1, tok.encode(ex.answer_text))
  cjk = any(wordpiece.is_cjk(ch) for ch in ex.context[spans[start_unit][0] : spans[end_unit][1]])
  if span == (t0, t1) and cjk and not isinstance(tok, wordpiece.WordPieceTokenizer):
    span = _improve_span_by_text(tok, ids, t0, t1, ex.answer_text)
  return span


def _improve_span_by_text(tok: Any, ids: list[int], t0: int, t1: int, answer: str):
  """The shortest sub-span of [t0, t1] whose pieces decode to `answer`, spaces aside: in
  Chinese text a SentencePiece answer is rarely its own pieces ("12月" after "，" is "1" "2"
  of the unit "，12", then the unit "月")."""
  want = answer.replace(" ", "")
  best = (t0, t1)
  for s in range(t0, t1 + 1):
    for e in range(s, t1 + 1):
      if e - s >= best[1] - best[0]:
        break
      if tok.decode(ids[s : e + 1]).replace(" ", "") == want:
        best = (s, e)
        break
  return best


def _improve_span(ids: list[int], t0: int, t1: int, answer_ids: list[int]) -> tuple[int, int]:
  """The sub-span of [t0, t1] whose pieces are exactly the answer's, if one is (google's
  _improve_answer_span: answer "1895" in a unit tokenized "18", "##95", ...)."""
  n = len(answer_ids)
  for s in range(t0, t1 + 1):
    for e in range(t1, s - 1, -1):
      if e - s + 1 == n and ids[s : e + 1] == answer_ids:
        return s, e
  return t0, t1


def _windows(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) of each window, google's loop: the last one ends at the last token."""
  out, start = [], 0
  while True:
    length = min(num_tokens - start, max_tokens)
    out.append((start, length))
    if start + length >= num_tokens:
      return out
    start += min(length, stride)


def _is_max_context(windows, w: int, pos: int) -> bool:
  best, best_score = None, None
  for i, (start, length) in enumerate(windows):
    if not start <= pos < start + length:
      continue
    score = min(pos - start, start + length - 1 - pos) + 0.01 * length
    if best_score is None or score > best_score:
      best, best_score = i, score
  return best == w


def build(
    tok: Any,
    examples: list[Example],
    max_seq_len: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = False,
) -> Features:
  """Every window of every example (google's convert_examples_to_features)."""
  if max_seq_len < max_query_length + 8:
    raise errors.ConfigError(
        f"max_seq_len={max_seq_len} leaves no room for the context after a "
        f"max_query_length={max_query_length} question — make it >= {max_query_length + 8}"
    )
  if doc_stride < 1:
    raise errors.ConfigError(f"doc_stride={doc_stride} must be >= 1")
  cls, sep, pad = special_ids(tok)
  rows, ex_index, all_spans = [], [], []
  for i, ex in enumerate(examples):
    query = tok.encode(ex.question)[:max_query_length]
    spans, ids, unit_of = tokenize_context(tok, ex.context)
    all_spans.append(spans)
    span = (-1, -1)
    if training and not ex.is_impossible:
      span = answer_token_span(ex, spans, ids, unit_of, tok)
    mid = [sep] * pair_separators(tok)  # RoBERTa: </s></s> between question and context
    offset = len(query) + 1 + len(mid)
    windows = _windows(max(len(ids), 1), max_seq_len - offset - 1, doc_stride)
    for w, (start, length) in enumerate(windows):
      doc = ids[start : start + length]
      input_ids = [cls] + query + mid + doc + [sep]
      types = [0] * offset + [1] * (len(doc) + 1)
      unit = [-1] * offset + unit_of[start : start + length] + [-1]
      maxc = (
          [False] * offset
          + [_is_max_context(windows, w, start + j) for j in range(len(doc))]
          + [False]
      )
      s_pos = e_pos = 0
      if span[0] >= start and span[1] < start + length:
        s_pos, e_pos = span[0] - start + offset, span[1] - start + offset
      n_pad = max_seq_len - len(input_ids)
      rows.append(
          (
              input_ids + [pad] * n_pad,
              types + [0] * n_pad,
              [1] * len(input_ids) + [0] * n_pad,
              s_pos,
              e_pos,
              unit + [-1] * n_pad,
              maxc + [False] * n_pad,
          )
      )
      ex_index.append(i)
  cols = list(zip(*rows)) if rows else [[]] * 7
  arr = (
      lambda c, dt: np.asarray(c, dt).reshape(len(rows), -1)
      if rows
      else np.zeros((0, max_seq_len), dt)
  )
  arrays = dict(
      input_ids=arr(cols[0], np.int32),
      token_type_ids=arr(cols[1], np.int32),
      attention_mask=arr(cols[2], np.int32),
      start_positions=np.asarray(cols[3], np.int32),
      end_positions=np.asarray(cols[4], np.int32),
  )
  return Features(
      arrays, np.asarray(ex_index, np.int32), arr(cols[5], np.int32), arr(cols[6], bool), all_spans
  )


def piece_text(tok: Any, ids) -> str:
  """Predicted pieces as text: WordPiece pieces joined with "##" removed, as run_squad's
  write_predictions does; SentencePiece pieces decoded."""
  if isinstance(tok, wordpiece.WordPieceTokenizer):
    text = " ".join(tok.id_to_piece(i) for i in ids).replace(" ##", "").replace("##", "")
  else:
    text = tok.decode(ids)
  return " ".join(text.split())


def _tokenized_text(tok: Any, text: str) -> str:
  """`text` as the tokenizer writes it: BERT's basic tokens joined by spaces (lower-cased and
  accent-free for uncased WordPiece), or its SentencePiece pieces decoded (normalized as the
  model normalizes, e.g. NFKC)."""
  if isinstance(tok, wordpiece.WordPieceTokenizer):
    return " ".join(wordpiece.basic_tokenize(text, tok.lower_case))
  return tok.decode(tok.encode(text))


def _strip_spaces(text: str) -> tuple[str, list[int]]:
  """`text` without spaces, and the position in `text` of each character kept."""
  kept = [i for i, ch in enumerate(text) if ch != " "]
  return "".join(text[i] for i in kept), kept


def get_final_text(pred_text: str, orig_text: str, tok: Any) -> str:
  """google-research/bert's get_final_text: the characters of `orig_text` (whole context
  words) that the predicted pieces `pred_text` cover, so "1890" predicted inside "1890s"
  answers "1890" and the original case and accents come back.

  `orig_text` is tokenized again; when its characters do not align one to one with the
  tokenized text (other than spaces), or `pred_text` is not found in it, the whole words are
  the answer, as in the reference. Like the reference, the first occurrence of `pred_text`
  counts.

  Chinese text (`orig_text` with a CJK character): its units are tokenized one by one, so
  SentencePiece pieces decode with a space between units ("12 月") where the text has none;
  when `pred_text` is not found as it is, it is looked for without spaces.
  """
  tok_text = _tokenized_text(tok, orig_text)
  orig_ns, orig_pos = _strip_spaces(orig_text)
  tok_ns, tok_pos = _strip_spaces(tok_text)
  start = tok_text.find(pred_text)
  if start < 0 and any(wordpiece.is_cjk(ch) for ch in orig_text):
    pred_ns = pred_text.replace(" ", "")
    k = tok_ns.find(pred_ns) if pred_ns else -1
    if k >= 0 and len(orig_ns) == len(tok_ns):
      return orig_text[orig_pos[k] : orig_pos[k + len(pred_ns) - 1] + 1]
  if start < 0:
    return orig_text
  end = start + len(pred_text) - 1
  if len(orig_ns) != len(tok_ns):
    return orig_text
  tok_ns_of = {p: k for k, p in enumerate(tok_pos)}
  if start not in tok_ns_of or end not in tok_ns_of:
    return orig_text
  return orig_text[orig_pos[tok_ns_of[start]] : orig_pos[tok_ns_of[end]] + 1]


def answer_text(
    tok: Any, context: str, spans: list[tuple[int, int]], unit_start: int, unit_end: int, ids
) -> str:
  """The answer of the predicted pieces `ids`, which lie in units unit_start..unit_end: the
  context words holding them joined by single spaces (run_squad's orig_text), cut to the
  pieces by `get_final_text`. A CJK character is a word of its own (CMRC 2018's baseline's
  doc tokens), so in Chinese text the words are the predicted characters, not the whole
  unspaced run around them."""
  start, end = spans[unit_start][0], spans[unit_end][1]
  while start > 0 and not _word_edge(context[start - 1], context[start]):
    start -= 1
  while end < len(context) and not _word_edge(context[end - 1], context[end]):
    end += 1
  words = re.split(f"[{_DOC_SPACES}]+", context[start:end])
  return get_final_text(piece_text(tok, ids), " ".join(words), tok)
