"""`bertjax prepare --runner beam`: the same preparation as an Apache Beam pipeline.

The local path (prepare.py) reads the input in one process and tokenizes in a pool; this one
hands the same work to a data-processing engine (Beam's DirectRunner here, Dataflow, Flink or
Spark by `--beam-option runner=...`), which schedules it over its workers and retries what
fails. One implementation, two drivers: the checks before anything is written
(`prepare.prepare`, which runs this driver in place of its own), the readers (corpus.py,
formats.py), the per-document work (encode.process: cleaning, sentence splitting, tokenizing,
the word segmenter, the held-out hash), the shuffle (shuffle.Shuffler), the tally of problems
(problems.Tally) and metadata.json (prepare.finish) are the local path's own functions.

The pipeline:
  units     the input cut by the engine's grain: an uncompressed text or JSON-lines file in spans
            of `split_bytes` (a span starts at a document boundary: corpus.document_start, or
            at a line for JSON lines), a compressed one whole (its stream cannot be entered in
            the middle), a Parquet file by row group, an Arrow file whole, a TFDS split in
            parts of its files
  read      each unit into corpus.Task chunks of about `chunk_bytes`, as the local path cuts them
  encode    encode.process on each task (the pool's function), after a reshuffle that spreads
            the tasks of one unit over the workers
  shards    each document to a shard of its split by a seeded hash of its record, each shard
            shuffled by shuffle.Shuffler (seeded by the shard) and written whole
  summary   the counts, the first `max_reports` problems in input order and the shard list,
            combined into one file that the launcher reads to write metadata.json

The data is the local path's: the same documents (as a multiset), the same held-out split (a
hash of each document's tokens), the same counts of skipped and repaired records. Shards differ
in order and in which documents share one (the local path deals a global shuffle round-robin).
A document over corpus.MAX_DOC_BYTES without a blank line, which both paths cut into several,
may be cut at other places when a span starts inside it.

Outputs: a local output is written in a hidden directory and the shards renamed into place when
all are done, as the local path does; on an object store (gs://) the shards are written in place
(copying terabytes through the launcher would undo the point), after the old metadata is
removed, so an interrupted run leaves no metadata.json and readers refuse the directory.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import random
import sys
import tempfile
import time
from typing import Any, Iterable, Iterator, Sequence

from etils import epath

from bertjax import errors
from bertjax.data import corpus, encode, formats, prepare as prepare_lib, problems, records, shuffle
from bertjax.data.prepare_config import PrepareConfig
from bertjax.runtime import fs

# An uncompressed text or JSON-lines file is read in spans of this many bytes, one per unit.
SPLIT_BYTES = 64 << 20
# A TFDS split is read in at most this many parts (at most one per file of the dataset).
MAX_TFDS_PARTS = 256
# Each worker prints its totals this often (seconds).
PROGRESS_S = 30.0
# The totals counted as the pipeline runs (Beam metrics).
_COUNTED = ("documents", "tokens", "input_bytes")
# The file the pipeline leaves for the launcher in the scratch directory.
_SUMMARY = "summary.json"
# Reasons counted once per file (problems.py), kept once per file here too.
_ONCE_PER_FILE = problems.ONCE_PER_FILE


def _beam():
  try:
    import apache_beam
  except ImportError:
    raise errors.ConfigError(
        "--runner beam needs Apache Beam — pip install 'bertjax[beam]' (or apache-beam), or "
        "drop --runner beam to prepare on this machine"
    ) from None
  return apache_beam


def pipeline_options(flags: Sequence[str], processes: int):
  """Beam's PipelineOptions of `--beam-option KEY=VALUE` flags (KEY alone: a switch), over the
  default DirectRunner in multi-processing mode with `processes` workers. An option Beam does
  not know is an error naming it (Beam itself would drop it with a warning)."""
  from apache_beam.options.pipeline_options import PipelineOptions

  known = set()  # Beam's flag names (`extra_package`) and their destinations (`extra_packages`)

  def grab(parser) -> None:
    for action in parser._actions:
      known.update(s.lstrip("-") for s in action.option_strings)
      known.add(action.dest)

  PipelineOptions([]).get_all_options(add_extra_args_fn=grab)
  args = {
      "runner": "DirectRunner",
      "direct_running_mode": "multi_processing",
      "direct_num_workers": str(processes),
      "default_sdk_harness_log_level": "WARNING",  # the workers' INFO lines: a few per bundle
  }
  given = []
  for flag in flags:
    key, eq, value = flag.partition("=")
    key = key.strip().lstrip("-").replace("-", "_")
    if not key or key not in known:
      raise errors.ConfigError(
          f"--beam-option {flag}: {key or '(empty)'} is not a Beam pipeline option — give "
          "KEY=VALUE with a key of Beam's PipelineOptions (runner, direct_num_workers, project, "
          "region, temp_location, ...)"
      )
    given.append((key, value if eq else None))
  for key, _ in given:
    args.pop(key, None)
  argv = [f"--{k}={v}" for k, v in args.items()]
  argv += [f"--{k}" if v is None else f"--{k}={v}" for k, v in given]
  return PipelineOptions(argv)


def prepare(
    cfg: PrepareConfig, beam_options: Sequence[str] = (), split_bytes: int = SPLIT_BYTES
) -> dict:
  """`prepare.prepare` with the work done by a Beam pipeline; returns the metadata."""
  _beam()
  if cfg.num_workers != 1:
    raise errors.ConfigError(
        f"PrepareConfig.num_workers={cfg.num_workers}: with the Beam runner the engine shares "
        "the work among its workers — drop --worker-index and --num-workers"
    )
  options = pipeline_options(beam_options, cfg.processes)
  run = functools.partial(_run, options=options, split_bytes=split_bytes)
  return prepare_lib.prepare(cfg, run=run)


# ----------------------------------------------------------------------------- units


@dataclasses.dataclass(frozen=True)
class Unit:
  """One piece of the input that one worker reads: a span of a file, a Parquet row group, an
  Arrow file, a part of a TFDS split."""

  source: str  # the file (a TFDS part: its split spec)
  order: int  # the file's place among the inputs: problems are reported in input order
  fmt: str  # "text", "jsonl", "parquet", "arrow" or "tfds"
  span: tuple[int, int] | None = None  # bytes of an uncompressed text or JSON-lines file
  row_group: int | None = None  # of a Parquet file
  part: tuple[int, int] | None = None  # (index, parts) of a TFDS split

  @property
  def start(self) -> int:
    """Where the unit's line and record numbers count from (numbers are relative to it)."""
    return self.span[0] if self.span else self.part[0] if self.part else 0


