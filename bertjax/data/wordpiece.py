"""WordPiece tokenization from a BERT `vocab.txt`, as google-research/bert's `tokenization.py`.

Two implementations of one function, tested against each other and against transformers'
`BertTokenizer`:

  * `wordpiece_tf_tokenize(vocab, lower_case)`: a TensorFlow op (tensorflow-text's
    `FastBertTokenizer`) for the tf.data pipeline, so tokenization runs in parallel map calls.
  * `WordPieceTokenizer`: pure Python, with the interface of `bertjax.data.tokenizer.Tokenizer`
    (encode, encode_batch, decode, vocab_size, id_to_piece, is_word_start, sha256, path), for
    feature extraction and inspection; it needs no TensorFlow.

BERT's "basic tokenization", which both apply before WordPiece:
  1. drop NUL, U+FFFD and control (Cc) and format (Cf) characters, but not tab/newline/CR,
     which are whitespace; private-use and unassigned characters stay; whitespace becomes a
     space;
  2. put spaces around every CJK ideograph, so each is its own word;
  3. uncased models only: lowercase, NFD-decompose and drop combining marks ("é" -> "e");
  4. split on whitespace and on every punctuation character;
then each word is split greedily into the longest vocabulary pieces, continuation pieces
prefixed "##"; a word with no complete split (or over 200 characters) becomes [UNK].
transformers' BertTokenizer differs from google's on two of these: it drops every C* character
(private use too) and makes words of 101-200 characters [UNK]; this module follows google's.

`load_tokenizer(path)` picks `SentencePieceTokenizer` for a `.model` file and
`WordPieceTokenizer` for a vocabulary `.txt`. Paths may be local or `gs://...`: files are read
through `bertjax.runtime.fs` (etils.epath).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from typing import Callable, Iterable, Sequence

from etils import epath

from bertjax import errors
from bertjax.data.tokenizer import HFTokenizer, is_cjk, SentencePieceTokenizer, SUFFIX
from bertjax.runtime import fs

SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_WORD_CHARS = 200  # google-research/bert's max_input_chars_per_word (transformers: 100)


class WordPieceError(errors.UserError, ValueError):
  """A vocabulary file that is missing, empty or lacks BERT's special tokens."""


# ------------------------------------------------------------------------- vocabulary files


def read_vocab(path: str | os.PathLike) -> list[str]:
  """Pieces of a `vocab.txt`, one per line, stripped of surrounding whitespace as
  google-research/bert's load_vocab does; line number = id."""
  shown, path = epath.Path(path), fs.path(path)  # as the user wrote it; to read
  if not path.is_file():
    raise WordPieceError(f"{shown}: vocabulary not found")
  try:
    # Newlines as `open` translates them ("\r\n" -> "\n"); an object store's text mode does not.
    text = path.read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
  except UnicodeDecodeError as e:
    raise WordPieceError(
        f"{shown}: not UTF-8 text at byte {e.start}; is this a vocab.txt?"
    ) from None
  pieces = text.split("\n")
  if pieces and pieces[-1] == "":
    pieces.pop()  # the final newline
  pieces = [p.strip() for p in pieces]
  missing = [s for s in SPECIAL_PIECES if s not in pieces]
  if missing:
    raise WordPieceError(
        f"{shown}: special token {missing[0]} is missing; a BERT vocab.txt "
        f"holds {', '.join(SPECIAL_PIECES)}"
    )
  return pieces


