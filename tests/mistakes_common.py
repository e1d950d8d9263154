"""The row type of the mistakes table (`test_mistakes.py`)."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mistake:
  """One user mistake: the command line after `bertjax`, and what its one line must say.

  `argv` may use `{repo}`, `{tokenizer}` (the bundled .model) and `{NAME}` for each fixture in
  `fixtures` (session fixtures returning a path). `setup(cwd)` writes the row's own inputs
  (a malformed TSV, an existing output) into the working directory before the command runs;
  what it writes is part of the "before" the command must leave untouched.
  """

  id: str
  argv: tuple[str, ...]
  needles: tuple[str, ...] = ()
  setup: Callable[[pathlib.Path], None] | None = None
  fixtures: tuple[str, ...] = ()
