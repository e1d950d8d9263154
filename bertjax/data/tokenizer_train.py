"""Training tokenizers: SentencePiece (`train_tokenizer`) and WordPiece (`train_wordpiece`).

`bertjax tokenizer train` runs these. The models they write are read by
`bertjax.data.tokenizer.SentencePieceTokenizer` and `bertjax.data.wordpiece.WordPieceTokenizer`
(`wordpiece.load_tokenizer` picks one for a file), with BERT's special tokens at the ids
`bertjax.data.tokenizer` fixes. Training text may be local or `gs://...`: SentencePiece trains
on local copies of remote text.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import json
import os
import pathlib
import sys
import tempfile
from typing import Sequence

import sentencepiece as spm
from etils import epath

from bertjax import errors
from bertjax.data import corpus, text, wordpiece
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


def _text_files(files: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
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
  named, skipped = _text_files(expand_inputs(inputs))
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


# ------------------------------------------------------------------- WordPiece (vocab.txt)

WORDPIECE_CONFIG = "tokenizer_config.json"


def _check_wordpiece_output(output_dir: str, overwrite: bool) -> None:
  """`output_dir` is (or can become) a directory, and holds no vocab.txt (unless overwrite)."""
  out = fs.path(output_dir)
  if out.exists() and not out.is_dir():
    raise errors.ConfigError(
        f"output_dir {output_dir}: is a file — give a directory (vocab.txt and "
        f"{WORDPIECE_CONFIG} are written in it)"
    )
  if (out / "vocab.txt").exists() and not overwrite:
    raise errors.OutputExistsError(
        f"output_dir {output_dir}: {epath.Path(output_dir) / 'vocab.txt'} already exists — "
        "pass overwrite=True to replace it, or choose another output_dir"
    )
  outputs.missing_dirs(output_dir, "output_dir")


WORDPIECE_MIN_COUNT = 2  # a merge seen once is a memorised word, not a piece


def _merge_pieces(words: dict[tuple[str, ...], int], target: int, have: set[str]) -> list[str]:
  """New pieces, in order, from merging adjacent pieces of `words` (word as its pieces ->
  count): always the pair seen most often (ties: the smallest pair in code-point order, so the
  result depends on the corpus only), until `have` plus the new pieces reach `target`, or no pair
  is seen WORDPIECE_MIN_COUNT times. As `tokenizers`' WordPieceTrainer merges, without its
  order of ties, which varies from run to run."""
  symbols = [list(w) for w in words]
  counts = list(words.values())
  pairs: dict[tuple[str, str], int] = collections.Counter()
  where: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
  for i, (w, n) in enumerate(zip(symbols, counts)):
    for pair in zip(w, w[1:]):
      pairs[pair] += n
      where[pair].add(i)
  heap = [(-n, pair) for pair, n in pairs.items()]
  heapq.heapify(heap)
  new: list[str] = []
  while heap and len(have) < target:
    n, pair = heapq.heappop(heap)
    if -n != pairs.get(pair, 0):
      continue  # a stale count: the pair's current one is also on the heap
    if -n < WORDPIECE_MIN_COUNT:
      break
    a, b = pair
    merged = a + b[len(wordpiece.SUFFIX) :]
    if merged not in have:
      have.add(merged)
      new.append(merged)
    touched = set()
    for i in sorted(where.pop(pair)):
      w, c = symbols[i], counts[i]
      for old in zip(w, w[1:]):
        pairs[old] -= c
        touched.add(old)
      out, j = [], 0
      while j < len(w):
        if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
          out.append(merged)
          j += 2
        else:
          out.append(w[j])
          j += 1
      symbols[i] = out
      for fresh in zip(out, out[1:]):
        pairs[fresh] += c
        where[fresh].add(i)
        touched.add(fresh)
    for t in touched:
      if pairs[t] > 0:
        heapq.heappush(heap, (-pairs[t], t))
      else:
        pairs.pop(t, None)
        where.pop(t, None)
  return new


def train_wordpiece(
    inputs: Sequence[str],
    output_dir: str,
    vocab_size: int | None = None,
    lower_case: bool = True,
    overwrite: bool = False,
) -> "wordpiece.WordPieceTokenizer":
  """Trains a BERT WordPiece vocabulary: `output_dir/vocab.txt` and, beside it,
  `tokenizer_config.json` (`do_lower_case`, read by `wordpiece.load_tokenizer` and by
  transformers' `BertTokenizer.from_pretrained(output_dir)`).

  Words are those of BERT's own basic tokenization (`wordpiece.basic_tokenize`: control
  characters dropped, every CJK ideograph a word of its own, lowercasing and accent stripping
  when `lower_case`, a split at whitespace and punctuation), so the vocabulary is built on the
  words `WordPieceTokenizer` will split. Every character of the corpus gets an entry (a "##"
  one too where it continues a word): every CJK ideograph is its own piece, as in
  `bert-base-chinese`. The rest is merged pieces, as `tokenizers`' WordPieceTrainer makes them
  (the most frequent adjacent pair first) but with ties broken by code point, so the same
  corpus gives the same file (that trainer's ties follow hash order: two runs on one corpus
  gave 566 to 570 entries in six runs). Ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK], as
  in a SentencePiece model here; then the characters, the "##" characters, the merges in order.

  `vocab_size` (None: DEFAULT_VOCAB_SIZE, or what the corpus gives) counts every entry; one
  too small for the corpus's characters, or more than the corpus supports, is an error naming
  the size that trains. Inputs are checked as `train_tokenizer` checks them.
  """
  if vocab_size is not None and vocab_size < NUM_SPECIAL + 1:
    raise errors.ConfigError(
        f"TrainOptions.vocab_size={vocab_size} is too small: it must be >= {NUM_SPECIAL + 1}"
    )
  named, skipped = _text_files(expand_inputs(inputs))
  _check_wordpiece_output(output_dir, overwrite)
  target = vocab_size or DEFAULT_VOCAB_SIZE
  counts: collections.Counter = collections.Counter()
  for path in named:
    with fs.open_text(path) as f:
      for line in f:
        counts.update(wordpiece.basic_tokenize(line, lower_case))
  words: dict[tuple[str, ...], int] = {}
  for word, n in counts.items():
    if len(word) <= wordpiece.MAX_WORD_CHARS:  # longer ones are [UNK] whatever the vocab
      words[(word[0],) + tuple(wordpiece.SUFFIX + ch for ch in word[1:])] = n
  alphabet = sorted({w[0] for w in words}) + sorted({p for w in words for p in w[1:]})
  pieces = list(SPECIAL_PIECES) + [p for p in alphabet if p not in SPECIAL_PIECES]
  pieces += _merge_pieces(words, target, set(pieces))
  cjk = [p for p in pieces if len(p) == 1 and wordpiece.is_cjk(p)]
  if vocab_size is not None and len(pieces) != vocab_size:
    if len(pieces) > vocab_size:
      why = (
          f"is less than the {len(pieces)} entries the corpus's characters need (each character, "
          "and each that continues a word as a ## piece, has one)"
      )
      fix = f"TrainOptions.vocab_size >= {len(pieces)}"
    else:
      why = f"is more than this corpus supports: merging finds {len(pieces)} pieces"
      fix = f"TrainOptions.vocab_size <= {len(pieces)}, or train on more text"
    raise errors.ConfigError(f"TrainOptions.vocab_size={vocab_size} {why} — use {fix}")
  out = fs.path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  config = {
      "tokenizer_class": "BertTokenizer",
      "do_lower_case": lower_case,
      "tokenize_chinese_chars": True,
      "strip_accents": None,
      "unk_token": "[UNK]",
      "sep_token": "[SEP]",
      "pad_token": "[PAD]",
      "cls_token": "[CLS]",
      "mask_token": "[MASK]",
  }
  (out / WORDPIECE_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
  data = ("\n".join(pieces) + "\n").encode("utf-8")
  if fs.is_local(output_dir):  # as `_install`: never a half-written vocab.txt under its name
    tmp = out / "vocab.txt.tmp"
    tmp.write_bytes(data)
    tmp.replace(out / "vocab.txt")
  else:
    (out / "vocab.txt").write_bytes(data)
  for path, why in skipped:
    print(f"tokenizer: {path}: {why} (skipped)", file=sys.stderr)
  print(
      f"tokenizer: {len(pieces)} WordPiece entries, {len(cjk)} of them CJK ideographs "
      f"({'uncased' if lower_case else 'cased'})",
      file=sys.stderr,
  )
  if vocab_size is None and len(pieces) != target:
    more = "more text gives more" if len(pieces) < target else "each character needs an entry"
    print(
        f"tokenizer: {len(pieces)} entries instead of the default {target} ({more})",
        file=sys.stderr,
    )
  return wordpiece.WordPieceTokenizer(out / "vocab.txt", lower_case=lower_case)
