"""Regenerates `data/austen.txt`, the bundled pretraining corpus, from a Debian package.

Source: Debian's `r-cran-janeaustenr` (1.0.0-1), which ships the six novels of Jane Austen as
R character vectors (Project Gutenberg texts, header and licence already removed). The texts
are in the public domain; the package itself is MIT-licensed. This script needs neither R
nor any Python package: it reads R's lazy-load database (`data/Rdata.rdb` + `.rdx`) with a
small reader for R's XDR serialisation format, then writes google-research/bert's format:
one sentence per line, a blank line between documents, one document per chapter.

    cd "$(mktemp -d)" && apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
    python data/make_corpus.py --package-root pkg --output data/austen.txt
"""

from __future__ import annotations

import argparse
import pathlib
import re
import struct
import zlib

_DATA_DIR = "usr/lib/R/site-library/janeaustenr/data"
NOVELS = (
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)


class _RReader:
  """Just enough of R's XDR unserialize for lists, symbols and atomic vectors."""

  def __init__(self, buf: bytes):
    if buf[:2] != b"X\n":
      raise ValueError("not an XDR R serialisation stream")
    self.buf, self.pos, self.refs = buf, 2, []
    version = self._int()
    self._int(), self._int()
    if version == 3:
      self._bytes(self._int())  # native encoding name

  def _int(self) -> int:
    (v,) = struct.unpack_from(">i", self.buf, self.pos)
    self.pos += 4
    return v

  def _bytes(self, n: int) -> bytes:
    out = self.buf[self.pos : self.pos + n]
    self.pos += n
    return out

  def read(self):
    flags = self._int()
    kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
    if kind in (254, 242):  # NILVALUE_SXP, EMPTYENV
      return None
    if kind == 255:  # REFSXP
      idx = flags >> 8 or self._int()
      return self.refs[idx - 1]
    if kind == 1:  # SYMSXP
      sym = self.read()
      self.refs.append(sym)
      return sym
    if kind == 9:  # CHARSXP
      n = self._int()
      return None if n == -1 else self._bytes(n).decode("utf-8", "replace")
    if kind == 2:  # LISTSXP (pairlist) -> dict
      attrs = self.read() if has_attr else None
      tag = self.read() if has_tag else None
      out = {tag: self.read()}
      rest = self.read()
      del attrs
      return {**out, **(rest or {})}
    if kind in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
      value = [self.read() for _ in range(self._int())]
    elif kind in (10, 13):  # LGLSXP, INTSXP
      n = self._int()
      value = list(struct.unpack_from(f">{n}i", self._bytes(4 * n)))
    elif kind == 14:  # REALSXP
      n = self._int()
      value = list(struct.unpack_from(f">{n}d", self._bytes(8 * n)))
    else:
      raise ValueError(f"unsupported R type {kind}")
    attrs = self.read() if has_attr else None
    if kind == 19 and attrs and "names" in attrs:
      return dict(zip(attrs["names"], value))
    return value


def _unpack(blob: bytes):
  (n,) = struct.unpack_from(">i", blob, 0)
  data = zlib.decompress(blob[4:])
  assert len(data) == n, "truncated R database entry"
  return _RReader(data).read()


def read_novels(package_root: pathlib.Path) -> dict[str, list[str]]:
  data_dir = package_root / _DATA_DIR
  index = _RReader(zlib.decompress((data_dir / "Rdata.rdx").read_bytes(), 31)).read()
  rdb = (data_dir / "Rdata.rdb").read_bytes()
  novels = {}
  for name, (offset, length) in index["variables"].items():
    novels[name] = _unpack(rdb[offset : offset + length])
  return novels


_HEADING = re.compile(r"^(CHAPTER|Chapter|VOLUME|Volume)\b[\s\w.]*$|^[IVXL]+\.?$")
_ABBREV = re.compile(r"\b(Mr|Mrs|Dr|St|Messrs|Col|Capt|Esq|Sir|Co|viz|ch|vol)\.$")
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"'\u2019\u201d)_]*)\s+(?=[\"'\u2018\u201c(_]*[A-Z0-9])")


def split_sentences(paragraph: str) -> list[str]:
  """Rule-based splitter: ends at . ! ? (plus closing quotes) before a capital letter."""
  pieces, start = [], 0
  for m in _SENTENCE_END.finditer(paragraph):
    end = m.end(1)
    if _ABBREV.search(paragraph[start : m.start()]):
      continue
    pieces.append(paragraph[start:end].strip())
    start = m.end()
  pieces.append(paragraph[start:].strip())
  return [p for p in pieces if p]


def chapters(lines: list[str]) -> list[list[str]]:
  """Groups a novel's lines into chapters of sentences; headings start a new chapter."""
  docs, paragraph, current = [], [], []

  def end_paragraph():
    if paragraph:
      current.extend(split_sentences(" ".join(paragraph)))
      paragraph.clear()

  for line in lines:
    line = (line or "").strip()
    if _HEADING.match(line):
      end_paragraph()
      if current:
        docs.append(list(current))
        current.clear()
    elif not line:
      end_paragraph()
    else:
      paragraph.append(line)
  end_paragraph()
  if current:
    docs.append(current)
  return docs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
      "--package-root",
      type=pathlib.Path,
      required=True,
      help="where `dpkg-deb -x r-cran-janeaustenr_*.deb` unpacked the package",
  )
  parser.add_argument("--output", type=pathlib.Path, default=pathlib.Path("data/austen.txt"))
  args = parser.parse_args()
  novels = read_novels(args.package_root)
  n_docs = n_sents = 0
  with open(args.output, "w", encoding="utf-8", newline="\n") as f:
    for name in NOVELS:
      for doc in chapters(novels[name]):
        # Title pages and tables of contents come out as tiny "chapters": drop them.
        if len(doc) < 3:
          continue
        f.write("\n".join(doc) + "\n\n")
        n_docs, n_sents = n_docs + 1, n_sents + len(doc)
  print(
      f"wrote {args.output}: {n_docs} documents, {n_sents} sentences, "
      f"{args.output.stat().st_size / 1e6:.2f} MB"
  )


if __name__ == "__main__":
  main()