def plan(cfg: PrepareConfig, tasks: corpus.Tasks, split_bytes: int) -> list[Unit]:
  """The units of the input that `tasks` checked (its empty and binary files left out)."""
  if cfg.tfds:
    n = _tfds_parts(cfg)
    return [Unit(cfg.tfds, 0, "tfds", part=(i, n)) for i in range(n)]
  skip = set(tasks.empty_files) | set(tasks.binary_files)
  units = []
  for order, path in enumerate(tasks.files):
    fmt = tasks.formats[path]
    if path in skip:
      continue
    if fmt in ("text", "jsonl") and corpus.compression(path) is None:
      size = corpus.file_size(path)
      for start in range(0, size, split_bytes):
        units.append(Unit(path, order, fmt, span=(start, min(size, start + split_bytes))))
    elif fmt == "parquet":
      groups = formats.parquet_row_groups(path)
      units += [Unit(path, order, fmt, row_group=g) for g in range(groups)]
    else:
      units.append(Unit(path, order, fmt))
  return units


def _tfds_parts(cfg: PrepareConfig) -> int:
  """Into how many parts a TFDS split is read: one per file of the dataset, at most
  MAX_TFDS_PARTS."""
  import tensorflow_datasets as tfds

  name, _, split = cfg.tfds.partition(":")
  try:
    info = tfds.builder(name, data_dir=cfg.tfds_data_dir).info.splits[split or "train"]
  except (KeyError, ValueError):  # a split expression, or no file list (mock data): one part
    return 1
  return max(1, min(MAX_TFDS_PARTS, info.num_shards or 1, info.num_examples or 1))


