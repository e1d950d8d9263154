"""Reader for CLUE's JSON-lines files (`DIR/train.json`, `dev.json`, `test.json`) and custom
JSON-lines tasks.

Each line is one JSON object; fields are read by name. A text field is a string or, like CSL's
"keyword", a list of strings joined by spaces (as CLUE's baseline joins them). A label is a
string ("102", "entailment", "true"); a number is read as it is written ("1", "3.5"). A test
record's "id" names its line of the submission file (an integer stays an integer); a record
without one is named by its position among the test records, as CLUE's baselines number them.

The contract is the TSV reader's (`tsv`): a train/dev line that is not text (invalid UTF-8, a
NUL byte), not JSON, not an object, lacks a field, has a field of the wrong type, an empty or
unknown label (CMNLI's and OCNLI's "-", no majority label), or CLUEWSC2020 spans that are not
where the record says, is skipped and reported as `file:line: why`; a test line that cannot be
read raises GlueDataError `file:line: why` (every test example needs its prediction). Blank
lines are not records.
"""

from __future__ import annotations

import json

from bertjax import schema
from bertjax.tasks import files
from bertjax.tasks.glue import tasks


def _text(record: dict, field: str) -> tuple[str | None, str]:
  """The text of `field`, or None and why not."""
  if field not in record:
    return None, f'no "{field}" field'
  value = record[field]
  if isinstance(value, str):
    return value, ""
  if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
    return " ".join(value), ""
  return None, f"{field}: expected a string or a list of strings, found {schema.found(value)}"


def _label(record: dict, field: str) -> tuple[str | None, str]:
  if field not in record:
    return None, f'no "{field}" field'
  value = record[field]
  if isinstance(value, str):
    return value.strip(), ""
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return str(value), ""  # 1 -> "1"; a regression target 3.5 -> "3.5"
  return None, f"{field}: expected a string or a number, found {schema.found(value)}"


def _span(text: str, target: dict, k: int) -> tuple[tuple[int, int] | None, str]:
  """[start, end) of span k (1: the noun, 2: the pronoun) of a CLUEWSC2020 target."""
  at, said = target.get(f"span{k}_index"), target.get(f"span{k}_text")
  where = f"target.span{k}"
  if not isinstance(at, int) or isinstance(at, bool):
    return None, f"{where}_index: expected an integer, found {schema.found(at)}"
  if not isinstance(said, str) or not said:
    return None, f"{where}_text: expected a non-empty string, found {schema.found(said)}"
  if text[at : at + len(said)] != said:
    return None, (
        f"{where}_text {schema.shown(said)} is not at {where}_index {at} of the text (found "
        f"{schema.shown(text[at : at + len(said)])})"
    )
  return (at, at + len(said)), ""


def wsc_text(record: dict) -> tuple[str | None, str]:
  """CLUEWSC2020's example as one text: the noun (span 1) between underscores and the pronoun
  (span 2) in square brackets, the marking of CLUE's WSC baseline:
  "这时候放在_床_上…现在[它]突然响了。". None and why for spans that are not in the text."""
  text, why = _text(record, "text")
  if text is None:
    return None, why
  target = record.get("target")
  if not isinstance(target, dict):
    return None, f"target: expected an object with the two spans, found {schema.found(target)}"
  noun, why = _span(text, target, 1)
  if noun is None:
    return None, why
  pronoun, why = _span(text, target, 2)
  if pronoun is None:
    return None, why
  if noun[0] < pronoun[1] and pronoun[0] < noun[1]:
    return None, "target: span1 and span2 overlap"
  marks = sorted([(noun, "_", "_"), (pronoun, "[", "]")])
  out, at = [], 0
  for (s, e), left, right in marks:
    out += [text[at:s], left, text[s:e], right]
    at = e
  out.append(text[at:])
  return "".join(out), ""


def _row(line: str, task: tasks.Task, labelled: bool, position: int):
  """(texts, raw label, id) of one line, or None and why it cannot be read."""
  try:
    record = json.loads(line.rstrip("\r\n"))
  except json.JSONDecodeError as e:
    return None, f"not valid JSON ({e.msg}, column {e.colno})"
  except RecursionError:
    return None, "JSON nested too deeply to read"
  if not isinstance(record, dict):
    return None, f"expected a JSON object, found {schema.found(record)}"
  if "\\u" in line and (bad := schema.unpaired_surrogate(record)):
    return None, bad
  if task.text_builder == "wsc":
    text, why = wsc_text(record)
    texts = None if text is None else [text]
  else:
    texts, why = [], ""
    for field in task.text_columns:
      text, why = _text(record, field)
      if text is None:
        break
      texts.append(text)
    else:
      why = ""
    texts = None if why else texts
  if texts is None:
    return None, why
  label = None
  if labelled:
    label, why = _label(record, task.label_column)
    if label is None:
      return None, why
    if label == "":
      return None, "empty label"
  index = record.get(task.index_column, position) if task.index_column else position
  if isinstance(index, bool) or not isinstance(index, (int, str)) or index == "":
    return (
        None,
        f"{task.index_column}: expected an integer or a string, found {schema.found(index)}",
    )
  return (texts, label, index), ""


def read_rows(path: str, task: tasks.Task, labelled: bool, name: str, strict: bool):
  """Rows as (source "file:line", texts, raw label, id) and the skipped rows' reasons, the
  shape `tsv.to_examples` takes. With `strict` (test files) a line that cannot be read raises
  GlueDataError `path:line: why` instead of being skipped."""
  rows, skipped, seen = [], [], {}
  with files.text_lines(path, "utf-8-sig") as lines:
    for lineno, (line, problem) in enumerate(lines, start=1):
      if not line.strip():
        continue
      got, why = (None, problem) if problem else _row(line, task, labelled, len(rows))
      if got is None and strict:
        raise tasks.GlueDataError(
            f"{path}:{lineno}: {why} — every test line needs a prediction, so the submission "
            "would be incomplete: fix this line"
        )
      if got is None:
        skipped.append(f"{name}:{lineno}: {why}")
        continue
      texts, label, index = got
      if strict and index in seen:
        raise tasks.GlueDataError(
            f"{path}:{lineno}: {task.index_column} {json.dumps(index, ensure_ascii=False)} is "
            f"also line {seen[index]}'s — the leaderboard needs one prediction per test id: fix "
            "this line"
        )
      seen[index] = lineno
      rows.append((f"{name}:{lineno}", texts, label, index))
  return rows, skipped
