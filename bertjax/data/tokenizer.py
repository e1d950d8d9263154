"""SentencePiece tokenizer with BERT's special tokens at fixed ids.

Every model trained by `train_tokenizer` (or `bertjax tokenizer train`) has

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
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import hashlib
import os
import pathlib
import sys
import tempfile
import typing
import unicodedata
from typing import Iterable, Sequence

import sentencepiece as spm

from bertjax import errors
from bertjax.data import wordpiece

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
NUM_SPECIAL = len(SPECIAL_PIECES)
WORD_START = "\u2581"  # "▁", SentencePiece's whitespace marker


def _starts_word(piece: str) -> bool:
  return piece.startswith(WORD_START) or (bool(piece) and wordpiece.is_cjk(piece[0]))


class TokenizerError(errors.UserError, ValueError):
  """A tokenizer file that is missing, damaged, or lacks BERT's special tokens."""


@typing.runtime_checkable
class Tokenizer(typing.Protocol):
  """What every task and the data pipeline use of a tokenizer.

  `SentencePieceTokenizer` (below) and `wordpiece.WordPieceTokenizer` satisfy it;
  `wordpiece.load_tokenizer(path)` returns the one a file needs.
  """

  path: pathlib.Path
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
    self.path = pathlib.Path(path)
    if not self.path.is_file():
      raise TokenizerError(
          f"{self.path}: tokenizer model not found " "(train one with `bertjax tokenizer train`)"
      )
    blob = self.path.read_bytes()
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(blob)
    except Exception:  # sentencepiece raises RuntimeError/OSError by version
      raise TokenizerError(
          f"{self.path}: not a SentencePiece model, or truncated " f"({len(blob)} bytes)"
      ) from None
    found = tuple(self._sp.id_to_piece(i) for i in range(min(NUM_SPECIAL, len(self._sp))))
    if found != SPECIAL_PIECES:
      raise TokenizerError(
          f"{self.path}: ids 0-4 are {found}, expected {SPECIAL_PIECES}; "
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


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  vocab_size: int = 8000  # BERT's own is 30522; 8k suits a few MB of text
  model_type: str = "unigram"  # or "bpe"
  # Fraction of character occurrences whose characters get their own piece. None: 1.0 when
  # every character fits in the vocabulary (alphabetic scripts), else the largest coverage
  # whose characters fill at most CHARACTER_SHARE of it (Chinese, Japanese: the rare
  # characters fall back to UTF-8 bytes). `train_tokenizer` reports what it chose.
  character_coverage: float | None = None
  # Characters outside the coverage become UTF-8 byte pieces instead of [UNK].
  byte_fallback: bool = True
  # Sentences sampled for training: memory stays bounded on a large corpus.
  input_sentence_size: int = 2_000_000
  num_threads: int = max(1, os.cpu_count() or 1)


# With an automatic coverage, characters take at most this share of the vocabulary left after
# the special and byte pieces; the rest goes to multi-character pieces.
CHARACTER_SHARE = 0.7
MIN_COVERAGE = 0.98  # SentencePiece's lower bound on character_coverage
# Characters counted for the automatic coverage (the head of the corpus; SentencePiece itself
# samples `input_sentence_size` sentences).
_COUNT_CHARS = 200_000_000


def count_characters(files: Sequence[str], limit: int = _COUNT_CHARS) -> collections.Counter:
  """Occurrences of each non-space character (NFKC, as SentencePiece normalises) in `files`."""
  counts: collections.Counter = collections.Counter()
  seen = 0
  for path in files:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        line = unicodedata.normalize("NFKC", line)
        counts.update(line)
        seen += len(line)
        if seen >= limit:
          break
    if seen >= limit:
      break
  for ch in (" ", "\t", "\n", "\r"):
    counts.pop(ch, None)
  return counts


def choose_character_coverage(
    counts: collections.Counter, vocab_size: int, byte_fallback: bool = True
) -> tuple[float, int]:
  """(coverage, characters kept): 1.0 if every character fits, else the largest coverage
  whose most frequent characters fill at most CHARACTER_SHARE of the free vocabulary.

  SentencePiece accepts coverages in [MIN_COVERAGE, 1]: a vocabulary too small for the
  characters of MIN_COVERAGE of the text is an error that gives the size needed.
  """
  reserved = NUM_SPECIAL + (256 if byte_fallback else 0)
  free = vocab_size - reserved
  budget = int(CHARACTER_SHARE * free)
  if len(counts) <= budget:
    return 1.0, len(counts)
  total = sum(counts.values())
  ranked = [n for _, n in counts.most_common()]
  need, covered = 0, 0
  while covered < MIN_COVERAGE * total:  # characters SentencePiece keeps at MIN_COVERAGE
    covered += ranked[need]
    need += 1
  if need >= free:
    raise ValueError(
        f"vocab_size {vocab_size} is too small for this corpus: SentencePiece keeps every "
        f"character of {MIN_COVERAGE:.0%} of the text ({need} distinct ones here) plus "
        f"{reserved} special/byte pieces; use --vocab-size >= "
        f"{-(-int((need + reserved) / CHARACTER_SHARE) // 1000) * 1000}"
    )
  budget = max(budget, need)
  covered = sum(ranked[:budget])
  # Rounded down to 4 digits: SentencePiece then keeps at most `budget` characters.
  return max(int(covered / total * 1e4) / 1e4, MIN_COVERAGE), budget


def expand_inputs(patterns: Sequence[str]) -> list[str]:
  """Expands globs; a pattern matching nothing is an error naming it."""
  files = []
  for pattern in patterns:
    matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    matched = [m for m in matched if os.path.isfile(m)]
    if not matched:
      raise FileNotFoundError(f"{pattern}: no such file")
    files.extend(matched)
  return files


@contextlib.contextmanager
def _stderr_to(path: pathlib.Path):
  """Redirects file descriptor 2, where SentencePiece's C++ code logs, into `path`."""
  saved = os.dup(2)
  with open(path, "w") as f:
    os.dup2(f.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def train_tokenizer(
    inputs: Sequence[str], output_prefix: str, options: TrainOptions = TrainOptions()
) -> SentencePieceTokenizer:
  """Trains `output_prefix.model` + `.vocab` on text files (one sentence per line)."""
  if options.model_type not in ("unigram", "bpe"):
    raise ValueError(f"model_type {options.model_type!r}: valid options are 'unigram', 'bpe'")
  files = expand_inputs(inputs)
  minimum = NUM_SPECIAL + (256 if options.byte_fallback else 0) + 10
  if options.vocab_size < minimum:
    raise ValueError(
        f"vocab_size {options.vocab_size} is too small: need >= {minimum} "
        "(5 special tokens" + (" + 256 byte pieces)" if options.byte_fallback else ")")
    )
  coverage = options.character_coverage
  if coverage is None:
    coverage, kept = choose_character_coverage(
        count_characters(files), options.vocab_size, options.byte_fallback
    )
    if coverage < 1.0:
      rest = "UTF-8 byte pieces" if options.byte_fallback else "[UNK]"
      print(
          f"tokenizer: {options.vocab_size} pieces cannot hold every character of the "
          f"corpus: character coverage {coverage} (about the {kept} most frequent "
          f"characters get pieces; rarer ones become {rest}). "
          "--character-coverage overrides it",
          file=sys.stderr,
          flush=True,
      )
  pathlib.Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    # SentencePiece logs a page per run to stderr; keep it unless training fails.
    log = pathlib.Path(tmp) / "spm.log"
    try:
      with _stderr_to(log):
        spm.SentencePieceTrainer.train(
            input=files,
            model_prefix=output_prefix,
            vocab_size=options.vocab_size,
            model_type=options.model_type,
            character_coverage=coverage,
            byte_fallback=options.byte_fallback,
            input_sentence_size=options.input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=options.num_threads,
            hard_vocab_limit=False,  # small corpora: fewer pieces rather than a crash
            pad_id=PAD_ID,
            pad_piece="[PAD]",
            unk_id=UNK_ID,
            unk_piece="[UNK]",
            bos_id=-1,
            eos_id=-1,
            control_symbols=list(SPECIAL_PIECES[2:]),
            # Sentences are whole lines; digits split so numbers share pieces.
            split_digits=True,
            max_sentence_length=1 << 16,
            # Deterministic output for the same input.
            seed_sentencepiece_size=1_000_000,
        )
    except (RuntimeError, OSError) as e:
      lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()]
      detail = lines[-1] if lines else str(e)
      message = (str(e).strip() or detail).splitlines()[0]
      message = message.rsplit("] ", 1)[-1]  # drop SentencePiece's source location
      raise ValueError(f"tokenizer training failed: {message}") from None
  return SentencePieceTokenizer(output_prefix + ".model")