def read_unit(unit: Unit, cfg: PrepareConfig) -> Iterator[tuple[Unit, corpus.Task] | "Summary"]:
  """The tasks of one unit, as the local path cuts them (corpus.Tasks), each with its unit,
  then a Summary of the records skipped while reading and of the unit's lines."""
  summary = Summary(cfg.max_reports)
  problem = lambda record, reason, count: summary.problem(unit, unit.source, record, reason, count)
  lines = 0
  if unit.fmt == "text":
    max_doc = corpus.max_doc_bytes(cfg)
    for first, data, continued in corpus.file_chunks(
        unit.source, cfg.chunk_bytes, max_doc, span=unit.span
    ):
      lines = first + data.count(b"\n")
      first_chunk = unit.start == 0 and not (first or continued)
      yield unit, corpus.Task(unit.source, first, data, first_chunk, continued)
  elif unit.fmt == "tfds":
    ds, source = corpus.open_tfds(cfg, *unit.part)
    for task in corpus.tfds_tasks(ds, source, cfg.tfds_text_key):
      yield unit, task
  else:
    if unit.fmt == "jsonl":
      if unit.span:
        source = corpus.span_lines(unit.source, unit.span)
      else:
        source = corpus.read_lines(unit.source)
      counted = _counting(source)
      chunks = formats.json_chunks(counted, cfg.text_field, cfg.chunk_bytes, _all, problem)
    else:
      groups = iter(range(1 << 62))
      select = _all if unit.row_group is None else lambda: next(groups) == unit.row_group
      chunks = formats.columnar_chunks(
          unit.source, unit.fmt, cfg.text_field, cfg.chunk_bytes, select, problem
      )
    for first, texts in chunks:
      yield unit, corpus.Task(unit.source, first, texts)
    lines = counted.n if unit.fmt == "jsonl" else 0
  if unit.span:
    summary.lines[(unit.source, unit.start)] = lines
  yield summary


def _all() -> bool:
  return True


class _counting:
  """An iterator of lines that counts them (`n`)."""

  def __init__(self, lines: Iterable[bytes]):
    self._lines, self.n = iter(lines), 0

  def __iter__(self):
    return self

  def __next__(self) -> bytes:
    line = next(self._lines)
    self.n += 1
    return line


# ----------------------------------------------------------------------------- the summary


@dataclasses.dataclass
class Summary:
  """What the pipeline counted, merged over its workers: problems by (source, reason), the
  first `max_reports` problems in input order, lines per span, documents per source, totals."""

  max_reports: int
  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  # (order, unit start, line within the unit, source, reason, count), the first in input order
  examples: list = dataclasses.field(default_factory=list)
  lines: dict = dataclasses.field(default_factory=dict)  # (source, span start) -> lines
  docs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  totals: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  shards: list = dataclasses.field(default_factory=list)

  def problem(self, unit: Unit, source: str, line: int, reason: str, count: int = 1) -> None:
    """A problem at `line` of `unit` (counted from its start), or `count` records from it."""
    self.counts[(source, reason)] += count
    self.examples.append((unit.order, unit.start, line, source, reason, count))
    if len(self.examples) > 4 * self.max_reports + 16:
      self._trim()

  def merge(self, other: "Summary") -> "Summary":
    self.counts.update(other.counts)
    self.examples += other.examples
    self.lines.update(other.lines)
    self.docs.update(other.docs)
    self.totals.update(other.totals)
    self.shards += other.shards
    self._trim()
    return self

  def _trim(self) -> None:
    """Keeps the first `max_reports` examples, a reason of _ONCE_PER_FILE once per file."""
    kept, seen = [], set()
    for example in sorted(self.examples):
      if len(kept) >= self.max_reports:
        break
      if example[4] in _ONCE_PER_FILE:
        if (example[3], example[4]) in seen:
          continue
        seen.add((example[3], example[4]))
      kept.append(example)
    self.examples = kept

  def to_json(self) -> str:
    return json.dumps(
        {
            "max_reports": self.max_reports,
            "counts": [[s, r, n] for (s, r), n in self.counts.items()],
            "examples": self.examples,
            "lines": [[s, start, n] for (s, start), n in self.lines.items()],
            "docs": self.docs,
            "totals": self.totals,
            "shards": self.shards,
        }
    )

  @classmethod
  def from_json(cls, text: str) -> "Summary":
    d = json.loads(text)
    return cls(
        d["max_reports"],
        collections.Counter({(s, r): n for s, r, n in d["counts"]}),
        [tuple(e) for e in d["examples"]],
        {(s, start): n for s, start, n in d["lines"]},
        collections.Counter(d["docs"]),
        collections.Counter(d["totals"]),
        d["shards"],
    )

  def tally(self, cfg: PrepareConfig, tasks: corpus.Tasks) -> problems.Tally:
    """The local path's Tally of these counts: the examples reported first (`file:line` from
    the start of the file), then the rest counted."""
    tally = problems.Tally(cfg.max_reports, cfg.tfds_text_key, cfg.tfds, tasks.record_files)
    before = collections.defaultdict(list)  # source -> sorted (span start, lines)
    for (source, start), n in sorted(self.lines.items()):
      before[source].append((start, n))
    left = collections.Counter(self.counts)
    for _, start, line, source, reason, count in sorted(self.examples):
      line += sum(n for s, n in before.get(source, ()) if s < start)
      tally.problem(source, line, reason, count)
      left[(source, reason)] -= count
    for (source, reason), n in sorted(left.items()):
      if reason in _ONCE_PER_FILE:
        n = 1 if (source, reason) not in tally.seen_once else 0
      if n > 0:
        tally.problem(source, None, reason, n)
    tally.docs_per_source = dict(self.docs)
    return tally


