"""Reading a raw corpus: input files and globs, compressed or not, cut into chunks of documents.

`expand_inputs` turns the user's files and globs into files, with one-line errors for a
pattern that matches nothing, a directory or an unreadable file (a `datasets` save_to_disk
directory gives its Arrow files). `open_input` decompresses gzip, bzip2, xz and zstandard by
content, whatever the name; `is_binary` tells text from other bytes.
Every file is read through `bertjax.runtime.fs` (etils.epath): local paths with Python's own
file calls, `gs://` and other object stores through TensorFlow's file systems.
`file_chunks` cuts a file into pieces of about `chunk_bytes` at document boundaries (a blank
line), so a worker process can clean and tokenize each on its own; a document over `max_doc`
bytes, even a single line, is cut into several, so no line is ever held whole. `Tasks` is
`prepare`'s sequence of such chunks for one worker, from files or from a TFDS dataset; its
constructor checks the whole input before anything is written. Files of records (JSON lines,
Parquet, Arrow: formats.py) become tasks of one text per record, as TFDS records do.
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import glob
import gzip
import io
import itertools
import lzma
import os
from typing import IO, Iterator, Sequence

from bertjax import errors
from bertjax.data import formats, text
from bertjax.data.prepare_config import PrepareConfig
from bertjax.runtime import fs

# Magic numbers of the compressed formats `open_input` reads (bzip2: "BZh", level, block magic).
_GZIP, _BZIP2, _XZ, _ZSTD = b"\x1f\x8b\x08", b"1AY&SY", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd"


def _glob(pattern: str) -> list[str]:
  """The paths matching `pattern` (local or `scheme://`), spelled as the pattern spells its
  directories (`./a/*.txt` gives `./a/x.txt`, as `glob.glob` does). `**` matches one level, as in
  `glob.glob` without `recursive`."""
  parts = pattern.split("/")
  first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
  head = "/".join(parts[:first])  # the directories before the first wildcard
  head = head.rstrip("/") or head  # as glob spells them: "a//*" gives "a/x"
  prefix = (head if head.endswith("/") else head + "/") if first else ""
  base = fs.path(prefix or ".")
  rest = "/".join(parts[first:]).replace("**", "*")
  return [prefix + str(m.relative_to(base)) for m in base.glob(rest)]


def expand_inputs(patterns: Sequence[str]) -> list[str]:
  """Files of `patterns` (globs expanded, sorted); a pattern that gives no readable file is an
  error naming it and why."""
  files = []
  for pattern in patterns:
    magic = glob.has_magic(pattern)  # a test of the string only
    matched = sorted(_glob(pattern)) if magic else [pattern]
    saved = None if magic else formats.saved_dataset_files(pattern)
    if saved is not None:  # a `datasets` save_to_disk directory: its Arrow files
      matched = saved
    found = [m for m in matched if fs.path(m).is_file()]
    if not found:
      if not magic and saved is None and fs.path(pattern).is_dir():
        raise errors.InputNotFoundError(
            f"{pattern}: is a directory — name its files, e.g. '{pattern.rstrip('/')}/*.txt'"
        )
      what = "no file matches this pattern" if magic else "no such file"
      raise errors.InputNotFoundError(f"{pattern}: {what}")
    for path in found:
      # Permissions are a local notion; an object store refuses at the first read instead.
      if fs.is_local(path) and not os.access(fs.path(path), os.R_OK):
        raise errors.InputNotFoundError(f"{path}: not readable (permission denied)")
    files.extend(found)
  return files


def file_size(path: str | os.PathLike) -> int:
  """Bytes in a file, local or remote. Measured by seeking to its end: epath's local `stat()`
  also looks up the owner's user name, which fails for a uid without one (containers)."""
  with fs.path(path).open("rb") as f:
    f.seek(0, os.SEEK_END)
    return f.tell()


def compression(path: str) -> str | None:
  """ "gzip", "bzip2", "xz" or "zstd" when the file's content is compressed so, else None."""
  with fs.path(path).open("rb") as f:
    head = f.read(10)
  if head.startswith(_GZIP):
    return "gzip"
  if head.startswith(b"BZh") and head[4:10] == _BZIP2:
    return "bzip2"
  if head.startswith(_XZ):
    return "xz"
  if head.startswith(_ZSTD):
    return "zstd"
  return None


# Readers of a compressed stream over an open file object.
_DECOMPRESSORS = {
    "gzip": lambda f: gzip.GzipFile(fileobj=f, mode="rb"),
    "bzip2": bz2.BZ2File,
    "xz": lzma.LZMAFile,
    "zstd": lambda f: io.BufferedReader(formats.ZstdReader(f), 1 << 20),
}


