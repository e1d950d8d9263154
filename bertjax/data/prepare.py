"""`bertjax prepare`: raw text or a TFDS corpus -> TFRecord shards of tokenized documents.

Streaming: the parent process reads each input in chunks of ~4 MB cut at document boundaries
(a document over 1 MB, even one line, is cut into several, so no line is ever held whole),
a pool of worker processes cleans, tokenizes and encodes them as TFRecords (in pure Python:
preparing text never imports TensorFlow), and the parent shuffles the documents as results
arrive in input order. At most `2 * processes` chunks are in flight, and the output does not
depend on the number of processes. Documents go to the held-out `eval` split by a hash of their
tokens, so the split is the same however the work is divided, and duplicates stay together.

Shuffle: input order is often correlated (one book per file, Wikipedia by title), and the
stream shuffles within blocks of consecutive documents, so each split is shuffled here, over
the whole corpus (this worker's part of it), with the seed `PrepareConfig.seed`. An external
shuffle keeps memory bounded: each document goes to a seeded-random pile file in a temporary
directory of the output; then each pile, of about `shuffle_bytes`, is read back, shuffled in
memory and dealt round-robin into the shards. Random piles in random order are a uniformly
random permutation, so any run of consecutive documents of a shard is a random sample of the
corpus. Memory: one pile (a pile over `shuffle_bytes`, e.g. from a TFDS corpus of unknown
size, is first scattered again into smaller ones); disk: the records twice, briefly.

Output: the shards are written in that temporary directory and moved into the output only when
all are complete, after removing this worker's old metadata; its new metadata is written last.
An interrupted run leaves the output as it was; finished data there is replaced only with
`overwrite` (`--overwrite`). Inputs compressed with gzip, bzip2 or xz (recognised by content)
are decompressed; a file that is mostly not UTF-8 text is skipped and counted.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import pathlib
import random
import shutil
import struct
import sys
import time
from typing import Iterator

import bz2
import gzip
import lzma
import multiprocessing
from tqdm import tqdm

from bertjax.data import records, text, tokenizer as tokenizer_lib, wordpiece
from bertjax.runtime import workdir_lock

# 2% of the documents: on the bundled corpus (273 chapters) ~5 chapters, ~18k tokens; on a
# Wikipedia-sized corpus far more than an evaluation reads, at 2% of the training text.
DEFAULT_EVAL_FRACTION = 0.02


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
  output: str  # output directory (created)
  tokenizer: str  # SentencePiece PREFIX.model (`bertjax tokenizer train`) or WordPiece vocab.txt
  inputs: tuple[str, ...] = ()  # text files or globs, google-research/bert format
  tfds: str | None = None  # NAME[:SPLIT] of a TFDS text dataset, instead of `inputs`
  tfds_data_dir: str | None = None  # where the TFDS dataset was downloaded/prepared
  tfds_text_key: str = "text"  # feature holding the document text
  num_shards: int = 8  # train shards per worker; >= the number of training hosts
  # Share of documents held out for pretrain's evaluation (eval-*.tfrecord); 0 holds none.
  eval_fraction: float = DEFAULT_EVAL_FRACTION
  eval_shards: int = 1  # eval shards per worker (when eval_fraction > 0)
  worker_index: int = 0  # this worker's index, for preparing on several machines
  num_workers: int = 1  # machines preparing the same corpus
  processes: int = max(1, os.cpu_count() or 1)  # tokenizer processes on this machine
  chunk_bytes: int = 4 << 20  # input read per task; bounds memory per process
  max_line_chars: int = 20_000  # longer lines are split (a sentence is never this long)
  max_doc_sentences: int = 10_000  # longer documents are split
  max_reports: int = 10  # first problems printed as `file:line: reason`
  progress: bool = True  # tqdm bar on stderr
  seed: int = 0  # the document shuffle; the same seed gives the same shards
  overwrite: bool = False  # replace prepared data already in `output`
  shuffle_bytes: int = 256 << 20  # records shuffled in memory at a time (one pile)


@dataclasses.dataclass
class _Task:
  source: str  # file name, or "tfds NAME:SPLIT"
  first_line: int  # line (or record) number of the chunk's first line, 0-based
  data: bytes | list[bytes]  # file chunk, or the texts of TFDS records
  first_chunk: bool = True
  continued: bool = False  # the chunk starts inside a line (cut from the previous chunk)


@dataclasses.dataclass
class _Result:
  source: str
  first_line: int
  records: list[tuple[bytes, int, int, bool]]  # (framed record, sentences, tokens, eval)
  problems: list[tuple[int, str]]  # (absolute line, reason)
  sentences: int
  tokens: int
  nbytes: int


_TOKENIZER: "tokenizer_lib.Tokenizer | wordpiece.WordPieceTokenizer | None" = None
_CONFIG: PrepareConfig | None = None


def _init_worker(cfg: PrepareConfig) -> None:
  global _TOKENIZER, _CONFIG
  _TOKENIZER, _CONFIG = wordpiece.load_tokenizer(cfg.tokenizer), cfg


def _is_eval(payload: bytes, fraction: float) -> bool:
  if fraction <= 0:
    return False
  digest = hashlib.blake2b(payload, digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2**64 < fraction


def _documents(
    task: _Task, cfg: PrepareConfig, problems: list[text.Problem]
) -> list[list[tuple[int, str]]]:
  """Groups a task's text into documents of (line, sentence)."""
  if isinstance(task.data, bytes):  # google-research/bert format: a line is a sentence
    lines, found = text.clean_lines(task.data, cfg.max_line_chars, task.first_chunk, task.continued)
    problems.extend(found)
    docs, current = [], []
    for lineno, line in lines:
      if line:
        current.append((lineno, line))
      elif current:
        docs.append(current)
        current = []
    return docs + ([current] if current else [])
  docs = []
  for i, raw in enumerate(task.data, start=1):  # TFDS: one record is one document
    lines, found = text.clean_lines(raw, cfg.max_line_chars, True)
    problems.extend(text.Problem(i, p.reason) for p in found)
    docs.append([(i, s) for _, para in lines if para for s in text.split_sentences(para)])
  return [d for d in docs if d]


