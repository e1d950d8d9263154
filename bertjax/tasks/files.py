"""The task files a user names (TSV, CoNLL, JSON lines, SQuAD JSON, outputs), read and written
through `bertjax.runtime.fs`: a local path or any `scheme://` that `etils.epath` opens.

`text_lines` reads a text file line by line as Python's text mode with `errors="replace"` and
`newline=""` does, on every backend (epath's `open` takes neither), and says of each line
whether it held bytes that are not text (invalid UTF-8, a NUL byte): the readers skip and count
such a row, or refuse it, never read it silently as something else. It is a context manager, so
the file is closed on every exit, also when a reader stops at a bad row. `read_jsonl` reads
JSON lines into a record model of `bertjax.schema`. `join` builds a path string for messages:
the user's spelling kept (no `~` expanded), `fs.path` opens it.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Iterator, TypeVar

import pydantic
from etils import epath

from bertjax import errors, schema
from bertjax.runtime import fs

# Undecodable bytes, as errors="surrogateescape" keeps them (U+DC80..U+DCFF), and NUL.
_NOT_TEXT = re.compile("[\x00\udc80-\udcff]")

Model = TypeVar("Model", bound=pydantic.BaseModel)


def join(root: fs.PathLike, *parts: str) -> str:
  """`root/part/...` as a string, `root` spelt as given (a local `~` is not expanded)."""
  return str(epath.Path(root).joinpath(*parts))


@contextlib.contextmanager
def text_lines(
    path: fs.PathLike, encoding: str = "utf-8"
) -> Iterator[Iterator[tuple[str, str | None]]]:
  """The lines of the text file `path` as (line, problem), each line with its ending: a line
  ends at "\\n", "\\r\\n" or a lone "\\r" (universal newlines, untranslated). `problem` is None,
  or why the line is not text: "invalid UTF-8 (byte 0xff at column 3)", "a NUL byte at column
  3" (its bytes that do not decode then read as U+FFFD). `encoding` "utf-8-sig" drops a
  byte-order mark at the start of the file. The file is open for the `with` block only."""
  with fs.open_text(path, encoding, newline="", errors="surrogateescape") as f:
    yield (_checked(line) for line in f)


def _checked(line: str) -> tuple[str, str | None]:
  bad = _NOT_TEXT.search(line)
  if bad is None:
    return line, None
  at, char = bad.start() + 1, bad.group()
  if char == "\x00":
    problem = f"a NUL byte at column {at}"
  else:
    problem = f"invalid UTF-8 (byte 0x{ord(char) - 0xDC00:02x} at column {at})"
  return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), problem


def read_jsonl(
    path: str, model: type[Model], error: type[errors.UserError] = errors.BadInputError
) -> tuple[list[Model], list[str]]:
  """The records of the JSON-lines file `path` (one JSON object a line, blank lines ignored) as
  `model`, and "file:line: why" for each line skipped: not text, not JSON, or not the record
  `model` describes ("file:3: label: expected a string, found the number 3"). A missing file,
  or one without a single usable record, raises `error` naming it (and the first bad line)."""
  if not fs.path(path).is_file():
    raise error(f"{path}: no such file")
  name = fs.path(path).name
  records, skipped = [], []
  with text_lines(path, "utf-8-sig") as lines:
    for lineno, (line, problem) in enumerate(lines, 1):
      if not line.strip():
        continue
      record, why = (None, problem) if problem else _record(line, model)
      if record is None:
        skipped.append(f"{name}:{lineno}: {why}")
      else:
        records.append(record)
  if not records:
    first = f"; first: {skipped[0]}" if skipped else ""
    raise error(
        f"{path}: no usable records ({len(skipped)} skipped{first}) — expected one JSON "
        "object a line"
    )
  return records, skipped


def _record(line: str, model: type[Model]) -> tuple[Model | None, str]:
  try:
    value = json.loads(line.rstrip("\r\n"))
  except json.JSONDecodeError as e:
    return None, f"not valid JSON ({e.msg}, column {e.colno})"
  except RecursionError:
    return None, "JSON nested too deeply to read"
  # A \ud800 escape reads as an unpaired surrogate, in any field, whatever `model` types it
  # as: no file can be written with it, no tokenizer reads it.
  if "\\u" in line and (bad := schema.unpaired_surrogate(value)):
    return None, bad
  try:
    return model.model_validate(value), ""
  except pydantic.ValidationError as e:
    return None, schema.problem(e)
