"""`prepare`'s tally of problems: counts by reason, per-source counts, the first few reports.

Every repair or skip, whether found while reading (formats.py: records without text) or while
cleaning and tokenizing (text.py, encode.py), goes through `Tally.problem`, which counts it under
`skipped`, `repaired` or `warnings` in metadata.json and prints the first `max_reports` as
`prepare: FILE:LINE: reason` (`FILE:record N` for records and TFDS).
"""

from __future__ import annotations

import collections
import sys

from bertjax.data import corpus, formats, text

_SKIPPED = (text.EMPTY_FILE, text.BINARY_FILE, text.BLANK_FILE, text.NO_TOKENS, *formats.SKIPPED)
_WARNINGS = (text.SINGLE_DOCUMENT,)
ONCE_PER_FILE = (text.CRLF, text.BOM)


class Tally:
  """Counts, per-file document numbers and the first few `file:line: reason` reports."""

  def __init__(
      self,
      max_reports: int,
      tfds_text_key: str = "text",
      tfds: str | None = None,
      record_files: set[str] = frozenset(),
  ):
    self.max_reports, self.tfds_text_key, self.tfds = max_reports, tfds_text_key, tfds
    self.record_files = record_files  # reported as `file:record N`, as TFDS records are
    self.counts = {
        "skipped": collections.Counter(),
        "repaired": collections.Counter(),
        "warnings": collections.Counter(),
    }
    self.reports: list[str] = []
    self.docs_per_source: dict[str, int] = {}
    self.no_tokens: collections.Counter = collections.Counter()  # source -> lines skipped
    self.bad_records: dict[str, collections.Counter] = collections.defaultdict(
        collections.Counter
    )  # source -> {reason: records skipped}
    self.seen_once: set[tuple[str, str]] = set()

  def problem(self, source: str, line: int | None, reason: str, count: int = 1) -> None:
    """One problem at `line` (a record number for records), or `count` records from it."""
    if reason in ONCE_PER_FILE:
      if (source, reason) in self.seen_once:
        return
      self.seen_once.add((source, reason))
    if reason == text.NO_TOKENS:
      self.no_tokens[source] += count
    if reason in formats.SKIPPED:
      self.bad_records[source][reason] += count
    kind = "skipped" if reason in _SKIPPED else "warnings" if reason in _WARNINGS else "repaired"
    self.counts[kind][reason] += count
    by_record = source.startswith("tfds ") or source in self.record_files
    where = (
        source if line is None else f"{source}:record {line}" if by_record else f"{source}:{line}"
    )
    what = f"{reason} ({count} records)" if count > 1 else reason
    if len(self.reports) < self.max_reports:
      self.reports.append(f"{where}: {what}")
      print(f"prepare: {where}: {what}", file=sys.stderr)

  def drain(self, tasks: corpus.Tasks) -> None:
    """Counts the records that reading skipped (formats.py) so far."""
    found, tasks.problems[:] = list(tasks.problems), []
    for source, record, reason, count in found:
      self.problem(source, record, reason, count)

  def why_empty(self, tasks: corpus.Tasks) -> list[tuple[str, str]]:
    """(source, why it gave no document) for each source, when none gave one."""
    if not tasks.files:
      key = self.tfds_text_key
      return [(f"tfds {self.tfds}", f"no record with text in feature {key!r}")]
    out = []
    for path in tasks.files:
      if path in tasks.empty_files:
        out.append((path, text.EMPTY_FILE))
      elif path in tasks.binary_files:
        out.append((path, text.BINARY_FILE))
      elif path in self.record_files:
        counts = self.bad_records[path] + collections.Counter(
            {text.NO_TOKENS: self.no_tokens[path]}
        )
        shown = ", ".join(f"{n} {reason}" for reason, n in counts.most_common(2) if n)
        out.append((path, f"every record skipped ({shown})" if shown else formats.NO_RECORDS))
      elif self.no_tokens[path]:
        out.append((path, f"every line skipped ({self.no_tokens[path]} with no tokens)"))
      else:
        out.append((path, text.BLANK_FILE))
    return out

  def finish_files(self, tasks: corpus.Tasks) -> None:
    for path in tasks.empty_files:
      self.problem(path, None, text.EMPTY_FILE)
    for path in tasks.binary_files:
      self.problem(path, None, text.BINARY_FILE)
    for path in tasks.files:
      n = self.docs_per_source.get(path, 0)
      if n == 0 and path not in tasks.empty_files and path not in tasks.binary_files:
        self.problem(
            path, None, formats.NO_RECORDS if path in self.record_files else text.BLANK_FILE
        )
      elif n == 1 and path not in self.record_files:  # one record is one document, by design
        self.problem(path, None, text.SINGLE_DOCUMENT)