def _process(task: _Task) -> _Result:
  cfg, tok = _CONFIG, _TOKENIZER
  problems: list[text.Problem] = []
  docs = _documents(task, cfg, problems)
  flat = [s for doc in docs for _, s in doc]
  ids = iter(tok.encode_batch(flat))
  out_docs = []
  for doc in docs:
    sentences = []
    for lineno, _ in doc:
      sentence_ids = next(ids)
      if sentence_ids:
        sentences.append(sentence_ids)
      else:
        problems.append(text.Problem(lineno, text.NO_TOKENS))
    for start in range(0, len(sentences), cfg.max_doc_sentences):
      if start:
        problems.append(text.Problem(doc[0][0], text.LONG_DOCUMENT))
      out_docs.append(sentences[start : start + cfg.max_doc_sentences])
  encoded = []
  for doc in out_docs:
    # Workers encode and frame the records, so the writer only copies bytes.
    payload = records.encode_document(doc)
    encoded.append(
        (
            records.frame_record(payload),
            len(doc),
            sum(len(s) for s in doc),
            _is_eval(payload, cfg.eval_fraction),
        )
    )
  return _Result(
      source=task.source,
      first_line=task.first_line,
      records=encoded,
      problems=[(task.first_line + p.line, p.reason) for p in problems],
      sentences=sum(len(d) for d in out_docs),
      tokens=sum(len(s) for d in out_docs for s in d),
      nbytes=len(task.data) if isinstance(task.data, bytes) else sum(len(t) for t in task.data),
  )


def _open_input(path: str):
  """An input file, decompressed when its content is gzip, bzip2 or xz, whatever its name."""
  with open(path, "rb") as f:
    head = f.read(10)
  if head.startswith(b"\x1f\x8b\x08"):
    return gzip.open(path, "rb")
  if head.startswith(b"BZh") and head[4:10] == b"1AY&SY":
    return bz2.open(path, "rb")
  if head.startswith(b"\xfd7zXZ\x00"):
    return lzma.open(path, "rb")
  return open(path, "rb")


def _read(f, n: int, path: str) -> bytes:
  try:
    return f.read(n)
  except (OSError, EOFError, lzma.LZMAError) as e:
    raise ValueError(
        f"{path}: unreadable input ({e}); if compressed, check it with "
        "gzip -t, bzip2 -t or xz -t"
    ) from None


