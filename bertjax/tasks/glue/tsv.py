"""Reader for the GLUE download layout (`GLUE_DIR/SST-2/train.tsv`, ...) and custom TSV tasks;
the tasks whose files are JSON lines (CLUE's, custom `.json`) are read by `jsonl` under the same
contract, through the same `load_split`, `load_task` and `check_task`.

GLUE's files are tab-separated with quote characters that are *not* quoting (`"` and `'`
appear inside sentences unbalanced), so each physical line is one row and fields are split on
tabs only. Quirks handled:
  * Files are read as `utf-8-sig`: the GLUE download's MRPC train/dev headers start with a
    byte-order mark (copied from Microsoft's msr_paraphrase_*.txt), which would otherwise be
    part of the first column's name ("\ufeffQuality"). Columns are then found by header name,
    which on the GLUE files are the positions google-research/bert's processors read.
  * CoLA's train/dev files have no header (source, label, original label, sentence).
  * QQP's train file has rows with missing fields; some files end with blank lines.
  * A train/dev row with the wrong number of fields (a tab inside a sentence included), an
    empty label, a label outside the task's label list, or bytes that are not text (invalid
    UTF-8, a NUL byte) is skipped and reported as `file:line: why`; it is never cut into a
    different sentence, never read as other text, and never stops the run.
  * A test row that cannot be read raises GlueDataError `file:line: why`: every test row needs
    its prediction, or the leaderboard rejects the submission.
A file that is missing, or whose header lacks a needed column, is an error naming the file;
`check_task` reads every file of a task and also refuses a train or dev file without one
usable row, so a command can check its data before it writes anything.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from bertjax.runtime import fs
from bertjax.tasks import files
from bertjax.tasks.glue import features, jsonl, tasks
from bertjax.tasks.glue.tasks import GlueDataError


@dataclasses.dataclass(frozen=True)
class Columns:
  """Which fields of a row to read: names (header) or 0-based positions (no header)."""

  text: tuple[str | int, ...]
  label: str | int | None  # None: an unlabelled (test) split
  index: str | int | None = None  # leaderboard row id; None: the row number


def _short_name(path: str) -> str:
  """`DIR/FILE`, the file and the directory it is in (`FILE` alone when it has none)."""
  head, _, name = os.fspath(path).rpartition("/")
  parent = head.rstrip("/").rpartition("/")[2]
  return f"{parent}/{name}" if parent else name


def _split_path(root: str, split: tasks.Split) -> str:
  return files.join(root, split.tsv) if root else split.tsv


def _position(header: list[str] | None, col: str | int, path: str) -> int:
  if isinstance(col, int):
    return col
  if header is None:
    raise GlueDataError(f"{path}: column {col!r} by name needs a header row")
  if col not in header:
    raise GlueDataError(
        f"{path}:1: header has no column {col!r} (found {', '.join(map(repr, header))}) — is "
        "this the right file, and the right column name?"
    )
  return header.index(col)


def read_rows(
    path: str, cols: Columns, has_header: bool = True, strict: bool = False
) -> tuple[list[tuple[str, list[str], str | None, str | None]], list[str]]:
  """Rows as (source "file:line", texts, raw label, raw index) and the skipped rows' reasons.

  With `strict` (test files) a row that cannot be read raises GlueDataError `path:line: why`
  instead of being skipped.
  """
  if not fs.path(path).is_file():
    raise GlueDataError(f"{path}: no such file")
  rows, skipped = [], []
  name = _short_name(path)
  # A row ends at "\n", "\r\n" or a lone "\r"; utf-8-sig drops a leading byte-order mark
  # (MRPC's headers have one).
  with files.text_lines(path, "utf-8-sig") as lines:
    numbered = ((n, _chomp(line), problem) for n, (line, problem) in enumerate(lines, start=1))
    header = _header(next(numbered, None), path) if has_header else None
    pos_text = [_position(header, c, path) for c in cols.text]
    pos_label = None if cols.label is None else _position(header, cols.label, path)
    pos_index = None
    if cols.index is not None and (header is None or cols.index in header):
      pos_index = _position(header, cols.index, path)
    width = len(header) if header else max(pos_text + [pos_label or 0, pos_index or 0]) + 1
    for lineno, line, problem in numbered:
      if not line.strip():
        continue  # blank and trailing lines are not rows
      fields = line.split("\t")
      # Extra empty fields (trailing tabs) are harmless; anything else means a shifted row.
      if len(fields) > width and not any(f.strip() for f in fields[width:]):
        fields = fields[:width]
      label = None if pos_label is None or len(fields) != width else fields[pos_label].strip()
      index = None if pos_index is None or len(fields) != width else fields[pos_index].strip()
      why = _unreadable(fields, width, problem, label, index, cols)
      if why and strict:
        raise GlueDataError(
            f"{path}:{lineno}: {why} — every test row needs a prediction, so the submission "
            "would be incomplete: fix this row"
        )
      if why:
        skipped.append(f"{name}:{lineno}: {why}")
        continue
      rows.append((f"{name}:{lineno}", [fields[p] for p in pos_text], label, index))
  return rows, skipped


def _chomp(line: str) -> str:
  return line.rstrip("\n").rstrip("\r")


def _header(first: tuple[int, str, str | None] | None, path: str) -> list[str]:
  if first is None:
    raise GlueDataError(f"{path}: empty file (expected a header row)")
  _, line, problem = first
  if problem:
    raise GlueDataError(f"{path}:1: {problem} in the header row — is this a UTF-8 TSV file?")
  return line.split("\t")


def _unreadable(fields, width: int, problem, label, index, cols: Columns) -> str | None:
  """Why a row cannot be read, or None."""
  if problem:  # bytes that are not text: the row is not what was written
    return problem
  if len(fields) != width:
    return f"{len(fields)} fields, expected {width}"
  if label == "":
    return "empty label"
  if index == "":
    return f"empty {cols.index!r} column"
  return None


def _line_key(reason: str) -> tuple[str, int]:
  where = reason.split(": ", 1)[0]
  name, _, line = where.rpartition(":")
  return (name, int(line) if line.isdigit() else 0)


def to_examples(
    rows, skipped: list[str], labels: tuple[str, ...] | None, labelled: bool, pair: bool
) -> features.Examples:
  """Convert raw labels to class ids (or floats for regression); bad labels join `skipped`."""
  skipped = list(skipped)
  text_a, text_b, ys, index = [], [], [], []
  lookup = {l: i for i, l in enumerate(labels)} if labels is not None else None
  for n, (where, texts, raw, idx) in enumerate(rows):
    if labelled:
      if lookup is not None:
        if raw not in lookup:
          skipped.append(f"{where}: label {raw!r} is not one of {list(labels)}")
          continue
        y = lookup[raw]
      else:
        try:
          y = float(raw)
        except ValueError:
          skipped.append(f"{where}: label {raw!r} is not a number")
          continue
      ys.append(y)
    text_a.append(texts[0])
    if pair:
      text_b.append(texts[1])
    index.append(idx if idx is not None else (where if labelled else str(n)))
  skipped.sort(key=_line_key)
  y_arr = None
  if labelled:
    y_arr = np.asarray(ys, np.float32 if labels is None else np.int32)
  return features.Examples(text_a, text_b if pair else None, y_arr, index, skipped)


def load_split(
    task: tasks.Task, split: tasks.Split, root: str, labelled: bool
) -> features.Examples:
  """One split of a GLUE task from a GLUE directory (or custom files: `root` "")."""
  path = _split_path(root, split)
  if root and not fs.path(path).is_file():
    if task.format == "jsonl":
      raise GlueDataError(
          f"{path}: not found — --task {task.name} reads CLUE's files as CLUE distributes them: "
          "DIR/train.json, DIR/dev.json and (for a submission) DIR/test.json (see docs/glue.md)"
      )
    raise GlueDataError(
        f"{path}: not found — expected the GLUE download layout, e.g. GLUE_DIR/SST-2/train.tsv "
        "(see docs/glue.md)"
    )
  if task.format == "jsonl":
    if not fs.path(path).is_file():
      raise GlueDataError(f"{path}: no such file")
    rows, skipped = jsonl.read_rows(path, task, labelled, _short_name(path), strict=not labelled)
    return to_examples(rows, skipped, task.labels, labelled, task.is_pair)
  label_col = task.label_column if labelled else None
  if task.headerless_positions and labelled:
    label_pos, text_pos = task.headerless_positions
    rows, skipped = read_rows(path, Columns((text_pos,), label_pos), has_header=False)
  else:
    index_col = None if labelled else task.index_column
    rows, skipped = read_rows(
        path, Columns(task.text_columns, label_col, index_col), strict=not labelled
    )
  return to_examples(rows, skipped, task.labels, labelled, task.is_pair)


def load_task(task: tasks.Task, root: str, with_test: bool = True) -> dict[str, features.Examples]:
  """train, every dev split and (if present on disk) every test split of a task."""
  out = {"train": load_split(task, task.train, root, labelled=True)}
  for split in task.dev:
    out[split.name] = load_split(task, split, root, labelled=True)
  if with_test:
    out.update(load_tests(task, root))
  return out


def load_tests(task: tasks.Task, root: str) -> dict[str, features.Examples]:
  """The test splits of a task that are on disk; a test row that cannot be read raises.

  A missing test file only drops its submission (users often have train/dev only); AX is
  read from GLUE_DIR/diagnostic/diagnostic.tsv when it is there.
  """
  return {
      split.name: load_split(task, split, root, labelled=False)
      for split in task.test
      if fs.path(_split_path(root, split)).is_file()
  }


def custom_labels(
    path: str, text_columns: tuple[str, ...], label_column: str, format: str = "tsv"
) -> tuple[str, ...]:
  """The sorted distinct labels of a custom training file: the class list of the task."""
  if format == "jsonl":
    if not fs.path(path).is_file():
      raise GlueDataError(f"{path}: no such file")
    probe = tasks.custom("custom", path, path, None, text_columns, label_column, (), "jsonl")
    rows, _ = jsonl.read_rows(path, probe, True, _short_name(path), strict=False)
  else:
    rows, _ = read_rows(path, Columns(text_columns, label_column))
  found = sorted({r[2] for r in rows})
  if not found:
    raise GlueDataError(f"{path}: no labelled rows in column {label_column!r}")
  if len(found) == 1:
    raise GlueDataError(
        f"{path}: column {label_column!r} has one label ({found[0]!r}); "
        "a classifier needs at least two (numeric targets: make it a regression task)"
    )
  return tuple(found)


def check_task(task: tasks.Task, root: str) -> None:
  """Read every file of `task` as a run would; raise GlueDataError naming the file for one
  that is missing or malformed, a test row that cannot be read, or a split without one usable
  row (the first skipped row says why)."""
  splits = {s.name: s for s in (task.train, *task.dev, *task.test)}
  for name, ex in load_task(task, root).items():
    if len(ex) == 0:
      path = _split_path(root, splits[name])
      first = f"; first: {ex.skipped[0]}" if ex.skipped else ""
      raise GlueDataError(
          f"{path}: no usable rows ({len(ex.skipped)} skipped{first}) — fix the file or the "
          "columns it is read by"
      )
