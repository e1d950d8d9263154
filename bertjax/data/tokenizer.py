"""Reading tokenizers, with BERT's special tokens at fixed ids.

The `Tokenizer` interface, SentencePiece models and Hugging Face `tokenizer.json` files
(`wordpiece.py` reads a BERT vocab.txt; `tokenizer_train.py` trains tokenizers).
Every model trained by `tokenizer_train.train_tokenizer` (or `bertjax tokenizer train`) has

    id  piece    role
    0   [PAD]    padding; attention_mask is 0 here
    1   [UNK]    unknown piece (rare: byte fallback covers unseen characters)
    2   [CLS]    first token of every example; NSP/SOP head reads it
    3   [SEP]    ends segment A and segment B
    4   [MASK]   replaces 80% of the tokens chosen for MLM

[CLS], [SEP] and [MASK] are SentencePiece *control* symbols: `encode` never produces them from
text (the string "[MASK]" in a corpus is tokenized as ordinary characters), so the only way
into a sequence is the input pipeline. Word starts carry SentencePiece's "▁" prefix, which the
whole-word masking option uses.

Tokenizer files may be local or `gs://...`: they are read through `bertjax.runtime.fs`
(etils.epath); SentencePiece loads a model from its bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import typing
from typing import Iterable, Sequence

import sentencepiece as spm
from etils import epath

from bertjax import errors
from bertjax.runtime import fs

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
NUM_SPECIAL = len(SPECIAL_PIECES)
WORD_START = "\u2581"  # "▁", SentencePiece's whitespace marker
SUFFIX = "##"  # WordPiece's mark of a piece that continues a word

# CJK Unified Ideographs blocks, exactly as google-research/bert's _is_chinese_char. Hangul and
# Japanese kana are not in them: those are split on whitespace like any alphabet.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_cjk(ch: str) -> bool:
  cp = ord(ch)
  return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _starts_word(piece: str) -> bool:
  return piece.startswith(WORD_START) or (bool(piece) and is_cjk(piece[0]))


class TokenizerError(errors.UserError, ValueError):
  """A tokenizer file that is missing, damaged, or lacks BERT's special tokens."""


@typing.runtime_checkable
class Tokenizer(typing.Protocol):
  """What every task and the data pipeline use of a tokenizer.

  `SentencePieceTokenizer` (below) and `wordpiece.WordPieceTokenizer` satisfy it;
  `wordpiece.load_tokenizer(path)` returns the one a file needs. `HFTokenizer` (a Hugging Face
  tokenizer.json) satisfies it too; the tasks read one (`bertjax.tasks.encoder`).
  """

  path: epath.Path
  sha256: str
  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int

  @property
  def vocab_size(self) -> int:
    ...

  def encode(self, text: str) -> list[int]:
    ...

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    ...

  def decode(self, ids: Iterable[int]) -> str:
    ...

  def id_to_piece(self, i: int) -> str:
    ...

  def piece_to_id(self, piece: str) -> int:
    ...

  def is_word_start(self, i: int) -> bool:
    ...

  def word_start_table(self) -> list[bool]:
    ...


class SentencePieceTokenizer:
  """A loaded SentencePiece model; ids of the special tokens are the constants above."""

  def __init__(self, path: str | os.PathLike):
    shown, self.path = epath.Path(path), fs.path(path)  # as the user wrote it; to read
    if not self.path.is_file():
      raise TokenizerError(
          f"{shown}: tokenizer model not found " "(train one with `bertjax tokenizer train`)"
      )
    blob = self.path.read_bytes()  # loaded from bytes: any file system, no local copy
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(blob)
    except Exception:  # sentencepiece raises RuntimeError/OSError by version
      raise TokenizerError(
          f"{shown}: not a SentencePiece model, or truncated " f"({len(blob)} bytes)"
      ) from None
    found = tuple(self._sp.id_to_piece(i) for i in range(min(NUM_SPECIAL, len(self._sp))))
    if found != SPECIAL_PIECES:
      raise TokenizerError(
          f"{shown}: ids 0-4 are {found}, expected {SPECIAL_PIECES}; "
          "retrain it with `bertjax tokenizer train`"
      )
    self.sha256 = hashlib.sha256(blob).hexdigest()
    # The same attributes as `wordpiece.WordPieceTokenizer`, whose ids come from its vocab.
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        PAD_ID,
        UNK_ID,
        CLS_ID,
        SEP_ID,
        MASK_ID,
    )
    self._word_start = [
        i >= NUM_SPECIAL and _starts_word(self._sp.id_to_piece(i)) for i in range(len(self._sp))
    ]

  @property
  def vocab_size(self) -> int:
    return len(self._sp)

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    return self._sp.encode(list(texts), out_type=int, num_threads=num_threads)

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
    """`encode`'s ids and, for each, the index in `text` of the first character it covers
    after its "▁" (a lone "▁" covers none: the character after it). Byte pieces of one
    character share its index (word boundaries for a segmenter, segment.py)."""
    proto = self._sp.encode(text, out_type="proto")
    data = text.encode("utf-8")
    # UTF-8 byte offset -> character index.
    char_at = {}
    b = 0
    for i, ch in enumerate(text):
      char_at[b] = i
      b += len(ch.encode("utf-8"))
    char_at[b] = len(text)
    ids, offsets = [], []
    for piece in proto.pieces:
      begin = piece.begin
      while begin < piece.end and data[begin : begin + 1].isspace():
        begin += 1  # the whitespace "▁" stands for belongs to no word
      ids.append(piece.id)
      offsets.append(char_at.get(begin, char_at.get(piece.begin, 0)))
    return ids, offsets

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def piece_to_id(self, piece: str) -> int:
    return self._sp.piece_to_id(piece)

  def is_word_start(self, i: int) -> bool:
    """True when piece `i` begins a word: it has the "▁" prefix, or begins with a CJK
    ideograph (each is its own word, as google-research/bert splits Chinese); False for
    special tokens."""
    return self._word_start[int(i)]

  def word_start_table(self) -> list[bool]:
    """`is_word_start` for every id, for vectorised whole-word masking."""
    return list(self._word_start)

  def __repr__(self) -> str:
    return f"SentencePieceTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


