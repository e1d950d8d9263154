"""Corpora of records: JSON lines, Parquet and Arrow, one document per record.

C4 and Dolma ship JSON lines (`.json.gz`), The Pile and SlimPajama `.jsonl.zst`, FineWeb and
Hugging Face's Wikipedia Parquet, and `datasets.Dataset.save_to_disk` a directory of Arrow
stream files. `detect` names a file's format by its extension (or `PrepareConfig.input_format`);
the text is the field `PrepareConfig.text_field`, where a dotted path (`meta.body`) reaches into
nested objects or struct columns. Everything streams: JSON lines a line at a time, Parquet a
row group at a time, Arrow a record batch at a time; only one record (or batch) is ever whole.

The readers hand out texts in chunks of about `chunk_bytes`, one entry per record so that an
entry's position is its record number (b"" for a record skipped), and report each skipped
record through `problem(record, reason, count)`: a line that is not JSON, a record whose field
is missing, null, not a string or blank, a Parquet row group that cannot be read. A file that
cannot be read as its format at all, or lacks the field, is refused before anything is written
(`check`); a compressed stream or an Arrow stream that ends early is an error naming where.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import IO, Callable, Iterable, Iterator

from bertjax import errors
from bertjax.data import text
from bertjax.runtime import fs

# `PrepareConfig.input_format`: "auto" picks by extension (`detect`).
FORMATS = ("auto", "text", "jsonl", "parquet", "arrow")
_JSONL = (".jsonl", ".json", ".ndjson")
_COMPRESSED = ("", ".gz", ".zst", ".zstd", ".bz2", ".xz")

# Reasons a record is skipped, as they appear in metadata.json and in `file:record N` reports.
BAD_JSON = "unparseable JSON line"
NO_FIELD = "record without the text field"
NULL_FIELD = "record whose text field is null"
NOT_STRING = "record whose text field is not a string"
BLANK_RECORD = "record with blank text"
BAD_ROW_GROUP = "record of an unreadable Parquet row group"
NO_RECORDS = "file without a record with text"
SKIPPED = (BAD_JSON, NO_FIELD, NULL_FIELD, NOT_STRING, BLANK_RECORD, BAD_ROW_GROUP, NO_RECORDS)

# Records converted to Python at a time: a few MB of text, whatever the batches on disk hold.
_BATCH_ROWS = 1024
# The first lines of a JSON-lines file that `check` reads, and at most how many bytes of them.
_CHECK_LINES, _CHECK_BYTES = 100, 16 << 20
# A save_to_disk directory: `state.json` lists its Arrow files.
_STATE = "state.json"

Problem = Callable[[int, str, int], None]  # (1-based record, reason, records skipped)


def detect(path: str, fmt: str = "auto") -> str:
  """The format of one input file: `fmt`, or by its extension when `fmt` is "auto"."""
  if fmt != "auto":
    return fmt
  name = path.lower()
  if name.endswith(".parquet"):
    return "parquet"
  if name.endswith(".arrow"):
    return "arrow"
  if any(name.endswith(e + c) for e in _JSONL for c in _COMPRESSED):
    return "jsonl"
  return "text"


def saved_dataset_files(directory: str) -> list[str] | None:
  """The Arrow files of a `datasets` `save_to_disk` directory, in order, or None when
  `directory` is not one. A DatasetDict (one directory per split) is an error naming them."""
  d = fs.path(directory)
  if (d / "dataset_dict.json").is_file():
    splits = sorted(p.name for p in d.iterdir() if (p / _STATE).is_file())
    example = f"{directory.rstrip('/')}/{splits[0] if splits else 'train'}"
    raise errors.InputNotFoundError(
        f"{directory}: a DatasetDict saved with save_to_disk (splits: {', '.join(splits)}) — "
        f"name one split's directory, e.g. {example}"
    )
  if not (d / _STATE).is_file():
    return None
  try:
    files = [f["filename"] for f in json.loads((d / _STATE).read_text())["_data_files"]]
  except (ValueError, KeyError, TypeError):
    raise errors.BadInputError(
        f"{directory}/{_STATE}: not the state of a saved dataset (no _data_files list) — "
        "save it again with datasets' save_to_disk, or name its .arrow files"
    ) from None
  prefix = directory if directory.endswith("/") else directory + "/"
  return [prefix + name for name in files]


# ----------------------------------------------------------------------------- zstandard


class ZstdReader(io.RawIOBase):
  """The decompressed bytes of a zstandard file (all its frames); ending inside a frame (a
  truncated file) is an EOFError, which zstandard's own stream_reader does not report."""

  def __init__(self, raw: IO[bytes]):
    import zstandard  # only for .zst input

    self._raw, self._dctx = raw, zstandard.ZstdDecompressor()
    self._obj, self._in_frame = self._dctx.decompressobj(), False
    self._buf, self._pos = b"", 0

  def readable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    while self._pos == len(self._buf):
      # Small compressed reads: text expands ~5x, so each stays a few hundred KB decompressed.
      block = self._raw.read(64 << 10)
      if not block:
        if self._in_frame:
          raise EOFError("zstd data ends inside a frame (truncated file)")
        return 0
      self._buf, self._pos = self._feed(block), 0
    n = min(len(b), len(self._buf) - self._pos)
    b[:n] = self._buf[self._pos : self._pos + n]
    self._pos += n
    return n

  def _feed(self, block: bytes) -> bytes:
    out = []
    while block:
      self._in_frame = True
      out.append(self._obj.decompress(block))
      if not self._obj.eof:
        break
      block, self._obj, self._in_frame = self._obj.unused_data, self._dctx.decompressobj(), False
    return b"".join(out)