class _Combine:
  """Beam's CombineFn of Summaries (made a subclass when Beam is imported)."""

  def __init__(self, max_reports: int):
    self.max_reports = max_reports

  def create_accumulator(self) -> Summary:
    return Summary(self.max_reports)

  def add_input(self, acc: Summary, summary: Summary) -> Summary:
    return acc.merge(summary)

  def merge_accumulators(self, accs) -> Summary:
    out = Summary(self.max_reports)
    for acc in accs:
      out.merge(acc)
    return out

  def extract_output(self, acc: Summary) -> Summary:
    return acc


# ----------------------------------------------------------------------------- the work


def encode_task(item: tuple[Unit, corpus.Task], cfg: PrepareConfig) -> Iterator:
  """encode.process on one task: ((split, shard), (record, sentences, tokens)) for each
  document, then the task's Summary."""
  unit, task = item
  result = encode.process(task)
  summary = Summary(cfg.max_reports)
  for line, reason in result.problems:
    summary.problem(unit, task.source, line, reason)
  summary.docs[task.source] += len(result.records)
  summary.totals.update(
      documents=len(result.records),
      sentences=result.sentences,
      tokens=result.tokens,
      input_bytes=result.nbytes,
  )
  for record, sentences, tokens, is_eval in result.records:
    split = "eval" if is_eval else "train"
    yield (split, shard_of(record, split, cfg)), (record, sentences, tokens)
  yield summary


def shard_counts(cfg: PrepareConfig) -> dict[str, int]:
  return {"train": cfg.num_shards, "eval": cfg.eval_shards if cfg.eval_fraction else 0}


def shard_of(record: bytes, split: str, cfg: PrepareConfig) -> int:
  """The shard of a document: a hash of its record keyed by the seed (the same seed, the same
  shards; a shard is a random sample of its split)."""
  key = f"prepare/{cfg.seed}".encode()
  digest = hashlib.blake2b(record, digest_size=8, key=key).digest()
  return int.from_bytes(digest, "little") % shard_counts(cfg)[split]


def write_shard(
    key: tuple[str, int], documents: Iterable, cfg: PrepareConfig, directory: str, expected: int
) -> dict:
  """Writes one shard, its documents shuffled by shuffle.Shuffler (piles on local disk, one in
  memory at a time); its entry in metadata.json."""
  split, index = key
  name = records.shard_name(split, index, shard_counts(cfg)[split])
  shard = {"file": name, "split": split, "documents": 0, "sentences": 0, "tokens": 0, "bytes": 0}
  rng = random.Random(f"prepare/{cfg.seed}/{split}/{index}")
  with tempfile.TemporaryDirectory(prefix="bertjax-shard-") as tmp:
    piles = shuffle.Shuffler(epath.Path(tmp), split, expected, cfg.shuffle_bytes, rng)
    try:
      for record, sentences, tokens in documents:
        piles.add(record, sentences, tokens)
    finally:
      piles.close()
    with (fs.path(directory) / name).open("wb") as f:
      for record, sentences, tokens in piles.shuffled():
        f.write(record)
        shard["documents"] += 1
        shard["sentences"] += sentences
        shard["tokens"] += tokens
        shard["bytes"] += len(record)
  return shard


