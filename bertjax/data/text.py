"""Cleaning raw text lines and splitting paragraphs into sentences (sentencex).

`clean_lines` turns the bytes of one input chunk into clean lines and a list of problems;
every repair or skip is counted by reason so `metadata.json` can say what happened to the
corpus. The reasons are fixed strings (the keys of `skipped`/`repaired` in metadata).
"""

from __future__ import annotations

import dataclasses

# Reasons, as they appear in metadata.json and in `file:line: reason` reports.
INVALID_UTF8 = "invalid UTF-8 (replaced)"
NUL_BYTES = "NUL bytes (removed)"
CRLF = "CRLF line endings (normalised)"
BOM = "byte-order mark (removed)"
LONG_LINE = "line longer than max_line_chars (split)"
EMPTY_FILE = "empty file"
BINARY_FILE = "binary file (mostly invalid UTF-8 or control bytes)"
BLANK_FILE = "file with only blank lines"
NO_TOKENS = "line with no tokens"
LONG_DOCUMENT = "document longer than max_doc_sentences (split)"
SINGLE_DOCUMENT = "single-document file"


@dataclasses.dataclass
class Problem:
  line: int  # 1-based, relative to the start of the chunk
  reason: str


def decode_line(raw: bytes, problems: list[Problem], lineno: int) -> str:
  """Decodes one line; invalid UTF-8 is replaced by U+FFFD and NULs are dropped."""
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError:
    text = raw.decode("utf-8", errors="replace")
    problems.append(Problem(lineno, INVALID_UTF8))
  if "\x00" in text:
    text = text.replace("\x00", "")
    problems.append(Problem(lineno, NUL_BYTES))
  return text


def split_long(line: str, max_chars: int) -> list[str]:
  """Cuts a line into pieces of <= max_chars, at the last space when there is one."""
  pieces, start = [], 0
  while len(line) - start > max_chars:
    cut = line.rfind(" ", start + max_chars // 2, start + max_chars)
    cut = start + max_chars if cut < 0 else cut
    pieces.append(line[start:cut].strip())
    start = cut
  pieces.append(line[start:].strip())
  return [p for p in pieces if p]


def clean_lines(
    data: bytes, max_line_chars: int, first_chunk: bool, continued: bool = False
) -> tuple[list[tuple[int, str]], list[Problem]]:
  """Bytes of one chunk -> [(line number, text)] with blank lines as "", plus problems.

  Long lines are split into several "sentences" with the same line number, so a 1 MB line
  without spaces costs bounded tokenizer work and loses no text. `continued`: the chunk
  starts inside a line that the previous chunk began (and counted if long).
  """
  problems: list[Problem] = []
  if first_chunk and data.startswith(b"\xef\xbb\xbf"):
    data = data[3:]
    problems.append(Problem(1, BOM))
  if b"\r" in data:
    data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    problems.append(Problem(1, CRLF))
  out = []
  for lineno, raw in enumerate(data.split(b"\n"), start=1):
    text = decode_line(raw, problems, lineno).strip()
    if len(text) > max_line_chars:
      if not (continued and lineno == 1):
        problems.append(Problem(lineno, LONG_LINE))
      out.extend((lineno, piece) for piece in split_long(text, max_line_chars))
    else:
      out.append((lineno, text))
  return out, problems


# The language whose rules split sentences. sentencex's English rules also end a sentence at
# CJK end punctuation (。！？), which is what Chinese needs; see docs/data.md for the comparison.
SENTENCE_LANGUAGE = "en"


def split_sentences(paragraph: str) -> list[str]:
  """A paragraph's sentences, by sentencex (Wikimedia's segmenter: abbreviations, decimals,
  quotes, CJK punctuation), for the pair task's sentence boundaries."""
  try:
    import sentencex
  except ImportError:
    from bertjax import errors

    raise errors.ConfigError(
        "splitting records into sentences needs the sentencex package — pip install sentencex"
    ) from None
  return [s for s in (p.strip() for p in sentencex.segment(SENTENCE_LANGUAGE, paragraph)) if s]