def _is_binary(path: str) -> bool:
  """Whether the first 64 KB (decompressed) are mostly not text: a third or more of the
  characters invalid UTF-8 or control bytes other than whitespace."""
  with _open_input(path) as f:
    sample = _read(f, 1 << 16, path).decode("utf-8", errors="replace")
  bad = sum(1 for c in sample if c == "\ufffd" or (c < " " and c not in "\t\n\r\f"))
  return bad * 3 >= len(sample) > 0


# A document (a stretch without a blank line) longer than this is cut into several, so that no
# document or line is ever in memory whole, however long.
_MAX_DOC_BYTES = 1 << 20


def _after_blank(buf: bytes, start: int, end: int) -> int:
  """The position after the first newline of the last blank line in buf[start:end], or start."""
  return max(buf.rfind(b"\n\n", start, end), buf.rfind(b"\n\r\n", start, end), start - 1) + 1


def _cut(buf: bytes, max_doc: int, final: bool) -> tuple[int, bool]:
  """Where the next chunk of `buf` ends (0: read more), and whether that is inside a line.

  After a blank line, as late as possible; but a document longer than `max_doc` is cut at its
  last line end in its first `max_doc` bytes, else (a longer line) after the last space in
  their second half, else between characters. The cuts depend on the text, not on the reads.
  """
  start = 0
  while len(buf) - start > max_doc:
    end = _after_blank(buf, start, start + max_doc)
    if end == start:  # the document at `start` is longer than max_doc
      break
    start = end
  else:
    return (len(buf) if final else _after_blank(buf, start, len(buf))), False
  if start:
    return start, False
  cut = buf.rfind(b"\n", 0, max_doc) + 1
  if cut:
    return cut, False
  cut = buf.rfind(b" ", max_doc // 2, max_doc) + 1
  if not cut:
    cut = max_doc
    while cut > max_doc - 3 and buf[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte
      cut -= 1
  return cut, True


def _file_chunks(path: str, chunk_bytes: int, max_doc: int) -> Iterator[tuple[int, bytes, bool]]:
  """(first line, bytes, starts inside a line) pieces of a file, cut by `_cut`; at most
  `chunk_bytes + max_doc` bytes of it are held."""
  first_line, buf, continued = 0, b"", False
  with _open_input(path) as f:
    while True:
      block = _read(f, chunk_bytes, path)
      buf += block
      while True:
        cut, inside = _cut(buf, max_doc, final=not block)
        if not cut:
          break
        yield first_line, buf[:cut], continued
        first_line += buf.count(b"\n", 0, cut)
        buf, continued = buf[cut:], inside
      if not block:
        return


class _Tasks:
  """Tasks for this worker, with per-file bookkeeping of empty and blank files."""

  def __init__(self, cfg: PrepareConfig):
    self.cfg = cfg
    self.total_bytes = 0
    self.empty_files: list[str] = []
    self.binary_files: list[str] = []
    if cfg.tfds:
      self.files = []
    else:
      self.files = tokenizer_lib.expand_inputs(cfg.inputs)
      self.total_bytes = sum(os.path.getsize(f) for f in self.files)

  def __iter__(self) -> Iterator[_Task]:
    return self._tfds_tasks() if self.cfg.tfds else self._file_tasks()

  def _file_tasks(self) -> Iterator[_Task]:
    cfg, index = self.cfg, 0
    for path in self.files:
      if os.path.getsize(path) == 0:
        self.empty_files.append(path)
        continue
      if _is_binary(path):
        self.binary_files.append(path)
        continue
      # A line of max_line_chars characters (<= 4 bytes each) is never cut, and the part
      # of a cut line before the cut is longer than that, so the line is counted.
      max_doc = max(_MAX_DOC_BYTES, 8 * cfg.max_line_chars)
      for first_line, data, continued in _file_chunks(path, cfg.chunk_bytes, max_doc):
        # Chunks go round-robin to the workers, so even one big file is shared.
        if index % cfg.num_workers == cfg.worker_index:
          yield _Task(
              path, first_line, data, first_chunk=not (first_line or continued), continued=continued
          )
        index += 1

  def _tfds_tasks(self) -> Iterator[_Task]:
    import tensorflow_datasets as tfds  # only for --tfds: text files need no TensorFlow

    name, _, split = self.cfg.tfds.partition(":")
    split = split or "train"
    try:
      builder = tfds.builder(name, data_dir=self.cfg.tfds_data_dir)
    except Exception as e:  # unknown name or version: tfds's own one-line message
      raise ValueError(f"--tfds {self.cfg.tfds}: {str(e).splitlines()[0]}") from e
    part = tfds.even_splits(split, n=self.cfg.num_workers)[self.cfg.worker_index]
    try:
      ds = builder.as_dataset(split=part, shuffle_files=False)
    except AssertionError:  # tfds's way of saying the data is not there
      where = self.cfg.tfds_data_dir or "the default TFDS data_dir (~/tensorflow_datasets)"
      raise FileNotFoundError(
          f"--tfds {self.cfg.tfds}: not prepared in {where}; nothing is downloaded at run "
          "time: download and prepare it with `tfds build` on a connected machine, then "
          "pass --tfds-data-dir DIR"
      ) from None
    batch, first, source = [], 0, f"tfds {name}:{part}"
    for i, example in enumerate(ds.as_numpy_iterator()):
      if self.cfg.tfds_text_key not in example:
        raise KeyError(
            f"{source}: record {i} has no feature "
            f"{self.cfg.tfds_text_key!r} (has {sorted(example)}); "
            "pass --tfds-text-key"
        )
      batch.append(example[self.cfg.tfds_text_key])
      self.total_bytes += len(batch[-1])
      if len(batch) == 256:
        yield _Task(source, first, batch)
        batch, first = [], i + 1
    if batch:
      yield _Task(source, first, batch)


_MAX_PILES = 128  # pile files of one split open at once
_PILE_HEADER = struct.Struct("<IIQ")  # sentences, tokens, then the record's own length field


class _Shuffler:
  """The external shuffle of one split (module docstring): piles, then each in memory."""

  def __init__(
      self,
      directory: pathlib.Path,
      split: str,
      expected_bytes: int,
      shuffle_bytes: int,
      rng: random.Random,
  ):
    self.dir, self.split, self.shuffle_bytes, self.rng = directory, split, shuffle_bytes, rng
    n = max(1, min(_MAX_PILES, -(-expected_bytes // shuffle_bytes)))
    self.piles = [directory / f"{split}-{i:05d}.pile" for i in range(n)]
    self.counts = [0] * n
    self._files = [open(p, "wb") for p in self.piles]

  def add(self, record: bytes, sentences: int, tokens: int) -> None:
    """Appends one framed record to a random pile, with its sentence and token counts."""
    i = self.rng.randrange(len(self._files))
    self._files[i].write(struct.pack("<II", sentences, tokens) + record)
    self.counts[i] += 1

  def close(self) -> None:
    for f in self._files:
      f.close()

  def shuffled(self) -> Iterator[tuple[bytes, int, int]]:
    """(framed record, sentences, tokens) of the split in shuffled order; deletes piles."""
    self.close()
    yield from self._drain(list(zip(self.piles, self.counts)))

  def _drain(self, piles: list[tuple[pathlib.Path, int]]) -> Iterator[tuple[bytes, int, int]]:
    for path, count in piles:
      size = path.stat().st_size
      if size > self.shuffle_bytes and count > 1:
        yield from self._drain(self._scatter(path, -(-size // self.shuffle_bytes)))
        continue
      with open(path, "rb") as f:
        entries = list(_pile_entries(f))
      path.unlink()
      self.rng.shuffle(entries)
      yield from entries

  def _scatter(self, path: pathlib.Path, n: int) -> list[tuple[pathlib.Path, int]]:
    """Splits an oversized pile into `n` (2 to _MAX_PILES) random smaller ones."""
    n = max(2, min(_MAX_PILES, n))
    subs, counts = [path.with_name(f"{path.name}.{i:03d}") for i in range(n)], [0] * n
    outs = [open(p, "wb") for p in subs]
    with open(path, "rb") as f:
      for record, sentences, tokens in _pile_entries(f):
        i = self.rng.randrange(n)
        outs[i].write(struct.pack("<II", sentences, tokens) + record)
        counts[i] += 1
    for out in outs:
      out.close()
    path.unlink()
    return list(zip(subs, counts))


def _pile_entries(f) -> Iterator[tuple[bytes, int, int]]:
  """(framed record, sentences, tokens) of a pile file, in file order."""
  while header := f.read(_PILE_HEADER.size + 4):
    sentences, tokens, n = _PILE_HEADER.unpack(header[: _PILE_HEADER.size])
    yield header[8:] + f.read(n + 4), sentences, tokens


class _Writers:
  """Round-robin TFRecord writers for the train and eval splits, in `directory`."""

  def __init__(self, cfg: PrepareConfig, directory: pathlib.Path):
    self.shards, self._writers, self._next = [], {}, {"train": 0, "eval": 0}
    counts = {"train": cfg.num_shards, "eval": cfg.eval_shards if cfg.eval_fraction else 0}
    for split, n in counts.items():
      for i in range(n):
        name = records.shard_name(split, cfg.worker_index * n + i, cfg.num_workers * n)
        self._writers.setdefault(split, []).append(open(directory / name, "wb"))
        self.shards.append(
            {"file": name, "split": split, "documents": 0, "sentences": 0, "tokens": 0, "bytes": 0}
        )
    self._offset = {"train": 0, "eval": counts["train"]}

  def write(self, record: bytes, sentences: int, tokens: int, split: str) -> None:
    k = self._next[split]
    self._next[split] = (k + 1) % len(self._writers[split])
    self._writers[split][k].write(record)
    shard = self.shards[self._offset[split] + k]
    shard["documents"] += 1
    shard["bytes"] += len(record)
    shard["sentences"] += sentences
    shard["tokens"] += tokens

  def close(self) -> None:
    for ws in self._writers.values():
      for w in ws:
        w.close()


_SKIPPED = (text.EMPTY_FILE, text.BINARY_FILE, text.BLANK_FILE, text.NO_TOKENS)
_WARNINGS = (text.SINGLE_DOCUMENT,)
_ONCE_PER_FILE = (text.CRLF, text.BOM)


class _Tally:
  """Counts, per-file document numbers and the first few `file:line: reason` reports."""

  def __init__(self, cfg: PrepareConfig):
    self.cfg = cfg
    self.counts = {
        "skipped": collections.Counter(),
        "repaired": collections.Counter(),
        "warnings": collections.Counter(),
    }
    self.reports: list[str] = []
    self.docs_per_source: dict[str, int] = {}
    self._seen_once: set[tuple[str, str]] = set()

  def problem(self, source: str, line: int | None, reason: str) -> None:
    if reason in _ONCE_PER_FILE:
      if (source, reason) in self._seen_once:
        return
      self._seen_once.add((source, reason))
    kind = "skipped" if reason in _SKIPPED else "warnings" if reason in _WARNINGS else "repaired"
    self.counts[kind][reason] += 1
    where = (
        source
        if line is None
        else (f"{source}:record {line}" if source.startswith("tfds ") else f"{source}:{line}")
    )
    if len(self.reports) < self.cfg.max_reports:
      self.reports.append(f"{where}: {reason}")
      print(f"prepare: {where}: {reason}", file=sys.stderr)

  def finish_files(self, files: list[str], empty: list[str], binary: list[str]) -> None:
    for path in empty:
      self.problem(path, None, text.EMPTY_FILE)
    for path in binary:
      self.problem(path, None, text.BINARY_FILE)
    for path in files:
      n = self.docs_per_source.get(path, 0)
      if n == 0 and path not in empty and path not in binary:
        self.problem(path, None, text.BLANK_FILE)
      elif n == 1:
        self.problem(path, None, text.SINGLE_DOCUMENT)


def _check(cfg: PrepareConfig) -> None:
  if bool(cfg.inputs) == bool(cfg.tfds):
    raise ValueError("give either --input FILES or --tfds NAME[:SPLIT], not both/neither")
  if cfg.num_shards < 1 or cfg.eval_shards < 1:
    raise ValueError("--num-shards and --eval-shards must be >= 1")
  if not 0.0 <= cfg.eval_fraction < 1.0:
    raise ValueError(f"--eval-fraction {cfg.eval_fraction}: must be in [0, 1)")
  if not 0 <= cfg.worker_index < cfg.num_workers:
    raise ValueError(
        f"--worker-index {cfg.worker_index}: must be in " f"[0, --num-workers={cfg.num_workers})"
    )


def _run_tasks(cfg: PrepareConfig, tasks: "_Tasks", handle) -> None:
  """Runs `_process` over the tasks, in order, with a bounded number in flight."""
  if cfg.processes <= 1:
    _init_worker(cfg)
    for task in tasks:
      handle(_process(task))
    return
  # spawn, not fork: the parent may have started TensorFlow's threads already.
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(cfg.processes, initializer=_init_worker, initargs=(cfg,)) as pool:
    pending: collections.deque = collections.deque()
    for task in tasks:
      pending.append(pool.apply_async(_process, (task,)))
      while len(pending) >= 2 * cfg.processes:
        handle(pending.popleft().get())
    while pending:
      handle(pending.popleft().get())


def _copy_tokenizer(tok, out: pathlib.Path, worker_index: int) -> dict:
  """Copies the tokenizer into the data directory (self-contained); its metadata entry.

  The special ids go into metadata.json, so the stream frames and masks with the right ids
  (WordPiece: [CLS]=101 ...) without loading the tokenizer.
  """
  is_wordpiece = isinstance(tok, wordpiece.WordPieceTokenizer)
  name = "vocab.txt" if is_wordpiece else "tokenizer.model"
  tmp = out / f"{name}.{worker_index}.tmp"
  shutil.copyfile(tok.path, tmp)
  os.replace(tmp, out / name)
  meta = {
      "file": name,
      "type": "wordpiece" if is_wordpiece else "sentencepiece",
      "sha256": tok.sha256,
      "vocab_size": tok.vocab_size,
      "special_ids": {
          "pad": tok.pad_id,
          "unk": tok.unk_id,
          "cls": tok.cls_id,
          "sep": tok.sep_id,
          "mask": tok.mask_id,
      },
  }
  if is_wordpiece:
    # vocab.txt does not say whether it is uncased; this file beside it does, and
    # `wordpiece.load_tokenizer` reads it (as transformers does).
    meta["lower_case"] = tok.lower_case
    tmp = out / f"tokenizer_config.json.{worker_index}.tmp"
    tmp.write_text(json.dumps({"do_lower_case": tok.lower_case}) + "\n")
    os.replace(tmp, out / "tokenizer_config.json")
  return meta


def _drop_empty_shards(cfg: PrepareConfig, out: pathlib.Path, writers: _Writers) -> None:
  """Deletes shards that got no document (more shards asked than documents), saying so.

  Shard names keep their `-of-N` numbering; metadata.json lists the shards that remain.
  """
  for split, flag in (("train", "--num-shards"), ("eval", "--eval-shards")):
    shards = [s for s in writers.shards if s["split"] == split]
    empty = [s for s in shards if s["documents"] == 0]
    if not shards or not empty:
      continue
    for s in empty:
      (out / s["file"]).unlink(missing_ok=True)
    kept = len(shards) - len(empty)
    writers.shards = [s for s in writers.shards if s not in empty]
    if kept == 0 and split == "eval":
      print(
          f"prepare: no document fell into the held-out split ({cfg.eval_fraction:g} of "
          "the documents); `bertjax pretrain` will train without held-out evaluation. "
          "Raise --eval-fraction, or split the text into more documents (blank lines)",
          file=sys.stderr,
      )
    elif kept == 0:
      if any(s["documents"] for s in writers.shards):
        print(
            "prepare: no training document: every document is in the held-out "
            "split; lower --eval-fraction",
            file=sys.stderr,
        )
    else:
      print(
          f"prepare: wrote {kept} {split} shard(s), not {flag} {len(shards)}: only "
          f"{kept} {split} document(s)",
          file=sys.stderr,
      )


def _check_output(cfg: PrepareConfig, out: pathlib.Path) -> None:
  """Refuses to prepare over this worker's finished data unless `overwrite`."""
  meta = out / records.metadata_name(cfg.worker_index, cfg.num_workers)
  if meta.exists() and not cfg.overwrite:
    raise FileExistsError(
        f"{meta}: {out} already holds prepared data; pass --overwrite to "
        "replace it, or choose another --output"
    )


def _publish(cfg: PrepareConfig, tmp: pathlib.Path, out: pathlib.Path, shards: list[dict]) -> None:
  """Moves the finished shards from `tmp` into `out`; the old metadata goes first, so a
  reader never sees it beside new shards, and the new one is written last (by the caller).
  A single worker owns `out`: shards of an earlier preparation that are not replaced go."""
  (out / records.metadata_name(cfg.worker_index, cfg.num_workers)).unlink(missing_ok=True)
  for shard in shards:
    os.replace(tmp / shard["file"], out / shard["file"])
  if cfg.num_workers == 1:
    keep = {s["file"] for s in shards}
    for path in out.glob("*.tfrecord"):
      if path.name not in keep:
        path.unlink()


def _shufflers(cfg: PrepareConfig, tasks: _Tasks, directory: pathlib.Path) -> dict[str, _Shuffler]:
  """One seeded shuffle per split, with piles for the input's size (TFDS: unknown, one)."""
  share = tasks.total_bytes // cfg.num_workers
  expected = {"train": share, "eval": int(share * cfg.eval_fraction)}
  return {
      split: _Shuffler(
          directory,
          split,
          expected[split],
          cfg.shuffle_bytes,
          random.Random(f"prepare/{cfg.seed}/{cfg.worker_index}/{split}"),
      )
      for split in records.SPLITS
  }


def prepare(cfg: PrepareConfig) -> dict:
  """Prepares the shards and metadata of this worker; returns the metadata."""
  _check(cfg)
  tok = wordpiece.load_tokenizer(cfg.tokenizer)  # fail early on a bad model file
  out = pathlib.Path(cfg.output)
  _check_output(cfg, out)
  out.mkdir(parents=True, exist_ok=True)
  # One preparation per worker and output directory at a time (workers share `out`).
  with workdir_lock.Lock(str(out), "bertjax prepare", name=f".prepare-{cfg.worker_index}.lock"):
    _check_output(cfg, out)  # again: another run may have finished meanwhile
    return _prepare(cfg, tok, out)


def _prepare(cfg: PrepareConfig, tok, out: pathlib.Path) -> dict:
  tasks, tally = _Tasks(cfg), _Tally(cfg)
  # Piles and shards are written here first, the shards moved into `out` when complete.
  tmp = out / f".prepare-{cfg.worker_index}.tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir()
  totals = collections.Counter()
  start = time.perf_counter()
  bar = tqdm(
      total=tasks.total_bytes or None,
      unit="B",
      unit_scale=True,
      desc="prepare",
      disable=not cfg.progress,
      file=sys.stderr,
      smoothing=0.1,
  )

  def handle(result: _Result) -> None:
    for line, reason in result.problems:
      tally.problem(result.source, line, reason)
    for record, sentences, tokens, is_eval in result.records:
      shufflers["eval" if is_eval else "train"].add(record, sentences, tokens)
    tally.docs_per_source[result.source] = tally.docs_per_source.get(result.source, 0) + len(
        result.records
    )
    totals.update(
        documents=len(result.records),
        sentences=result.sentences,
        tokens=result.tokens,
        input_bytes=result.nbytes,
    )
    bar.update(result.nbytes)
    bar.set_postfix_str(
        f"{totals['documents'] / (time.perf_counter() - start):.0f} docs/s", refresh=False
    )

  try:
    shufflers = _shufflers(cfg, tasks, tmp)
    try:
      _run_tasks(cfg, tasks, handle)
    finally:
      bar.close()
      for shuffler in shufflers.values():
        shuffler.close()
    writers = _Writers(cfg, tmp)
    try:
      for split, shuffler in shufflers.items():
        for record, sentences, tokens in shuffler.shuffled():
          writers.write(record, sentences, tokens, split)
    finally:
      writers.close()
    tally.finish_files(tasks.files, tasks.empty_files, tasks.binary_files)
    _drop_empty_shards(cfg, tmp, writers)
    _publish(cfg, tmp, out, writers.shards)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  tokenizer_meta = _copy_tokenizer(tok, out, cfg.worker_index)
  seconds = time.perf_counter() - start
  meta = {
      "format_version": records.FORMAT_VERSION,
      **{k: totals[k] for k in ("documents", "sentences", "tokens", "input_bytes")},
      **{k: dict(sorted(v.items())) for k, v in tally.counts.items()},
      "examples_of_problems": tally.reports,
      "tokenizer": tokenizer_meta,
      "shards": writers.shards,
      "inputs": list(cfg.inputs) if cfg.inputs else [f"tfds:{cfg.tfds}"],
      "eval_fraction": cfg.eval_fraction,
      "shuffle_seed": cfg.seed,
      "worker_index": cfg.worker_index,
      "num_workers": cfg.num_workers,
      "seconds": round(seconds, 3),
  }
  path = records.write_metadata(out, meta, cfg.worker_index, cfg.num_workers)
  n_problems = sum(sum(v.values()) for v in tally.counts.values())
  if n_problems > len(tally.reports):
    print(
        f"prepare: {n_problems - len(tally.reports)} more problems; counts in {path}",
        file=sys.stderr,
    )
  return meta