@contextlib.contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
  """An input file, decompressed when its content is gzip, bzip2, xz or zstandard, whatever
  its name."""
  kind = compression(path)
  with fs.path(path).open("rb") as raw:
    if kind is None:
      yield raw
      return
    with _DECOMPRESSORS[kind](raw) as f:
      yield f


def _unreadable(where: str, e: BaseException) -> errors.BadInputError:
  return errors.BadInputError(
      f"{where}: unreadable input ({e}) — if it is compressed, check it with gzip -t, "
      "bzip2 -t, xz -t or zstd -t"
  )


def _decompression_errors() -> tuple[type[BaseException], ...]:
  try:
    import zstandard
  except ImportError:  # then no .zst file was opened
    return (OSError, EOFError, lzma.LZMAError)
  return (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError)


def read(f, n: int, path: str, line: int = 0) -> bytes:
  """`f.read(n)`, with a corrupt or truncated compressed file as a one-line error."""
  try:
    return f.read(n)
  except _decompression_errors() as e:
    raise _unreadable(f"{path}:{line + 1}" if line else path, e) from None


def read_lines(path: str) -> Iterator[bytes]:
  """The lines of a file, decompressed; a corrupt or truncated compressed file is a one-line
  error naming the record (line) it ends in."""
  with open_input(path) as f:
    number = 0
    while True:
      try:
        line = f.readline()
      except _decompression_errors() as e:
        raise _unreadable(f"{path}:record {number + 1}", e) from None
      if not line:
        return
      number += 1
      yield line


def is_binary(path: str) -> bool:
  """Whether the first 64 KB (decompressed) are mostly not text: a third or more of the
  characters invalid UTF-8 or control bytes other than whitespace."""
  with open_input(path) as f:
    sample = read(f, 1 << 16, path).decode("utf-8", errors="replace")
  bad = sum(1 for c in sample if c == "\ufffd" or (c < " " and c not in "\t\n\r\f"))
  return bad * 3 >= len(sample) > 0


# A document (a stretch without a blank line) longer than this is cut into several, so that no
# document or line is ever in memory whole, however long.
MAX_DOC_BYTES = 1 << 20


def max_doc_bytes(cfg: PrepareConfig) -> int:
  """The longest document `file_chunks` keeps whole. A line of max_line_chars characters (<= 4
  bytes each) is never cut, and the part of a cut line before the cut is longer than that, so
  the line is counted."""
  return max(MAX_DOC_BYTES, 8 * cfg.max_line_chars)


def _after_blank(buf: bytes, start: int, end: int) -> int:
  """The position after the first newline of the last blank line in buf[start:end], or start."""
  return max(buf.rfind(b"\n\n", start, end), buf.rfind(b"\n\r\n", start, end), start - 1) + 1


