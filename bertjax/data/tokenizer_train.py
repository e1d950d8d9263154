"""Training a SentencePiece tokenizer (`train_tokenizer`, `bertjax tokenizer train`).

The model it writes is read by `bertjax.data.tokenizer.SentencePieceTokenizer`, with BERT's
special tokens at the ids `bertjax.data.tokenizer` fixes. Training text may be local or
`gs://...`: SentencePiece trains on local copies of remote text. The inputs' checks here
(`expand_inputs`, `text_files`) serve WordPiece training too (wordpiece_train.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pathlib
import sys
import tempfile
from typing import Sequence

import sentencepiece as spm
from etils import epath

from bertjax import errors
from bertjax.data import corpus, text
from bertjax.data.coverage import MIN_COVERAGE, choose_character_coverage, count_characters
from bertjax.data.tokenizer import (
    NUM_SPECIAL,
    PAD_ID,
    SentencePieceTokenizer,
    SPECIAL_PIECES,
    TokenizerError,
    UNK_ID,
)
from bertjax.runtime import fs, outputs

DEFAULT_VOCAB_SIZE = 8000  # BERT's own is 30522; 8k suits a few MB of text


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  # Pieces, the special ones included. None: DEFAULT_VOCAB_SIZE, or the most the corpus
  # supports when that is fewer (printed); a number is exact, and a corpus that supports
  # fewer pieces is an error giving the largest size it does.
  vocab_size: int | None = None
  model_type: str = "unigram"  # or "bpe"
  # Fraction of character occurrences whose characters get their own piece. None: 1.0 when
  # every character fits in the vocabulary (alphabetic scripts), else the largest coverage
  # whose characters fill at most CHARACTER_SHARE of it (Chinese, Japanese: the rare
  # characters fall back to UTF-8 bytes). `train_tokenizer` prints what it chose.
  character_coverage: float | None = None
  # Characters outside the coverage become UTF-8 byte pieces instead of [UNK].
  byte_fallback: bool = True
  # Sentences sampled for training: memory stays bounded on a large corpus.
  input_sentence_size: int = 2_000_000
  num_threads: int = max(1, os.cpu_count() or 1)


def min_vocab_size(byte_fallback: bool = True) -> int:
  """The smallest vocabulary trained here: the special pieces, the byte pieces, 10 more."""
  return NUM_SPECIAL + (256 if byte_fallback else 0) + 10


def check_options(options: TrainOptions) -> None:
  """Every field in range; errors name the field (`TrainOptions.vocab_size=100 ...`)."""
  if options.model_type not in ("unigram", "bpe"):
    raise errors.ConfigError(
        f"TrainOptions.model_type={options.model_type!r}: valid options are 'unigram', 'bpe'"
    )
  minimum = min_vocab_size(options.byte_fallback)
  if options.vocab_size is not None and options.vocab_size < minimum:
    raise errors.ConfigError(
        f"TrainOptions.vocab_size={options.vocab_size} is too small: it must be >= {minimum} "
        "(5 special pieces"
        + (" + 256 byte pieces" if options.byte_fallback else "")
        + " + 10 others)"
    )
  coverage = options.character_coverage
  if coverage is not None and not MIN_COVERAGE <= coverage <= 1.0:
    raise errors.ConfigError(
        f"TrainOptions.character_coverage={coverage} must be between {MIN_COVERAGE} and 1 "
        "(SentencePiece's range); leave it unset to have it chosen"
    )
  for name in ("input_sentence_size", "num_threads"):
    if getattr(options, name) < 1:
      raise errors.ConfigError(f"TrainOptions.{name}={getattr(options, name)} must be >= 1")


expand_inputs = corpus.expand_inputs  # globs -> files, one-line errors (used by both commands)


def _has_text(path: str) -> bool:
  with fs.open_text(path) as f:
    return any(line.strip() for line in f)


def text_files(files: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """(files to train on, [(file, why skipped)]): empty, blank and binary files are skipped;
  a compressed file is an error (SentencePiece reads plain text); no text at all is one."""
  kept, skipped = [], []
  for path in files:
    kind = corpus.compression(path)
    if kind:
      raise errors.BadInputError(
          f"{path}: {kind}-compressed — decompress it first (the tokenizer trains on plain "
          "text, one sentence per line)"
      )
    if corpus.file_size(path) == 0:
      skipped.append((path, text.EMPTY_FILE))
    elif corpus.is_binary(path):
      skipped.append((path, text.BINARY_FILE))
    elif not _has_text(path):
      skipped.append((path, text.BLANK_FILE))
    else:
      kept.append(path)
  if not kept:
    shown = "; ".join(f"{p}: {why}" for p, why in skipped[:3])
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    raise errors.BadInputError(
        f"no text to train on ({shown}{more}) — give text files, one sentence per line"
    )
  return kept, skipped


def _check_output(output_prefix: str, overwrite: bool) -> None:
  """The prefix names files in a writable directory, and none exists (unless overwrite)."""
  prefix = fs.path(output_prefix)
  if output_prefix.endswith(("/", os.sep)) or prefix.is_dir():
    raise errors.ConfigError(
        f"output_prefix {output_prefix}: is a directory — give a prefix of file names, e.g. "
        f"{epath.Path(output_prefix) / 'tokenizer'} (writes tokenizer.model and tokenizer.vocab "
        "there)"
    )
  for suffix in (".model", ".vocab"):
    if fs.path(output_prefix + suffix).exists() and not overwrite:
      raise errors.OutputExistsError(
          f"output_prefix {output_prefix}: {output_prefix}{suffix} already exists — "
          "pass overwrite=True to replace it, or choose another output_prefix"
      )
  outputs.missing_dirs(output_prefix, "output_prefix", start=prefix.parent)


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


def _sentencepiece_train(
    files: list[str], prefix: pathlib.Path, vocab_size: int, coverage: float, options: TrainOptions
) -> None:
  """SentencePiece's trainer with BERT's special pieces; its log is kept unless it fails."""
  log = prefix.with_name("spm.log")
  try:
    with _stderr_to(log):
      spm.SentencePieceTrainer.train(
          input=files,
          model_prefix=str(prefix),
          vocab_size=vocab_size,
          model_type=options.model_type,
          character_coverage=coverage,
          byte_fallback=options.byte_fallback,
          input_sentence_size=options.input_sentence_size,
          shuffle_input_sentence=True,
          num_threads=options.num_threads,
          # A corpus too small for vocab_size gives fewer pieces rather than an error, so
          # that the caller can say how many it supports (or take them, by default).
          hard_vocab_limit=False,
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
    raise TokenizerError(f"tokenizer training failed: {message}") from None


def _varint(n: int) -> bytes:
  out = bytearray()
  while n >= 0x80:
    out.append(n & 0x7F | 0x80)
    n >>= 7
  return bytes(out + bytes([n]))


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
  value = shift = 0
  while buf[pos] >= 0x80:
    value, pos, shift = value | (buf[pos] & 0x7F) << shift, pos + 1, shift + 7
  return value | buf[pos] << shift, pos + 1


def _with_field(message: bytes, number: int, edit) -> bytes:
  """`message` (serialized protobuf) with the payload of length-delimited field `number`
  replaced by `edit(payload)`; every other byte kept, so the result is what SentencePiece
  itself would have serialized."""
  out, pos = bytearray(), 0
  while pos < len(message):
    start, (tag, pos) = pos, _read_varint(message, pos)
    wire = tag & 7
    if wire == 2:
      n, body = _read_varint(message, pos)
      pos = body + n
      if tag >> 3 == number:
        payload = edit(message[body:pos])
        out += _varint(tag) + _varint(len(payload)) + payload
        continue
    else:  # varint, 64-bit or 32-bit
      pos = _read_varint(message, pos)[1] if wire == 0 else pos + (8 if wire == 1 else 4)
    out += message[start:pos]
  return bytes(out)


def _install(trained: pathlib.Path, output_prefix: str, inputs: Sequence[str]) -> None:
  """Writes PREFIX.model and PREFIX.vocab; a local one under temporary names beside their
  place, then renamed, so an interrupted copy never leaves a half-written model under the final
  name (an object store publishes an object only once it is whole).

  A model records the prefix it was trained with (ModelProto.trainer_spec.model_prefix,
  fields 2 and 2) and its input files (trainer_spec.input, fields 2 and 1, in order): set to
  `output_prefix` and to `inputs`, the files as the user named them, so the bytes, hence the
  sha256, are those of training there directly, whatever the temporary directory or the local
  copies of remote text were called.
  """

  def spec(payload: bytes) -> bytes:
    names = iter(name.encode() for name in inputs)
    payload = _with_field(payload, 1, lambda trained_on: next(names, trained_on))
    return _with_field(payload, 2, lambda _: output_prefix.encode())

  model = _with_field(pathlib.Path(f"{trained}.model").read_bytes(), 2, spec)
  vocab = pathlib.Path(f"{trained}.vocab").read_bytes()
  fs.path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
  for suffix, data in ((".vocab", vocab), (".model", model)):  # the model last: it means "done"
    if not fs.is_local(output_prefix):
      fs.path(output_prefix + suffix).write_bytes(data)
      continue
    tmp = fs.path(f"{output_prefix}{suffix}.tmp")
    tmp.write_bytes(data)
    tmp.replace(fs.path(output_prefix + suffix))


def _largest(
    files: list[str],
    scratch: pathlib.Path,
    got: int,
    coverage: float,
    counts: collections.Counter | None,
    options: TrainOptions,
) -> int:
  """The largest vocabulary the corpus supports, after SentencePiece gave `got` pieces for a
  larger one at `coverage`. With the coverage chosen from the size, `got` pieces may get a
  smaller coverage, hence fewer pieces: retrained until the size holds, so that the size an
  error names is one that trains (tiny corpora only; a large one keeps coverage 1.0)."""
  while counts is not None:
    smaller, _ = choose_character_coverage(counts, got, options.byte_fallback)
    if smaller == coverage:
      break
    _sentencepiece_train(files, scratch, got, smaller, options)
    coverage, fewer = smaller, SentencePieceTokenizer(f"{scratch}.model").vocab_size
    if fewer >= got:
      break
    got = fewer
  return got


def train_tokenizer(
    inputs: Sequence[str],
    output_prefix: str,
    options: TrainOptions = TrainOptions(),
    overwrite: bool = False,
) -> SentencePieceTokenizer:
  """Trains `output_prefix.model` + `.vocab` on text files (one sentence per line).

  Everything is checked before anything is written: the options, the inputs (empty, blank
  and binary files are skipped and printed), and the output (an existing model is refused
  unless `overwrite`). Training runs in a temporary directory; a corpus that supports fewer
  pieces than an explicit `options.vocab_size` is an error naming the largest it supports.
  Prints the character coverage, and the vocabulary size when the default could not be met.
  """
  check_options(options)
  named, skipped = text_files(expand_inputs(inputs))
  _check_output(output_prefix, overwrite)
  vocab_size = options.vocab_size or DEFAULT_VOCAB_SIZE
  coverage, counts = options.character_coverage, None
  # SentencePiece reads local files only: remote text is copied to a temporary directory.
  with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
    files = [stack.enter_context(fs.local_copy(f)) for f in named]
    if coverage is None:
      counts = count_characters(files)
      coverage, kept = choose_character_coverage(counts, vocab_size, options.byte_fallback)
    trained = pathlib.Path(tmp) / "spm"  # scratch, never a user path
    _sentencepiece_train(files, trained, vocab_size, coverage, options)
    got = SentencePieceTokenizer(f"{trained}.model").vocab_size
    if got < vocab_size and options.vocab_size is not None:
      most = _largest(files, trained, got, coverage, counts, options)
      raise errors.ConfigError(
          f"TrainOptions.vocab_size={vocab_size} is more than this corpus supports: "
          f"SentencePiece's {options.model_type} model finds at most {most} pieces in it — use "
          f"TrainOptions.vocab_size <= {most}, or train on more text"
      )
    _install(trained, output_prefix, named)
  for path, why in skipped:
    print(f"tokenizer: {path}: {why} (skipped)", file=sys.stderr)
  if counts is None:
    line = f"character coverage {coverage} (as given)"
  elif coverage < 1.0:
    rest = "UTF-8 byte pieces" if options.byte_fallback else "[UNK]"
    line = (
        f"character coverage {coverage}: {vocab_size} pieces cannot hold every character of "
        f"the corpus, so about the {kept} most frequent of {len(counts)} get pieces and rarer "
        f"ones become {rest} (a coverage set explicitly overrides this)"
    )
  else:
    line = f"character coverage 1.0: each of the {len(counts)} distinct characters has a piece"
  print(f"tokenizer: {line}", file=sys.stderr)
  if got < vocab_size:
    print(
        f"tokenizer: {got} pieces, the most this corpus supports (fewer than the default "
        f"{vocab_size}; more text gives more)",
        file=sys.stderr,
    )
  return SentencePieceTokenizer(output_prefix + ".model")
