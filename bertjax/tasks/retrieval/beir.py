"""A BEIR-format retrieval task: `corpus.jsonl`, `queries.jsonl` and `qrels/SPLIT.tsv`.

  corpus.jsonl    {"_id": "d1", "title": "...", "text": "..."} a line (title optional)
  queries.jsonl   {"_id": "q1", "text": "..."} a line
  qrels/test.tsv  query-id <TAB> corpus-id <TAB> score, after a header line

A line that cannot be read (not JSON, no `_id`, a repeated `_id`, a query without text, a qrels
line without three fields or an integer score) is skipped and counted, the first few named
(file:line); a qrels line naming a query or document the files do not hold stops the task
with one line naming it, since its score would be wrong. A document is embedded as
"title text", as BEIR and MTEB join them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Iterator

from bertjax import errors
from bertjax.runtime import fs

SPLITS_DIR = "qrels"


@dataclasses.dataclass
class Skipped:
  """Lines skipped per file, and the first few of them (file:line: why)."""

  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  first: list[str] = dataclasses.field(default_factory=list)

  def add(self, file: str, line: int, why: str) -> None:
    self.counts[file] += 1
    if len(self.first) < 10:
      self.first.append(f"{file}:{line}: {why}")


@dataclasses.dataclass
class Task:
  root: str
  corpus_ids: list[str]  # in file order (the rows of the corpus embeddings)
  queries: dict[str, str]  # id -> text, the split's queries only, in file order
  qrels: dict[str, dict[str, int]]  # query id -> {document id: relevance}
  skipped: Skipped
  corpus_skip: set[int]  # the corpus lines skipped (unreadable or a repeated _id)

  def corpus_texts(self) -> Iterator[str]:
    """Each kept document's "title text", in `corpus_ids` order (read from the file again)."""
    for n, _, doc in _jsonl(fs.path(self.root) / "corpus.jsonl"):
      if n not in self.corpus_skip:
        yield doc


def _jsonl(path) -> Iterator[tuple[int, str | None, str | None]]:
  """(line, _id, "title text") of each line; (line, why, None) for one that cannot be read."""
  with path.open("rb") as f:
    for n, raw in enumerate(f, 1):
      if not raw.strip():
        yield n, "empty line", None
        continue
      try:
        record = json.loads(raw.decode("utf-8"))
      except (ValueError, UnicodeDecodeError):
        yield n, "not a JSON object", None
        continue
      if not isinstance(record, dict) or not isinstance(record.get("_id"), (str, int)):
        yield n, "no _id", None
        continue
      title, text = record.get("title") or "", record.get("text") or ""
      if not isinstance(title, str) or not isinstance(text, str):
        yield n, "title or text is not a string", None
        continue
      yield n, str(record["_id"]), f"{title} {text}".strip()


def _read_jsonl(path, name: str, skipped: Skipped, need_text: bool) -> dict[str, str]:
  out: dict[str, str] = {}
  for n, key, text in _jsonl(path):
    if text is None:
      skipped.add(name, n, key)
    elif key in out:
      skipped.add(name, n, f"repeated _id {key!r}")
    elif need_text and not text:
      skipped.add(name, n, "no text")
    else:
      out[key] = text
  return out


def _read_qrels(path, name: str, skipped: Skipped) -> list[tuple[int, str, str, int]]:
  rows = []
  with path.open("rb") as f:
    for n, raw in enumerate(f, 1):
      try:
        fields = raw.decode("utf-8").rstrip("\r\n").split("\t")
      except UnicodeDecodeError:
        skipped.add(name, n, "invalid UTF-8")
        continue
      if n == 1 and fields[0] == "query-id":
        continue  # the header
      if len(fields) != 3:
        skipped.add(name, n, f"{len(fields)} tab-separated fields, expected 3")
        continue
      try:
        score = int(fields[2])
      except ValueError:
        skipped.add(name, n, f"score {fields[2]!r} is not an integer")
        continue
      rows.append((n, fields[0], fields[1], score))
  return rows


def load(root: str, split: str = "test") -> Task:
  """The task at `root` (a BEIR dataset directory), with the queries of `split`'s qrels."""
  base = fs.path(root)
  files = {
      "corpus": base / "corpus.jsonl",
      "queries": base / "queries.jsonl",
      "qrels": base / SPLITS_DIR / f"{split}.tsv",
  }
  for what, file in files.items():
    if not file.is_file():
      extra = ""
      if what == "qrels" and (base / SPLITS_DIR).is_dir():
        splits = sorted(p.stem for p in (base / SPLITS_DIR).glob("*.tsv"))
        extra = f" — splits here: {', '.join(splits) or 'none'}; pass --split"
      extra = extra or " (BEIR's layout: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)"
      raise errors.InputNotFoundError(f"--data {root}: no {file.relative_to(base)}{extra}")
  skipped = Skipped()
  corpus_name, queries_name = "corpus.jsonl", "queries.jsonl"
  qrels_name = f"{SPLITS_DIR}/{split}.tsv"
  seen, unique, skip_lines = set(), [], set()
  for n, key, text in _jsonl(files["corpus"]):
    if text is None or key in seen:
      skipped.add(corpus_name, n, key if text is None else f"repeated _id {key!r}")
      skip_lines.add(n)
    else:
      seen.add(key)
      unique.append(key)
  if not unique:
    raise errors.BadInputError(f"{root}/{corpus_name}: no documents")
  queries = _read_jsonl(files["queries"], queries_name, skipped, need_text=True)
  qrels: dict[str, dict[str, int]] = {}
  for n, qid, did, score in _read_qrels(files["qrels"], qrels_name, skipped):
    for key, pool, what in ((qid, queries, queries_name), (did, seen, corpus_name)):
      if key not in pool:
        raise errors.BadInputError(
            f"{root}/{qrels_name}:{n}: {key!r} is not in {what} — fix the qrels or the file "
            "(a judged id that cannot be retrieved would make every score wrong)"
        )
    qrels.setdefault(qid, {})[did] = score
  if not qrels:
    raise errors.BadInputError(f"{root}/{qrels_name}: no judgements")
  return Task(
      root=root,
      corpus_ids=unique,
      corpus_skip=skip_lines,
      queries={q: t for q, t in queries.items() if q in qrels},
      qrels=qrels,
      skipped=skipped,
  )