class _Seekable(io.RawIOBase):
  """A remote file of epath's (TensorFlow's GFile for gs://, which has no `closed`) as the
  seekable io file that pyarrow reads Parquet and Arrow through."""

  def __init__(self, f):
    self._f = f

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    data = self._f.read(len(b))
    b[: len(data)] = data
    return len(data)

  def seek(self, offset: int, whence: int = 0) -> int:
    self._f.seek(offset, whence)
    return self._f.tell()

  def tell(self) -> int:
    return self._f.tell()


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[bytes]]:
  with fs.path(path).open("rb") as f:
    yield f if fs.is_local(path) else io.BufferedReader(_Seekable(f), 1 << 20)


# ----------------------------------------------------------------------------- JSON lines


def _value(record, field: str) -> tuple[str | None, str | None]:
  """(text, None), or (None, why the record has none). A key spelled with dots is taken
  whole when the record has it, else as a path into nested objects."""
  if isinstance(record, dict) and field in record:
    value = record[field]
  else:
    value = record
    for key in field.split("."):
      if not isinstance(value, dict) or key not in value:
        return None, NO_FIELD
      value = value[key]
  if value is None:
    return None, NULL_FIELD
  if not isinstance(value, str):
    return None, NOT_STRING
  if not value.strip():
    return None, BLANK_RECORD
  return value, None


def _record(line: bytes, number: int, field: str, problem: Problem) -> bytes:
  """One JSON line's text as UTF-8 (b"" when skipped, and the reason reported). Lone
  surrogates (`"\\ud800"`) stay invalid UTF-8, which cleaning then replaces and counts."""
  line = line.strip()
  if not line:
    return b""
  try:
    s = line.decode("utf-8")
  except UnicodeDecodeError:
    s = line.decode("utf-8", errors="replace")
    problem(number, text.INVALID_UTF8, 1)
  try:
    record = json.loads(s)
  except (ValueError, RecursionError):
    problem(number, BAD_JSON, 1)
    return b""
  value, why = _value(record, field)
  if why:
    problem(number, why, 1)
    return b""
  return value.encode("utf-8", errors="surrogatepass")


def check_json_lines(path: str, lines: Iterable[bytes], field: str) -> None:
  """Refuses a file whose first lines are none of them JSON, or none of whose first records
  has the text field: the wrong format or the wrong field, which would skip every record."""
  seen, first_error, first_keys = 0, None, None
  for number, line in enumerate(lines, start=1):
    seen += len(line)
    if line.strip():
      try:
        record = json.loads(line)
      except (ValueError, RecursionError) as e:
        first_error = first_error or f"line {number}: {e}"
      else:
        if _value(record, field)[1] not in (NO_FIELD,):
          return
        if first_keys is None:
          first_keys = sorted(record) if isinstance(record, dict) else [type(record).__name__]
    if number >= _CHECK_LINES or seen >= _CHECK_BYTES:
      break
  if first_keys is None and first_error:
    raise errors.BadInputError(
        f"{path}: not JSON lines ({first_error}) — pass PrepareConfig.input_format='text' for "
        "text with one sentence per line, or fix the file"
    )
  if first_keys is not None:
    raise errors.ConfigError(
        f"PrepareConfig.text_field={field}: no record at the start of {path} has it (the first "
        f"has {', '.join(first_keys[:12]) or 'no fields'}) — name the field holding the text"
    )