def infer_lower_case(path: str | os.PathLike, pieces: Sequence[str] | None = None) -> bool:
  """Whether `vocab.txt` belongs to an uncased model.

  A `tokenizer_config.json` beside it (Hugging Face) decides when present; otherwise a vocab
  with capitalised pieces is cased (an uncased model never sees upper case, so its vocab has
  none beyond a handful of odd symbols).
  """
  config = fs.path(path).parent / "tokenizer_config.json"
  if config.is_file():
    try:
      value = json.loads(config.read_text()).get("do_lower_case")
    except json.JSONDecodeError:
      value = None
    if isinstance(value, bool):
      return value
  pieces = read_vocab(path) if pieces is None else pieces
  words = [p for p in pieces if not (p.startswith("[") and p.endswith("]"))]
  upper = sum(1 for p in words if p != p.lower())
  return upper <= max(2, len(words) // 1000)


# --------------------------------------------------------------------- basic tokenization


def _is_control(ch: str) -> bool:
  """google's _is_control: Cc and Cf, except tab/newline/CR (whitespace)."""
  return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")


def _is_whitespace(ch: str) -> bool:
  return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def is_punctuation(ch: str) -> bool:
  cp = ord(ch)
  # ASCII symbols such as "$", "^" and "`" are not Unicode "P*" but BERT splits on them.
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(ch).startswith("P")


def basic_tokenize(text: str, lower_case: bool) -> list[str]:
  """Steps 1-4 of the module docstring: words and punctuation marks, before WordPiece."""
  chars = []
  for ch in text:
    if ch in ("\x00", "\ufffd") or _is_control(ch):
      continue
    if _is_whitespace(ch):
      chars.append(" ")
    elif is_cjk(ch):
      chars.extend((" ", ch, " "))
    else:
      chars.append(ch)
  words = []
  for token in "".join(chars).split():
    if lower_case:
      token = "".join(
          c for c in unicodedata.normalize("NFD", token.lower()) if unicodedata.category(c) != "Mn"
      )
    current = []
    for ch in token:
      if is_punctuation(ch):
        if current:
          words.append("".join(current))
          current = []
        words.append(ch)
      else:
        current.append(ch)
    if current:
      words.append("".join(current))
  return words


def _normalise(token: str) -> str:
  return "".join(
      c for c in unicodedata.normalize("NFD", token.lower()) if unicodedata.category(c) != "Mn"
  )


def basic_tokenize_with_offsets(text: str, lower_case: bool) -> list[tuple[str, int]]:
  """`basic_tokenize`'s words, each with the index in `text` of the character it begins with.

  Lowercasing and accent stripping change lengths, so within a whitespace-separated token the
  words after the first are placed through the characters each source character became; where
  that differs from normalising the token whole (a final sigma), they take the token's start.
  """
  chars, source = [], []
  for i, ch in enumerate(text):
    if ch in ("\x00", "\ufffd") or _is_control(ch):
      continue
    if _is_whitespace(ch):
      chars.append(" ")
      source.append(i)
    elif is_cjk(ch):
      chars.extend((" ", ch, " "))
      source.extend((i, i, i))
    else:
      chars.append(ch)
      source.append(i)
  joined = "".join(chars)
  words = []
  for match in re.finditer(r"\S+", joined):  # str.split()'s whitespace
    token, where = match.group(), source[match.start() : match.end()]
    if lower_case:
      parts = [_normalise(c) for c in token]
      normal = _normalise(token)
      if "".join(parts) == normal:
        where = [w for part, w in zip(parts, where) for _ in part]
      else:
        where = [where[0]] * len(normal)
      token = normal
    start = None
    for k, ch in enumerate(token):
      if is_punctuation(ch):
        if start is not None:
          words.append((token[start:k], where[start]))
          start = None
        words.append((ch, where[k]))
      elif start is None:
        start = k
    if start is not None:
      words.append((token[start:], where[start]))
  return words


def wordpiece_split(word: str, vocab: dict[str, int], unk_id: int) -> list[int]:
  """Greedy longest-match-first split of one word; [UNK] when no complete split exists."""
  if len(word) > MAX_WORD_CHARS:
    return [unk_id]
  ids, start = [], 0
  while start < len(word):
    end = len(word)
    while end > start:
      piece = word[start:end] if start == 0 else SUFFIX + word[start:end]
      if piece in vocab:
        ids.append(vocab[piece])
        break
      end -= 1
    else:
      return [unk_id]
    start = end
  return ids


# ------------------------------------------------------------------------------ Python API


class WordPieceTokenizer:
  """A BERT WordPiece vocabulary with the interface of `bertjax.data.tokenizer.Tokenizer`."""

  def __init__(self, path: str | os.PathLike, lower_case: bool | None = None):
    self.path = fs.path(path)
    self._pieces = read_vocab(path)
    # Later duplicates win, as in transformers' load_vocab; ids stay line numbers.
    self._vocab = {p: i for i, p in enumerate(self._pieces)}
    self.lower_case = (
        infer_lower_case(self.path, self._pieces) if lower_case is None else bool(lower_case)
    )
    self.sha256 = hashlib.sha256(self.path.read_bytes()).hexdigest()
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        self._vocab[s] for s in SPECIAL_PIECES
    )
    self._special = {self.pad_id, self.cls_id, self.sep_id, self.mask_id}
    self._word_start = [not p.startswith(SUFFIX) for p in self._pieces]

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def tokenize(self, text: str) -> list[str]:
    return [self._pieces[i] for i in self.encode(text)]

  def encode(self, text: str) -> list[int]:
    ids = []
    for word in basic_tokenize(text, self.lower_case):
      ids.extend(wordpiece_split(word, self._vocab, self.unk_id))
    return ids

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
    """`encode`'s ids and, for each, the index in `text` of the character its word begins
    with: "##" pieces share their word's (word boundaries for a segmenter, segment.py)."""
    ids, offsets = [], []
    for word, start in basic_tokenize_with_offsets(text, self.lower_case):
      pieces = wordpiece_split(word, self._vocab, self.unk_id)
      ids.extend(pieces)
      offsets.extend([start] * len(pieces))
    return ids, offsets

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    del num_threads  # pure Python; use `wordpiece_tf_tokenize` for throughput
    return [self.encode(t) for t in texts]

  def decode(self, ids: Iterable[int]) -> str:
    """Pieces joined with "##" continuations merged; [PAD]/[CLS]/[SEP]/[MASK] dropped.

    Lossy, as BERT's basic tokenization is: spaces around punctuation stay, and uncased
    models return lower-case, accent-free text.
    """
    pieces = [self._pieces[int(i)] for i in ids if int(i) not in self._special]
    return " ".join(pieces).replace(" " + SUFFIX, "").removeprefix(SUFFIX)

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def piece_to_id(self, piece: str) -> int:
    return self._vocab.get(piece, self.unk_id)

  def is_word_start(self, i: int) -> bool:
    """True unless piece `i` continues a word ("##" prefix)."""
    return self._word_start[int(i)]

  def word_start_table(self) -> list[bool]:
    """`is_word_start` for every id, for vectorised whole-word masking."""
    return list(self._word_start)

  def __repr__(self) -> str:
    return (
        f"WordPieceTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, "
        f"lower_case={self.lower_case})"
    )