# The special-token entries of a transformers tokenizer_config.json, in the order of
# `Tokenizer`'s attributes pad/unk/cls/sep/mask, and the pieces assumed when it names none.
_HF_SPECIAL_FIELDS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")


class HFTokenizer:
  """A Hugging Face `tokenizer.json`, read with the `tokenizers` package (the `interop` extra):
  what ModernBERT ships (a byte-level BPE) instead of a vocab.txt or a SentencePiece .model.

  Text is encoded without the file's own [CLS]/[SEP] template, padding or truncation: the tasks
  add the special tokens, as for the other tokenizers. Those are found by their pieces:
  the ones tokenizer_config.json beside the file names, else BERT's ([PAD], [UNK], [CLS],
  [SEP], [MASK]), which ModernBERT's tokenizer has too, at ids above its BPE vocabulary.
  """

  def __init__(self, path: str | os.PathLike):
    self._shown, self.path = epath.Path(path), fs.path(path)  # as the user wrote it; to read
    shown = self._shown
    if not self.path.is_file():
      raise TokenizerError(f"{shown}: tokenizer file not found")
    try:
      from tokenizers import Tokenizer as _Tokenizer  # the `interop` extra, only for this file
    except ImportError:
      raise TokenizerError(
          f"{shown}: reading a tokenizer.json needs the `tokenizers` package — install "
          "bertjax[interop], or pass a SentencePiece .model or WordPiece vocab.txt"
      ) from None
    blob = self.path.read_bytes()
    try:
      self._tok = _Tokenizer.from_str(blob.decode("utf-8"))
      model_type = json.loads(blob)["model"]["type"]
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
      raise TokenizerError(
          f"{shown}: not a Hugging Face tokenizer.json ({str(e).splitlines()[0]})"
      ) from None
    self._tok.no_padding()
    self._tok.no_truncation()
    self.sha256 = hashlib.sha256(blob).hexdigest()
    pieces = self._special_pieces()
    ids = [self._tok.token_to_id(p) for p in pieces]
    missing = [p for p, i in zip(pieces, ids) if i is None]
    if missing:
      raise TokenizerError(
          f"{shown}: no special tokens {missing} — name them in tokenizer_config.json "
          f"beside it ({', '.join(_HF_SPECIAL_FIELDS)}), or pass another tokenizer"
      )
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
    # RoBERTa's template puts two separators between a pair's segments (`tasks.inputs`)
    self.pair_separators = 2 if self._tok.num_special_tokens_to_add(True) == 4 else 1
    special = set(ids) | set(self._tok.get_added_tokens_decoder())
    if model_type == "WordPiece":
      starts = lambda p: not p.startswith(SUFFIX)
    else:  # byte-level BPE marks a preceding space "Ġ"; Metaspace models "▁"
      starts = lambda p: p.startswith(("\u0120", WORD_START))
    self._word_start = [
        i not in special and starts(self._tok.id_to_token(i) or "") for i in range(self.vocab_size)
    ]

  def _special_pieces(self) -> list[str]:
    config = self.path.parent / "tokenizer_config.json"
    named = {}
    if config.is_file():
      try:
        named = json.loads(config.read_text(encoding="utf-8"))
      except (ValueError, UnicodeDecodeError) as e:
        shown = self._shown.parent / config.name
        raise TokenizerError(f"{shown}: invalid JSON ({e})") from None
    pieces = []
    for field, default in zip(_HF_SPECIAL_FIELDS, SPECIAL_PIECES):
      value = named.get(field) or default
      pieces.append(value["content"] if isinstance(value, dict) else str(value))
    return pieces

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    del num_threads  # tokenizers picks its own parallelism
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def id_to_piece(self, i: int) -> str:
    return self._tok.id_to_token(int(i))

  def piece_to_id(self, piece: str) -> int:
    i = self._tok.token_to_id(piece)
    return self.unk_id if i is None else i

  def is_word_start(self, i: int) -> bool:
    """True when piece `i` begins with the model's space marker ("Ġ" byte-level, "▁"
    Metaspace) or, for a WordPiece model, does not continue a word ("##"); False for special
    and added tokens. Byte-level BPE marks no start on a text's first word."""
    return self._word_start[int(i)]

  def word_start_table(self) -> list[bool]:
    """`is_word_start` for every id, for vectorised whole-word masking."""
    return list(self._word_start)

  def __repr__(self) -> str:
    return f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"