def json_chunks(
    lines: Iterable[bytes], field: str, chunk_bytes: int, select: Callable[[], bool], problem
) -> Iterator[tuple[int, list[bytes]]]:
  """(first record, 0-based; texts) of a JSON-lines file, a chunk of about `chunk_bytes` of
  lines at a time. Record N is line N. `select()`, asked once per chunk, says whether this
  worker takes it: a chunk for another worker is never parsed."""
  first, batch, size = 0, [], 0
  for line in lines:
    batch.append(line)
    size += len(line)
    if size >= chunk_bytes:
      if select():
        yield first, [_record(l, first + i, field, problem) for i, l in enumerate(batch, 1)]
      first, batch, size = first + len(batch), [], 0
  if batch and select():
    yield first, [_record(l, first + i, field, problem) for i, l in enumerate(batch, 1)]


# ----------------------------------------------------------------------------- Arrow, Parquet


def _arrow_errors() -> tuple[type[BaseException], ...]:
  import pyarrow as pa

  return (pa.ArrowException, OSError, ValueError)


def _column(schema, field: str, path: str) -> tuple[str, list[int]]:
  """(top-level column, child indices down to the text) of `field` in an Arrow schema; an
  error naming the columns when it is not there or holds no text."""
  import pyarrow as pa

  if field in schema.names:
    top, parts = field, []
  else:
    top, *parts = field.split(".")
  if top not in schema.names:
    raise errors.ConfigError(
        f"PrepareConfig.text_field={field}: {path} has no such column (it has "
        f"{', '.join(schema.names[:12])}) — name the column holding the text"
    )
  kind, indices = schema.field(top).type, []
  for depth, name in enumerate(parts):
    index = kind.get_field_index(name) if pa.types.is_struct(kind) else -1
    if index < 0:
      where = ".".join([top, *parts[:depth]])
      raise errors.ConfigError(
          f"PrepareConfig.text_field={field}: in {path}, {where} ({kind}) has no field {name!r}"
          " — name the column holding the text"
      )
    indices.append(index)
    kind = kind.field(index).type
  if pa.types.is_dictionary(kind):
    kind = kind.value_type
  stringy = (pa.types.is_string, pa.types.is_large_string, pa.types.is_null)
  view = getattr(pa.types, "is_string_view", None)  # pyarrow >= 16
  if not any(f(kind) for f in stringy + ((view,) if view else ())):
    raise errors.ConfigError(
        f"PrepareConfig.text_field={field}: in {path} it holds {kind}, not text — name the "
        "column holding the text"
    )
  return top, indices


def _texts(batch, top: str, indices: list[int], first: int, problem: Problem) -> list[bytes]:
  """The texts of one record batch (b"" for a null or blank one, reported)."""
  import pyarrow.compute as pc

  column = batch.column(top)
  if indices:
    column = pc.struct_field(column, indices)  # a null struct gives a null text
  out = []
  for number, value in enumerate(column.to_pylist(), start=first + 1):
    if value is None or not value.strip():
      problem(number, NULL_FIELD if value is None else BLANK_RECORD, 1)
      out.append(b"")
    else:
      out.append(value.encode("utf-8", errors="surrogatepass"))
  return out


def _slices(batch) -> Iterator:
  for start in range(0, batch.num_rows, _BATCH_ROWS):
    yield batch.slice(start, _BATCH_ROWS)


def open_parquet(f: IO[bytes], path: str):
  import pyarrow.parquet as pq

  try:
    # Pages are read as they are decoded (buffer_size), not a whole column chunk at once.
    return pq.ParquetFile(f, buffer_size=1 << 20, pre_buffer=False)
  except _arrow_errors() as e:
    raise errors.BadInputError(
        f"{path}: not a readable Parquet file ({str(e).splitlines()[0]}) — if it is truncated, "
        "copy it again; for another format pass PrepareConfig.input_format"
    ) from None


def parquet_text_bytes(pf, top: str) -> int:
  """Uncompressed bytes of the text column (from the footer), for progress and the shuffle."""
  md, total = pf.metadata, 0
  for rg in range(md.num_row_groups):
    group = md.row_group(rg)
    for j in range(group.num_columns):
      column = group.column(j)
      if column.path_in_schema == top or column.path_in_schema.startswith(top + "."):
        total += column.total_uncompressed_size
  return total


