"""Where a sentence-transformers directory keeps its modules (`modules.json`), read without the
weights: `convert.load_hf` finds the Transformer's folder here, and
`interop.sentence_transformers` the rest."""

from __future__ import annotations

import json
from typing import Any

from etils import epath

from bertjax import errors
from bertjax.runtime import fs


def is_directory(path: fs.PathLike) -> bool:
  """True when `path` is a sentence-transformers directory (it has a modules.json)."""
  return (fs.path(path) / "modules.json").is_file()


def transformer_dir(path: fs.PathLike) -> epath.Path:
  """The folder of the Transformer module of the sentence-transformers directory at `path`
  (`path` itself for any other directory): where its config.json and weights are."""
  path = fs.path(path)
  if not is_directory(path):
    return path
  folder = modules(path)[0][1]
  return path / folder if folder else path


def read_json(file: epath.Path) -> Any:
  try:
    return json.loads(file.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise errors.BadInputError(f"{file}: invalid JSON ({e})") from None


def modules(path: epath.Path) -> list[tuple[str, str]]:
  """(kind, folder) of each module of modules.json, in order; kind the class name
  (Transformer, Pooling, Dense, Normalize). Others are refused, naming the file."""
  file = path / "modules.json"
  entries = read_json(file)
  if not isinstance(entries, list) or not all(isinstance(m, dict) for m in entries):
    raise errors.BadInputError(f"{file}: expected a list of modules, each with a type and a path")
  out = []
  for m in entries:
    kind = str(m.get("type", "")).rsplit(".", 1)[-1]
    if kind not in ("Transformer", "Pooling", "Dense", "Normalize"):
      raise errors.BadInputError(
          f"{file}: module {m.get('type')!r} is not read by bertjax — supported: Transformer, "
          "Pooling, Dense, Normalize"
      )
    out.append((kind, str(m.get("path", "")).strip("/")))
  if not out or out[0][0] != "Transformer":
    raise errors.BadInputError(f"{file}: the first module must be a Transformer")
  if [k for k, _ in out].count("Pooling") != 1:
    raise errors.BadInputError(f"{file}: expected one Pooling module after the Transformer")
  return out