def cut(buf: bytes, max_doc: int, final: bool) -> tuple[int, bool]:
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
  at = buf.rfind(b"\n", 0, max_doc) + 1
  if at:
    return at, False
  at = buf.rfind(b" ", max_doc // 2, max_doc) + 1
  if not at:
    at = max_doc
    while at > max_doc - 3 and buf[at] & 0xC0 == 0x80:  # a UTF-8 continuation byte
      at -= 1
  return at, True


def file_chunks(
    path: str, chunk_bytes: int, max_doc: int, span: tuple[int, int] | None = None
) -> Iterator[tuple[int, bytes, bool]]:
  """(first line, bytes, starts inside a line) pieces of a file, cut by `cut`; at most
  `chunk_bytes + max_doc` bytes of it are held. `span`: (start, end) bytes of an uncompressed
  file, of which only the documents `document_start` puts between start and end are read
  (lines counted from there), so that the spans of a file give its documents once each."""
  first_line, buf, continued, left = 0, b"", False, None
  with open_input(path) as f:
    if span is not None:
      (begin, continued), (end, _) = (document_start(f, at, max_doc) for at in span)
      f.seek(begin)
      left = max(0, end - begin)
    while True:
      block = read(f, chunk_bytes if left is None else min(chunk_bytes, left), path, first_line)
      if left is not None:
        left -= len(block)
      buf += block
      while True:
        end, inside = cut(buf, max_doc, final=not block)
        if not end:
          break
        yield first_line, buf[:end], continued
        first_line += buf.count(b"\n", 0, end)
        buf, continued = buf[end:], inside
      if not block:
        return


def document_start(f: IO[bytes], at: int, max_doc: int) -> tuple[int, bool]:
  """(where the first document at or after byte `at` of an open uncompressed file starts,
  whether that is inside a line): after the first blank line from `at`, as `cut` cuts; a
  document over `max_doc` bytes is entered at its first line end after `at` (`cut` splits it
  there too, though at other places), and a line over `max_doc` bytes is entered between
  characters. The same `at` gives the same place, so consecutive spans meet."""
  if at <= 0:
    return 0, False
  f.seek(at - 1)
  buf = f.read(max_doc + 2)
  blank = [i for i in (buf.find(b"\n\n"), buf.find(b"\n\r\n")) if i >= 0]
  if blank:
    return at + min(blank), False
  if len(buf) < max_doc + 2:  # the last document: it runs to the end of the file
    return at - 1 + len(buf), False
  line = buf.find(b"\n")
  if line >= 0:
    return at + line, False
  i = 1
  while i < len(buf) and buf[i] & 0xC0 == 0x80:  # not inside a UTF-8 character
    i += 1
  return at - 1 + i, True


def line_start(f: IO[bytes], at: int) -> int:
  """Where the first line starting at or after byte `at` of an open file starts."""
  if at <= 0:
    return 0
  f.seek(at - 1)
  skipped = len(f.readline())
  return at - 1 + skipped


def span_lines(path: str, span: tuple[int, int]) -> Iterator[bytes]:
  """The lines of an uncompressed file that start in the span (start, end) (`line_start`)."""
  with fs.path(path).open("rb") as f:
    begin, end = (line_start(f, at) for at in span)
    f.seek(begin)
    while begin < end:
      line = f.readline()
      if not line:
        return
      begin += len(line)
      yield line


@dataclasses.dataclass
class Task:
  """One worker process's share of work: a chunk of a file, or a batch of TFDS records."""

  source: str  # file name, or "tfds NAME:SPLIT"
  first_line: int  # line (or record) number of the chunk's first line, 0-based
  data: bytes | list[bytes]  # file chunk, or the texts of TFDS records
  first_chunk: bool = True
  continued: bool = False  # the chunk starts inside a line (cut from the previous chunk)


class Tasks:
  """The tasks of one worker, from files or a TFDS dataset.

  The constructor checks the whole input before anything is written: every pattern matches a
  readable file and some file is neither empty nor binary (those are skipped and counted), every
  file of records is of its format and has the text field, or the TFDS dataset is prepared and
  has the text feature. Records skipped while reading (formats.py) are appended to `problems`
  as (file, record, reason, count), for `prepare` to count.
  """

  def __init__(self, cfg: PrepareConfig):
    self.cfg = cfg
    self.total_bytes = 0
    self.files: list[str] = []
    self.formats: dict[str, str] = {}  # file -> "text" | "jsonl" | "parquet" | "arrow"
    self.empty_files: list[str] = []
    self.binary_files: list[str] = []
    self.problems: list[tuple[str, int, str, int]] = []
    self._tfds = None
    if cfg.tfds:
      self._tfds = open_tfds(cfg)
      return
    self.files = expand_inputs(cfg.inputs)
    self.formats = {path: formats.detect(path, cfg.input_format) for path in self.files}
    sizes = {path: file_size(path) for path in self.files}
    for path in self.files:
      fmt = self.formats[path]
      if sizes[path] == 0:
        self.empty_files.append(path)
      elif fmt == "text" and is_binary(path):
        self.binary_files.append(path)
      elif fmt == "jsonl":
        with contextlib.closing(read_lines(path)) as lines:
          formats.check_json_lines(path, lines, cfg.text_field)
      elif fmt != "text":
        formats.check_columnar(path, fmt, cfg.text_field)
        sizes[path] = formats.text_bytes(path, fmt, cfg.text_field, sizes[path])
    self.total_bytes = sum(sizes[f] for f in self.files)
    if len(self.empty_files) + len(self.binary_files) == len(self.files):
      raise no_documents(
          [(p, text.EMPTY_FILE) for p in self.empty_files]
          + [(p, text.BINARY_FILE) for p in self.binary_files]
      )

  @property
  def record_files(self) -> set[str]:
    """The files of records, whose problems are reported as `file:record N`."""
    return {path for path, fmt in self.formats.items() if fmt != "text"}

  def __iter__(self) -> Iterator[Task]:
    return self._tfds_tasks() if self.cfg.tfds else self._file_tasks()

  def _file_tasks(self) -> Iterator[Task]:
    cfg, units = self.cfg, itertools.count()
    # Chunks (of records: row groups, record batches) go round-robin to the workers, so even
    # one big file is shared.
    mine = lambda: next(units) % cfg.num_workers == cfg.worker_index
    skip = set(self.empty_files) | set(self.binary_files)
    for path in self.files:
      if path in skip:
        continue
      if self.formats[path] != "text":
        yield from self._record_tasks(path, mine)
        continue
      max_doc = max_doc_bytes(cfg)
      for first_line, data, continued in file_chunks(path, cfg.chunk_bytes, max_doc):
        if mine():
          yield Task(
              path, first_line, data, first_chunk=not (first_line or continued), continued=continued
          )

  def _record_tasks(self, path: str, mine) -> Iterator[Task]:
    """Tasks of one text per record (b"" where one is skipped, so the worker numbers the
    records it reports right), as TFDS records are."""
    cfg, fmt = self.cfg, self.formats[path]
    problem = lambda record, reason, count: self.problems.append((path, record, reason, count))
    if fmt == "jsonl":
      chunks = formats.json_chunks(read_lines(path), cfg.text_field, cfg.chunk_bytes, mine, problem)
    else:
      chunks = formats.columnar_chunks(path, fmt, cfg.text_field, cfg.chunk_bytes, mine, problem)
    for first, texts in chunks:
      # Even a chunk of skipped records goes out (cheaply): its result is when `prepare`
      # counts the problems, which so never pile up here.
      yield Task(path, first, texts)

  def _tfds_tasks(self) -> Iterator[Task]:
    ds, source = self._tfds
    for task in tfds_tasks(ds, source, self.cfg.tfds_text_key):
      self.total_bytes += sum(len(t) for t in task.data)
      yield task


def tfds_tasks(ds, source: str, key: str) -> Iterator[Task]:
  """Tasks of 256 records of a TFDS dataset, the text of each in the feature `key`."""
  batch, first = [], 0
  for i, example in enumerate(ds.as_numpy_iterator()):
    batch.append(example[key])
    if len(batch) == 256:
      yield Task(source, first, batch)
      batch, first = [], i + 1
  if batch:
    yield Task(source, first, batch)


def open_tfds(cfg: PrepareConfig, index: int | None = None, parts: int | None = None):
  """(dataset of part `index` of `parts` of the split, by default this worker's, source
  name), checked: the name, the prepared data and the text feature, so that a mistake is found
  before anything is written."""
  import tensorflow_datasets as tfds  # only for TFDS input: text files need no TensorFlow

  name, _, split = cfg.tfds.partition(":")
  split = split or "train"
  try:
    builder = tfds.builder(name, data_dir=cfg.tfds_data_dir)
  except Exception as e:  # unknown name or version: tfds's own one-line message
    raise errors.ConfigError(f"PrepareConfig.tfds={cfg.tfds}: {str(e).splitlines()[0]}") from None
  if index is None:
    index, parts = cfg.worker_index, cfg.num_workers
  part = tfds.even_splits(split, n=parts)[index]
  try:
    ds = builder.as_dataset(split=part, shuffle_files=False)
  except AssertionError:  # tfds's way of saying the data is not there
    where = cfg.tfds_data_dir or "the default TFDS data_dir (~/tensorflow_datasets)"
    raise errors.InputNotFoundError(
        f"PrepareConfig.tfds={cfg.tfds}: not prepared in {where}; nothing is downloaded at run "
        "time — download and prepare it with `tfds build` on a connected machine, then set "
        "PrepareConfig.tfds_data_dir to its data_dir"
    ) from None
  except ValueError as e:  # an unknown split
    raise errors.ConfigError(f"PrepareConfig.tfds={cfg.tfds}: {str(e).splitlines()[0]}") from None
  features = getattr(ds, "element_spec", None)
  if isinstance(features, dict) and cfg.tfds_text_key not in features:
    raise errors.ConfigError(
        f"PrepareConfig.tfds_text_key={cfg.tfds_text_key}: {cfg.tfds} has no such feature "
        f"(it has {', '.join(sorted(features))}) — name the one holding the text"
    )
  return ds, f"tfds {name}:{part}"


def no_documents(reasons: list[tuple[str, str]], records: bool = False) -> errors.BadInputError:
  """The error for an input without a single document: each source and why (3 named).
  `records`: the input is of records (JSON lines, Parquet, Arrow), whose fix differs."""
  shown = "; ".join(f"{source}: {reason}" for source, reason in reasons[:3])
  more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
  fix = (
      "check that PrepareConfig.text_field names the field holding the text"
      if records
      else "give text with one sentence per line and a blank line between documents"
  )
  return errors.BadInputError(f"no document in the input ({shown}{more}) — {fix}")
