"""The structured files bertjax reads, each described once as a pydantic model, and the one line
a mismatch becomes.

    SquadFile       a SQuAD v1.1/v2.0 JSON file (questions checked one by one: `SquadQuestion`)
    Metadata        metadata.json of data written by `bertjax prepare` (or one worker's part)
    RunConfig       config.json that `bertjax pretrain` writes in its workdir
    JSON lines      any record model, read a line at a time by `bertjax.tasks.files.read_jsonl`

A mismatch is reported as the file, the path inside it and what was expected:

    train.json: data[0].paragraphs: expected a list, found the number 3 — expected a SQuAD ...

pydantic v2 rather than hand-written `isinstance` chains or jsonschema: the models are typed
(readers use the validated objects), errors carry their location as a path, and it is already a
dependency of the ecosystem bertjax installs; jsonschema only validates dicts and converts
nothing. The models are strict, as JSON has it: the string "3" is not the number 3 and `true` is
not 1. Fields a model does not name are ignored (SQuAD's "plausible_answers", prepare's tallies).

Nothing from a file reaches a message raw: values are shown as JSON (`shown`), so a message stays
one printable line whatever the file holds.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from bertjax import errors
from bertjax.runtime import fs

# Python's JSON reader turns "\ud800" escapes into lone surrogates, which no file can be written
# with and no tokenizer reads.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode(s: str) -> str:
  if m := _SURROGATE.search(s):
    raise ValueError(
        f"text with an unpaired surrogate {json.dumps(m.group())} at character {m.start() + 1} "
        "(not Unicode)"
    )
  return s


Text = Annotated[str, AfterValidator(_unicode)]


def unpaired_surrogate(value: Any) -> str | None:
  """Why the strings of the JSON value `value` are not Unicode text, or None."""
  try:
    json.dumps(value, ensure_ascii=False).encode("utf-8")
  except UnicodeEncodeError as e:
    return f"text with an unpaired surrogate {json.dumps(e.object[e.start])} (not Unicode)"
  return None


class _Model(BaseModel):
  model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


# --------------------------------------------------------------------------------- messages


def location(loc: tuple) -> str:
  """pydantic's error location as the path a user reads: ("data", 0, "qas") -> data[0].qas;
  a key from the file that is not a name is quoted (special_ids["a b"])."""
  out = ""
  for part in loc:
    if isinstance(part, int) or not str(part).isidentifier():
      out += f"[{part if isinstance(part, int) else shown(part)}]"
    else:
      out += f".{part}" if out else part
  return out


def shown(value: Any, limit: int = 40) -> str:
  """`value` as JSON on one printable ASCII line, cut after `limit` characters of a string."""
  if isinstance(value, str) and len(value) > limit:
    return json.dumps(value[:limit])[:-1] + '..."'
  return json.dumps(value)


def printable(s: str) -> str:
  """`s` itself when it prints as one line, else as JSON (a name from a file, in a message)."""
  return s if s.isprintable() else shown(s)


def found(value: Any) -> str:
  """What a JSON value is, in words: the number 3, the string "x", a list of 2 items."""
  if value is None or isinstance(value, bool):
    return json.dumps(value)
  if isinstance(value, (int, float)):
    return f"the number {shown(value)}" if abs(value) < 1e16 else "a number"
  if isinstance(value, str):
    return f"the string {shown(value)}"
  if isinstance(value, list):
    return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}" if value else "[]"
  if isinstance(value, dict):
    return "an object" if value else "{}"
  return type(value).__name__


_EXPECTED = {
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
}


def explain(err: dict) -> str:
  """One of pydantic's errors as "PATH: expected WHAT, found WHAT" (or "field X is missing")."""
  loc, kind, ctx = tuple(err["loc"]), err["type"], err.get("ctx") or {}
  where = location(loc[:-1] if kind == "missing" else loc)
  prefix = f"{where}: " if where else ""
  if kind == "missing":
    return f'{prefix}field "{loc[-1]}" is missing'
  if kind == "value_error":
    return f"{prefix}{ctx.get('error', err['msg'])}"
  if kind == "literal_error":
    what = f"one of {ctx.get('expected', '')}".replace("'", '"')
  elif kind in ("greater_than_equal", "greater_than"):
    what = (
        f"a number {'>=' if kind == 'greater_than_equal' else '>'} {ctx.get('ge', ctx.get('gt'))}"
    )
  else:
    what = _EXPECTED.get(kind, err["msg"][:1].lower() + err["msg"][1:])
  return f"{prefix}expected {what}, found {found(err.get('input'))}"


def problem(e: pydantic.ValidationError) -> str:
  """The first mismatch of `e` in one line, and how many more there are."""
  mismatches = e.errors(include_url=False)
  more = f" (and {len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
  return explain(mismatches[0]) + more


def load_json(
    path: fs.PathLike, error: type[errors.UserError], hint: str, shown_as: str | None = None
) -> Any:
  """The JSON value in the file `path` (read whole; UTF-8, a byte-order mark allowed); `error`
  `path[:LINE]: why` + `hint` when it is missing or not JSON (`path` spelt as `shown_as`)."""
  file = fs.path(path)
  path = shown_as or path
  if not file.is_file():
    raise error(f"{path}: no such file")
  try:
    # As text mode reads it: line ends made "\n" (JSON errors count lines by it).
    text = file.read_bytes().decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise error(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}){hint}") from None
  except UnicodeDecodeError as e:
    raise error(f"{path}: not UTF-8 text (byte {e.start}){hint}") from None
  except RecursionError:
    raise error(f"{path}: JSON nested too deeply to read{hint}") from None