def parquet_chunks(
    pf, top: str, indices: list[int], chunk_bytes: int, select: Callable[[], bool], problem
) -> Iterator[tuple[int, list[bytes]]]:
  """(first record, texts) of a Parquet file, a row group at a time (`select()` once per row
  group), read in batches of `_BATCH_ROWS` records. A row group that cannot be read is skipped
  and its records counted (`BAD_ROW_GROUP`, at its first unread record)."""
  first = 0
  for rg in range(pf.num_row_groups):
    rows = pf.metadata.row_group(rg).num_rows
    if not select():
      first += rows
      continue
    start, texts, size = first, [], 0
    try:
      for batch in pf.iter_batches(
          batch_size=_BATCH_ROWS, row_groups=[rg], columns=[top], use_threads=False
      ):
        texts += _texts(batch, top, indices, start + len(texts), problem)
        size += batch.nbytes
        if size >= chunk_bytes:
          yield start, texts
          start, texts, size = start + len(texts), [], 0
    except _arrow_errors():
      problem(start + len(texts) + 1, BAD_ROW_GROUP, first + rows - start - len(texts))
    if texts:
      yield start, texts
    first += rows


def open_arrow(f: IO[bytes], path: str):
  """A reader of an Arrow IPC stream (save_to_disk, the datasets cache) or IPC file."""
  import pyarrow as pa

  try:
    if f.read(6) == b"ARROW1":  # the IPC file format's magic; a stream has none
      f.seek(0)
      reader = pa.ipc.open_file(f)
      return reader, reader.schema
    f.seek(0)
    reader = pa.ipc.open_stream(f)
    return reader, reader.schema
  except _arrow_errors() as e:
    raise errors.BadInputError(
        f"{path}: not an Arrow stream or file ({str(e).splitlines()[0]}) — for another format "
        "pass PrepareConfig.input_format"
    ) from None


def _batches(reader) -> Iterator:
  if hasattr(reader, "num_record_batches"):  # the IPC file format: batches by index
    for i in range(reader.num_record_batches):
      yield reader.get_batch(i)
  else:
    yield from reader


def arrow_chunks(
    reader, path, top, indices, chunk_bytes, select: Callable[[], bool], problem
) -> Iterator[tuple[int, list[bytes]]]:
  """(first record, texts) of an Arrow file, a record batch at a time (`select()` once per
  batch). A stream cannot be resumed past a bad batch: that is an error naming the record."""
  first, batches = 0, _batches(reader)
  while True:
    try:
      batch = next(batches, None)
    except _arrow_errors() as e:
      raise errors.BadInputError(
          f"{path}:record {first + 1}: unreadable Arrow data ({str(e).splitlines()[0]}) — the "
          "file is truncated or corrupt; save the dataset again"
      ) from None
    if batch is None:
      return
    if select():
      start, texts, size = first, [], 0
      for part in _slices(batch):
        texts += _texts(part, top, indices, start + len(texts), problem)
        size += part.nbytes
        if size >= chunk_bytes:
          yield start, texts
          start, texts, size = start + len(texts), [], 0
      if texts:
        yield start, texts
    first += batch.num_rows


def check_columnar(path: str, fmt: str, field: str) -> None:
  """Refuses a Parquet or Arrow file that is not one, or lacks the text column."""
  with _open(path) as f:
    if fmt == "parquet":
      schema = open_parquet(f, path).schema_arrow
    else:
      schema = open_arrow(f, path)[1]
    _column(schema, field, path)


def columnar_chunks(
    path: str, fmt: str, field: str, chunk_bytes: int, select: Callable[[], bool], problem
) -> Iterator[tuple[int, list[bytes]]]:
  """`parquet_chunks` or `arrow_chunks` of the file at `path` (opened here)."""
  with _open(path) as f:
    if fmt == "parquet":
      pf = open_parquet(f, path)
      top, indices = _column(pf.schema_arrow, field, path)
      yield from parquet_chunks(pf, top, indices, chunk_bytes, select, problem)
    else:
      reader, schema = open_arrow(f, path)
      top, indices = _column(schema, field, path)
      yield from arrow_chunks(reader, path, top, indices, chunk_bytes, select, problem)


def parquet_row_groups(path: str) -> int:
  """How many row groups a Parquet file has (from its footer)."""
  with _open(path) as f:
    return open_parquet(f, path).num_row_groups


def text_bytes(path: str, fmt: str, field: str, size: int) -> int:
  """About how many bytes of text a file holds (for progress and the shuffle's piles)."""
  if fmt != "parquet":
    return size
  with _open(path) as f:
    pf = open_parquet(f, path)
    return parquet_text_bytes(pf, _column(pf.schema_arrow, field, path)[0]) or size