def load_tokenizer(path: str | os.PathLike, lower_case: bool | None = None):
  """The tokenizer for `path`: SentencePiece for a `.model`, WordPiece for a vocab `.txt`,
  transformers' `tokenizer.json` (`tokenizer.HFTokenizer`).

  A directory is searched for `tokenizer.model`, `vocab.txt`, `tokenizer.json`,
  `spiece.model`, `sentencepiece.bpe.model`, in that order. `lower_case` applies to
  WordPiece only (None: from tokenizer_config.json beside it, else from the vocab).
  """
  path = epath.Path(path)  # as the user wrote it: read through fs.path, named in errors
  if fs.path(path).is_dir():
    # A checkpoint's directory (transformers, Google's) holds its tokenizer under one of these.
    names = ("tokenizer.model", "vocab.txt", "tokenizer.json", "spiece.model")
    for name in names + ("sentencepiece.bpe.model",):
      if fs.path(path / name).is_file():
        return load_tokenizer(path / name, lower_case)
    raise WordPieceError(f"{path}: no {', '.join(names)} in this directory")
  if path.suffix == ".json":  # transformers' tokenizer.json, run by the `tokenizers` library
    return HFTokenizer(path)
  if path.suffix == ".model":
    return SentencePieceTokenizer(path)
  if path.suffix == ".txt":
    return WordPieceTokenizer(path, lower_case)
  raise WordPieceError(
      f"{path}: unknown tokenizer type; expected a SentencePiece .model, a "
      "WordPiece vocab .txt or a transformers tokenizer.json"
  )


# ------------------------------------------------------------------------------ TF graph op

# Cc characters other than tab/newline/CR, Cf characters and U+FFFD: google-research/bert
# deletes them (so "ab<NUL>cd" is one word); FastBertTokenizer would turn them into spaces.
_CONTROL_RE = "[^\\P{Cc}\t\n\r]|\\p{Cf}|\\x{fffd}"


def wordpiece_tf_tokenize(
    vocab_path: str | os.PathLike, lower_case: bool | None = None
) -> Callable:
  """A function string tensor -> int32 ids, usable inside `tf.data.Dataset.map`.

  A [B] tensor gives a [B, None] `tf.RaggedTensor`; a scalar gives a 1-D int32 tensor.
  Same ids as `WordPieceTokenizer(vocab_path, lower_case).encode` (tests check both against
  transformers' `BertTokenizer`).
  """
  # Here, not at the top: the pure-Python tokenizer above must not load TensorFlow.
  import tensorflow as tf
  import tensorflow_text as tf_text

  pieces = read_vocab(vocab_path)
  if lower_case is None:
    lower_case = infer_lower_case(vocab_path, pieces)
  # FastWordpieceTokenizer needs unique pieces; for a repeated one the last id wins, as in
  # `WordPieceTokenizer` and transformers, and earlier copies become unreachable names.
  last = {p: i for i, p in enumerate(pieces)}
  pieces = [p if last[p] == i else f"[duplicate {i}]" for i, p in enumerate(pieces)]
  op = tf_text.FastBertTokenizer(
      vocab=pieces,
      suffix_indicator=SUFFIX,
      token_out_type=tf.int32,
      unknown_token="[UNK]",
      # Lowercasing and accent stripping happen below: the op's own normaliser also folds
      # compatibility forms (fullwidth "，" -> ","), which BERT's does not.
      lower_case_nfd_strip_accents=False,
      # Bytes, not characters: equal to google's 200-character limit for ASCII words; a
      # non-ASCII word of 51-200 characters (e.g. 101+ Cyrillic letters) is [UNK] here only.
      max_bytes_per_word=MAX_WORD_CHARS,
  )

  def tokenize(text):
    text = tf.convert_to_tensor(text, tf.string)
    text = tf.strings.regex_replace(text, _CONTROL_RE, "")
    if lower_case:
      text = tf_text.normalize_utf8(tf.strings.lower(text, encoding="utf-8"), "NFD")
      text = tf.strings.regex_replace(text, "\\p{Mn}", "")
    if text.shape.rank == 0:
      return op.tokenize(text[None])[0]
    return op.tokenize(text)

  return tokenize