def validate(model: type[_Model], value: Any, path: fs.PathLike, error, hint: str):
  """`value` as `model`, or `error` "path: PATH: expected ..., found ..." + `hint`."""
  try:
    return model.model_validate(value)
  except pydantic.ValidationError as e:
    raise error(f"{path}: {problem(e)}{hint}") from None


# ------------------------------------------------------------------------------------ SQuAD

SQUAD_HINT = (
    ' — expected a SQuAD file {"data": [{"paragraphs": [{"context": "...", "qas": '
    '[{"id": "...", "question": "...", "answers": [{"text": "...", "answer_start": 0}]}]}]}]}'
)


class SquadAnswer(_Model):
  text: Text
  answer_start: int | None = None  # char offset in the context; only training needs it


class SquadQuestion(_Model):
  id: Text
  question: Text
  answers: list[SquadAnswer] = []
  is_impossible: bool = False  # v2.0: the paragraph does not answer the question


class SquadParagraph(_Model):
  context: Text
  qas: list[Any]  # each a SquadQuestion, checked one by one: a malformed question is skipped


class SquadArticle(_Model):
  paragraphs: list[SquadParagraph]


class SquadFile(_Model):
  data: list[SquadArticle]


def read_squad(path: fs.PathLike, error: type[errors.UserError]) -> SquadFile:
  """The articles and paragraphs of a SQuAD file; `error` naming the file and the path inside
  it when it is not SQuAD JSON down to the questions (those are `squad_question`'s)."""
  return validate(SquadFile, load_json(path, error, SQUAD_HINT), path, error, SQUAD_HINT)


def squad_question(raw: Any) -> tuple[SquadQuestion | None, str]:
  """One entry of "qas" as a question, or None and why not (a skip reason, one line)."""
  try:
    return SquadQuestion.model_validate(raw), ""
  except pydantic.ValidationError as e:
    first = e.errors(include_url=False)[0]
    if first["type"] == "missing" and len(first["loc"]) == 1:
      return None, f'no "{first["loc"][0]}"'
    return None, problem(e)


# --------------------------------------------------------------------- prepared data, runs

PREPARE_HINT = " — copy it again, or prepare the data again with `bertjax prepare ... --overwrite`"


class ShardMeta(_Model):
  file: Text
  split: Literal["train", "eval"]
  documents: int = Field(ge=0)
  bytes: int | None = Field(default=None, ge=0)  # absent in data prepared before sizes


class TokenizerMeta(_Model):
  file: Text  # beside metadata.json
  vocab_size: int = Field(ge=1)
  type: Literal["sentencepiece", "wordpiece", "json"] | None = None
  sha256: str | None = None
  special_ids: dict[str, int] = {}  # absent in data prepared before ids were recorded
  lower_case: bool | None = None  # WordPiece only


class Metadata(_Model):
  """What the trainer, the stream and the worker merge read of metadata.json."""

  shards: list[ShardMeta]
  tokenizer: TokenizerMeta
  examples_of_problems: list[str] = []
  inputs: list[str] = []
  eval_fraction: float | None = None
  worker_index: int = Field(default=0, ge=0)
  num_workers: int = Field(default=1, ge=1)


def check_metadata(meta: Any, shown_as: str) -> dict:
  """`meta` (read from `shown_as`, or the merge of its workers' parts) unchanged when it is the
  metadata of prepared data, else a one-line `BadInputError` naming the field."""
  try:
    Metadata.model_validate(meta)
  except pydantic.ValidationError as e:
    raise errors.BadInputError(
        f"{shown_as}: not the metadata of prepared data ({problem(e)}){PREPARE_HINT}"
    ) from None
  return meta


def read_metadata(path: fs.PathLike, shown_as: str | None = None) -> dict:
  """metadata.json (or a worker's metadata-K-of-N.json) at `path`, checked by `Metadata`; the
  dict as written. `shown_as`: the path as the user wrote it, for messages (default `path`)."""
  shown_as = shown_as or str(path)
  if not fs.path(path).is_file():
    raise errors.InputNotFoundError(
        f"{shown_as}: no such file, so not data prepared by `bertjax prepare` — prepare it with "
        "`bertjax prepare --output DIR`"
    )
  return check_metadata(load_json(path, errors.BadInputError, PREPARE_HINT, shown_as), shown_as)


RUN_HINT = (
    " — not the config.json `bertjax pretrain` writes; a rerun of `bertjax pretrain` on the "
    "workdir writes it again"
)


def _mesh_axis(n: int) -> int:
  if n != -1 and n < 1:
    raise ValueError(f"expected -1 (the devices left) or a size >= 1, found the number {n}")
  return n


MeshAxis = Annotated[int, AfterValidator(_mesh_axis)]


class MeshConfig(_Model):
  data: MeshAxis
  fsdp: MeshAxis
  tensor: MeshAxis


class RunConfig(_Model):
  """What fine-tuning and resuming read of a pretraining run's config.json (every section is
  there: `to_json_best_effort` writes the whole config)."""

  mesh: MeshConfig
  model: dict[str, Any]
  data: dict[str, Any]
  train: dict[str, Any]


def read_run_config(path: fs.PathLike) -> dict:
  """A pretraining workdir's config.json, checked by `RunConfig`; the dict as written."""
  blob = load_json(path, errors.BadInputError, RUN_HINT)
  validate(RunConfig, blob, path, errors.BadInputError, RUN_HINT)
  return blob
