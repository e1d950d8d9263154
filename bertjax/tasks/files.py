"""The task files a user names (TSV, CoNLL, SQuAD JSON, outputs), read and written through
`bertjax.runtime.fs`: a local path or any `scheme://` that `etils.epath` opens.

`text_lines` reads a text file line by line as Python's text mode with `errors="replace"` and
`newline=""` does, on every backend (epath's `open` takes neither). `join` builds a path
string for messages: the user's spelling kept (no `~` expanded), `fs.path` opens it.
"""

from __future__ import annotations

from typing import Iterator

from etils import epath

from bertjax.runtime import fs


def join(root: fs.PathLike, *parts: str) -> str:
  """`root/part/...` as a string, `root` spelt as given (a local `~` is not expanded)."""
  return str(epath.Path(root).joinpath(*parts))


def text_lines(path: fs.PathLike, encoding: str = "utf-8") -> Iterator[str]:
  """The lines of the text file `path`, each with its ending: a line ends at "\\n", "\\r\\n"
  or a lone "\\r" (universal newlines, untranslated); bytes that do not decode read as U+FFFD.
  `encoding` "utf-8-sig" drops a byte-order mark at the start of the file."""
  with fs.open_text(path, encoding, newline="") as f:
    yield from f
