"""Texts to embed, one per line or record, read a record at a time.

`.txt`: one text a line (UTF-8). `.jsonl`: one JSON object a line, its text in `field`.
`.parquet`: the column `field`, read a row group at a time. A record that holds no text (an
empty line, a line that is not UTF-8 or not JSON, a missing, empty or non-string field) comes
out as a `Bad` naming its file and line (the row, from 1, for Parquet), so the caller can stop
or skip it and keep every other text at its place.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterator

from bertjax import errors
from bertjax.runtime import fs

SUFFIXES = (".txt", ".jsonl", ".parquet")


@dataclasses.dataclass(frozen=True)
class Bad:
  where: str  # FILE:LINE
  why: str

  def __str__(self) -> str:
    return f"{self.where}: {self.why}"


def records(path: str, field: str = "text") -> Iterator[str | Bad]:
  """Each text of `path` in order, or a `Bad` in its place."""
  suffix = fs.path(path).suffix
  if suffix == ".parquet":
    yield from _parquet(path, field)
    return
  if suffix not in (".txt", ".jsonl"):
    raise errors.ConfigError(f"{path}: use a {', '.join(SUFFIXES)} file")
  jsonl = suffix == ".jsonl"
  with fs.path(path).open("rb") as f:
    for n, raw in enumerate(f, 1):
      where = f"{path}:{n}"
      try:
        line = raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError:
        yield Bad(where, "invalid UTF-8")
        continue
      if not jsonl:
        yield line if line.strip() else Bad(where, "empty line")
        continue
      try:
        record = json.loads(line)
      except ValueError:
        yield Bad(where, "not a JSON object")
        continue
      value = record.get(field) if isinstance(record, dict) else None
      if not isinstance(value, str) or not value.strip():
        yield Bad(where, f"no text in field {field!r}")
      else:
        yield value


def _parquet(path: str, field: str) -> Iterator[str | Bad]:
  import pyarrow.parquet as pq

  with fs.path(path).open("rb") as f:
    pf = pq.ParquetFile(f)
    if field not in pf.schema_arrow.names:
      raise errors.BadInputError(
          f"{path}: no column {field!r} — columns: {', '.join(pf.schema_arrow.names)}; "
          "pass --text-field"
      )
    n = 0
    for i in range(pf.num_row_groups):
      for value in pf.read_row_group(i, columns=[field]).column(0).to_pylist():
        n += 1
        if not isinstance(value, str) or not value.strip():
          yield Bad(f"{path}:{n}", f"no text in column {field!r}")
        else:
          yield value