def _build(p, beam, cfg: PrepareConfig, units: list[Unit], shard_dir: str, scratch: str, expected):
  """The pipeline (module docstring) on `p`."""
  combine = type("CombineSummaries", (_Combine, beam.CombineFn), {})(cfg.max_reports)

  def tag(items):
    for item in items:
      yield beam.pvalue.TaggedOutput("summary", item) if isinstance(item, Summary) else item

  # Progress, in the runner's own monitoring (the Dataflow console's job counters).
  counters = {k: beam.metrics.Metrics.counter("prepare", k) for k in _COUNTED}

  class Encode(beam.DoFn):

    def setup(self):
      encode.init_worker(cfg)  # the tokenizer and segmenter, once per worker
      self.done, self.said = collections.Counter(), time.monotonic()

    def process(self, item):
      for out in tag(encode_task(item, cfg)):
        if isinstance(out, beam.pvalue.TaggedOutput):
          for k in _COUNTED:
            counters[k].inc(out.value.totals[k])
          self.done.update(out.value.totals)
          self.progress()
        yield out

    def progress(self):
      """Every PROGRESS_S seconds, this worker's totals on its stderr (the DirectRunner's
      workers share the terminal; on Dataflow they go to the worker logs)."""
      if time.monotonic() - self.said < PROGRESS_S:
        return
      self.said = time.monotonic()
      d = self.done
      print(
          f"prepare: a worker has done {d['documents']} documents, {d['tokens'] / 1e6:.1f} M "
          f"tokens, {d['input_bytes'] / 1e6:.0f} MB of input",
          file=sys.stderr,
          flush=True,
      )

  read = (
      p
      | "units" >> beam.Create(units)
      | "spread units" >> beam.Reshuffle()
      | "read"
      >> beam.FlatMap(lambda u: tag(read_unit(u, cfg)))
      .with_output_types(Any)
      .with_outputs("summary", main="tasks")
  )
  encoded = (
      read.tasks
      | "spread tasks" >> beam.Reshuffle()
      | "encode"
      >> beam.ParDo(Encode()).with_output_types(Any).with_outputs("summary", main="documents")
  )
  shards = (
      encoded.documents
      | "by shard" >> beam.GroupByKey()
      | "write shards"
      >> beam.MapTuple(
          lambda key, docs: Summary(
              cfg.max_reports, shards=[write_shard(key, docs, cfg, shard_dir, expected)]
          )
      )
  )
  summary = (
      (read.summary, encoded.summary, shards)
      | "all summaries" >> beam.Flatten()
      | "summary" >> beam.CombineGlobally(combine)
  )
  summary | "write summary" >> beam.Map(
      lambda s: (fs.path(scratch) / _SUMMARY).write_text(s.to_json())
  )


def _run(
    cfg: PrepareConfig, tok, out: epath.Path, tasks: corpus.Tasks, *, options, split_bytes: int
) -> dict:
  """prepare._prepare's part with the work in a Beam pipeline: plan the units, run the
  pipeline, then place the shards and write the metadata as the local path does."""
  beam = _beam()
  start = time.perf_counter()
  local = fs.is_local(out)
  scratch = out / f".prepare-{cfg.worker_index}.tmp"
  prepare_lib.remove_dir(scratch)
  scratch.mkdir()
  shard_dir = scratch if local else out
  try:
    if not local:  # the shards are written in place: no old metadata beside new shards
      (out / records.metadata_name(0, 1)).unlink(missing_ok=True)
    units = plan(cfg, tasks, split_bytes)
    runner = options.get_all_options()["runner"]
    print(f"prepare: {len(units)} units of input on the Beam runner {runner}", file=sys.stderr)
    expected = max(1, tasks.total_bytes // cfg.num_shards)
    with beam.Pipeline(options=options) as p:
      _build(p, beam, cfg, units, str(shard_dir), str(scratch), expected)
    summary = Summary.from_json((scratch / _SUMMARY).read_text())
    tally = summary.tally(cfg, tasks)
    if not summary.totals["documents"]:
      raise corpus.no_documents(tally.why_empty(tasks), records=bool(tasks.record_files))
    shards = sorted(summary.shards, key=lambda s: (s["split"] != "train", s["file"]))
    tally.finish_files(tasks)
    prepare_lib.say_missing_shards(cfg, shard_counts(cfg), shards)
    prepare_lib.publish(cfg, shard_dir, out, shards)
  finally:
    prepare_lib.remove_dir(scratch)
  tokenizer_meta = prepare_lib.copy_tokenizer(tok, out, cfg.worker_index)
  totals = collections.Counter(summary.totals)
  print(
      f"prepare: {totals['documents']} documents, {totals['tokens']} tokens in "
      f"{time.perf_counter() - start:.1f} s",
      file=sys.stderr,
  )
  return prepare_lib.finish(cfg, out, tasks, tally, totals, shards, tokenizer_meta, start)
