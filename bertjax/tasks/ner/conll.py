"""CoNLL-2003-format files: one token per line, its tag in the last column, sentences split by
blank lines and `-DOCSTART-` lines.

    EU NNP B-NP B-ORG
    rejects VBZ B-VP O

Any number of whitespace-separated columns is accepted (CoNLL-2003 has word, POS, chunk, NER;
many NER files have just word and tag): the first is the token, the last the tag. A line with
one column, whose tag is neither "O" nor PREFIX-TYPE with PREFIX in B/I/E/S, or with bytes that
are not text (invalid UTF-8, a NUL byte) is skipped and reported as "file:line: why"; its
sentence keeps its other tokens.
"""

from __future__ import annotations

import dataclasses
import re

from bertjax import errors
from bertjax.runtime import fs
from bertjax.tasks import files

_TAG = re.compile(r"^(O|[BIES]-\S+)$")


class ConllError(errors.UserError, ValueError):
  """A file that is missing or holds no sentences (the first bad line says why)."""


@dataclasses.dataclass
class Sentences:
  tokens: list[list[str]]
  tags: list[list[str]]
  skipped: list[str] = dataclasses.field(default_factory=list)  # "file:line: why"

  def __len__(self) -> int:
    return len(self.tokens)


def read(path: str) -> Sentences:
  if not fs.path(path).is_file():
    raise ConllError(f"{path}: no such file")
  name = fs.path(path).name
  out = Sentences([], [])
  toks, tags = [], []

  def close():
    if toks:
      out.tokens.append(list(toks))
      out.tags.append(list(tags))
    toks.clear()
    tags.clear()

  with files.text_lines(path) as lines:
    for lineno, (line, problem) in enumerate(lines, 1):
      cols = line.split()
      if not cols:
        close()
        continue
      if problem:  # bytes that are not text: the token is not what was written
        out.skipped.append(f"{name}:{lineno}: {problem}")
        continue
      if cols[0] == "-DOCSTART-":
        close()
        continue
      if len(cols) < 2:
        out.skipped.append(
            f"{name}:{lineno}: one column {line.strip()!r}; expected 'TOKEN ... TAG'"
        )
        continue
      if not _TAG.match(cols[-1]):
        out.skipped.append(f"{name}:{lineno}: tag {cols[-1]!r} is not O or B-/I-/E-/S-TYPE")
        continue
      toks.append(cols[0])
      tags.append(cols[-1])
  close()
  if not out.tokens and out.skipped:
    n = len(out.skipped)
    raise ConllError(
        f"{path}: no sentences ({n} bad line{'s' if n > 1 else ''}; first: {out.skipped[0]})"
    )
  if not out.tokens:
    raise ConllError(f"{path}: no sentences — expected 'TOKEN ... TAG' lines")
  return out


def label_list(*splits: Sentences) -> list[str]:
  """ "O" then every other tag of the splits, sorted: the classifier's classes."""
  tags = {t for s in splits for sent in s.tags for t in sent}
  return ["O"] + sorted(tags - {"O"})


def write_predictions(path: fs.PathLike, sents: Sentences, predicted: list[list[str]]) -> None:
  """TOKEN GOLD PREDICTED per line, a blank line after each sentence (conlleval's input)."""
  with fs.path(path).open("w") as f:  # epath writes UTF-8
    for toks, gold, pred in zip(sents.tokens, sents.tags, predicted):
      for t, g, p in zip(toks, gold, pred):
        f.write(f"{t} {g} {p}\n")
      f.write("\n")
