"""Pair data for contrastive training: `bertjax prepare --kind pairs` and its batch stream.

Input: JSON lines or Parquet rows of a query, a positive and zero or more negatives
(`query_field`, `positive_field`, `negative_fields`: `query`, `positive`, `negative` by
default; a negative field may hold a string or a list of strings), with optional query and
document prompts prepended to the texts. A row without a usable
query or positive, with a negative count unlike the first good row's, or not JSON, is skipped
and counted by file and line. A row goes to the held-out split by a hash of its query (2% by
default), so a query is never in both splits and the split does not depend on row order.

Output (`metadata.json` with `"kind": "pairs"`, the tokenizer copied beside it, a
`train-00000-of-00001.tfrecord` and an `eval-...` shard): one record per row in the prepared
format (`records.encode_document`), its "sentences" the query, the positive, then the
negatives, tokenized without [CLS]/[SEP], which the stream adds.

The stream (`PairStream`) builds each global batch the same way on every host and hands each
process its rows, so its state (epoch, position, the rows held back) is global: a run resumes
exactly, on any host count. A row one of whose texts is already in the batch (as query,
positive or negative) is held back to the next batch, as sentence-transformers'
NoDuplicatesBatchSampler does; `rows_held_back` counts them, and those still held back when
the data runs out are dropped (`rows_dropped`), both in the batches' metrics. `RowOrder` is one
dataset's order and rows held back; `pair_mixture` mixes several datasets' by weight
(`config.data.sources`) with the same rule across them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Iterator

import numpy as np

from bertjax import errors
from bertjax.data import prepare_config, records
from bertjax.runtime import fs

KIND = "pairs"
DEFAULT_EVAL_FRACTION = prepare_config.DEFAULT_EVAL_FRACTION
_EXAMPLES = 20  # problems quoted in metadata.json (all are counted)
_ENCODE_ROWS = 8192  # rows tokenized in one batch, with a progress line after each


@dataclasses.dataclass(frozen=True)
class PairsConfig:
  output: str
  tokenizer: str
  inputs: tuple[str, ...]
  query_field: str = "query"
  positive_field: str = "positive"
  negative_fields: tuple[str, ...] | None = None  # None: "negative" when the rows have it
  eval_fraction: float = DEFAULT_EVAL_FRACTION
  overwrite: bool = False
  # Prepended to every query / every positive and negative before tokenizing, as
  # sentence-transformers' prompts ("query: ", "passage: "); recorded in metadata.json.
  query_prompt: str = ""
  document_prompt: str = ""


# ----------------------------------------------------------------------------- reading rows


def _rows(path: str) -> Iterator[tuple[int, object]]:
  """(line or row number from 1, the record or None when the line is not JSON)."""
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq

    number = 0
    with fs.path(path).open("rb") as f:
      for batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
        for record in batch.to_pylist():
          number += 1
          yield number, record
    return
  with fs.path(path).open("rb") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        yield number, json.loads(line)
      except (ValueError, RecursionError):
        yield number, None


def _text(record: dict, field: str) -> str | None:
  value = record.get(field)
  return value if isinstance(value, str) and value.strip() else None


def _row_texts(record, cfg: PairsConfig, negative_fields) -> tuple[list[str] | None, str]:
  """([query, positive, negatives...], "") or (None, why the row is skipped)."""
  if not isinstance(record, dict):
    return None, "not a JSON object" if record is not None else "unparseable JSON line"
  texts = []
  for field in (cfg.query_field, cfg.positive_field):
    text = _text(record, field)
    if text is None:
      what = "missing" if field not in record else "not a non-blank string"
      return None, f"field {field!r} {what}"
    texts.append(text)
  for field in negative_fields:
    value = record.get(field)
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
      return None, f"field {field!r} not a non-blank string or list of them"
    texts.extend(values)
  return texts, ""


def _negative_fields(cfg: PairsConfig, first: dict) -> tuple[str, ...]:
  if cfg.negative_fields is not None:
    return cfg.negative_fields
  return ("negative",) if "negative" in first else ()


def _held_out(query: str, fraction: float) -> bool:
  return records.crc32c(query.encode("utf-8", errors="replace")) % 100_000 < fraction * 100_000


# ----------------------------------------------------------------------------- prepare


def prepare(cfg: PairsConfig) -> dict:
  """Tokenizes the rows of `cfg.inputs` into `cfg.output`; returns the metadata."""
  from bertjax.data import prepare as prepare_lib, wordpiece

  if not cfg.inputs:
    raise errors.UsageError("prepare --kind pairs: name the pair files with --input FILE")
  if not 0 <= cfg.eval_fraction < 1:
    raise errors.ConfigError(f"--eval-fraction {cfg.eval_fraction}: must be in [0, 1)")
  for path in cfg.inputs:
    if not fs.path(path).is_file():
      raise errors.InputNotFoundError(f"--input {path}: no such file")
  tok = wordpiece.load_tokenizer(cfg.tokenizer)
  out = fs.path(cfg.output)
  if (out / "metadata.json").exists() and not cfg.overwrite:
    raise errors.OutputExistsError(
        f"--output {cfg.output} already holds prepared data — pass --overwrite to replace it"
    )
  start = time.perf_counter()
  splits: dict[str, list[bytes]] = {"train": [], "eval": []}
  skipped: dict[str, dict[str, int]] = {}
  examples: list[str] = []
  negatives, fields, tokens = None, None, 0

  def skip(path, number, why):
    skipped.setdefault(path, {}).setdefault(why, 0)
    skipped[path][why] += 1
    if len(examples) < _EXAMPLES:
      examples.append(f"{path}:{number}: {why}")

  def encode(rows: list[tuple[str, list[str]]]) -> int:
    """Tokenizes `rows` (split, texts) in one batch into their split; the tokens."""
    prompted = [
        [cfg.query_prompt + texts[0]] + [cfg.document_prompt + t for t in texts[1:]]
        for _, texts in rows
    ]
    ids = iter(tok.encode_batch([t for texts in prompted for t in texts]))
    n = 0
    for (split, _), texts in zip(rows, prompted):
      row = [next(ids) for _ in texts]
      n += sum(map(len, row))
      splits[split].append(records.frame_record(records.encode_document(row)))
    return n

  for path in cfg.inputs:
    batch: list[tuple[str, list[str]]] = []
    done = 0
    for number, record in _rows(path):
      if fields is None and isinstance(record, dict):
        fields = _negative_fields(cfg, record)
      texts, why = _row_texts(record, cfg, fields or ())
      if texts is not None and negatives is None:
        negatives = len(texts) - 2
      if texts is not None and len(texts) - 2 != negatives:
        texts, why = None, f"{len(texts) - 2} negatives, not {negatives} as the first row"
      if texts is None:
        skip(path, number, why)
        continue
      batch.append(("eval" if _held_out(texts[0], cfg.eval_fraction) else "train", texts))
      if len(batch) == _ENCODE_ROWS:
        tokens += encode(batch)
        done, batch = done + len(batch), []
        print(f"prepare: {path}: {done} rows so far", file=sys.stderr, flush=True)
    tokens += encode(batch) if batch else 0
    print(f"prepare: {path}: {done + len(batch)} rows", file=sys.stderr, flush=True)
  if not splits["train"]:
    raise errors.BadInputError(
        f"prepare --kind pairs: no usable row in {', '.join(cfg.inputs)} "
        f"({'; '.join(examples[:2]) or 'empty'}) — check --query-field and --positive-field"
    )
  out.mkdir(parents=True, exist_ok=True)
  shards = []
  for split, rows in splits.items():
    if rows:
      name = records.shard_name(split, 0, 1)
      (out / name).write_bytes(b"".join(rows))  # metadata.json, written last, publishes them
      shards.append({"file": name, "split": split, "documents": len(rows)})
  meta = {
      "kind": KIND,
      "format_version": records.FORMAT_VERSION,
      "documents": sum(len(r) for r in splits.values()),
      "tokens": tokens,
      "negatives": negatives,
      "fields": {
          "query": cfg.query_field,
          "positive": cfg.positive_field,
          "negatives": list(fields or ()),
      },
      "prompts": {"query": cfg.query_prompt, "document": cfg.document_prompt},
      "skipped": {p: dict(sorted(w.items())) for p, w in skipped.items()},
      "examples_of_problems": examples,
      "tokenizer": prepare_lib.copy_tokenizer(tok, out, 0),
      "shards": shards,
      "inputs": list(cfg.inputs),
      "eval_fraction": cfg.eval_fraction,
      "seconds": round(time.perf_counter() - start, 3),
  }
  records.write_metadata(out, meta, 0, 1)
  for line in examples[:5]:
    print(f"prepare: skipped {line}", file=sys.stderr)
  return meta


def is_pairs(meta: dict | None) -> bool:
  return bool(meta) and meta.get("kind") == KIND


def prompts_of(meta: dict | None) -> dict[str, str] | None:
  """The prompts pair data was prepared with (`query`, `document`; an empty one left out, as in
  data prepared before prompts were recorded); None for data that is not pairs."""
  if not is_pairs(meta):
    return None
  return {k: str(v) for k, v in (meta.get("prompts") or {}).items() if v}


# ----------------------------------------------------------------------------- the stream


def load_rows(path: str, split: str) -> list[list[np.ndarray]]:
  """Every row of one split: [query, positive, negatives...] token arrays."""
  meta = records.load_metadata(path)
  rows = []
  for shard in records.split_shards(meta, path, split):
    rows.extend(records.read_documents(str(fs.path(path) / shard["file"])))
  return rows


class RowOrder:
  """One pair dataset's rows in a new order each epoch (a permutation drawn from `seed` and the
  epoch), and the rows held back. A batch is `start`, `take` per row, `finish`.

  Its state (epoch, position, the rows held back, the counts) is global: every host builds the
  same batches. A row one of whose texts the batch already holds is held back to the next
  batch; those still held back when the epoch ends are dropped (the next epoch holds them)."""

  def __init__(self, rows: list[list[np.ndarray]], seed: int, state: dict | None = None):
    self.rows, self.seed = rows, seed
    self.state = dict(epoch=0, position=0, held=[], held_back=0, dropped=0)
    self.state.update(state or {})
    self._cached = (-1, None)

  def _order(self, epoch: int) -> np.ndarray:
    if self._cached[0] != epoch:
      self._cached = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.rows)))
    return self._cached[1]

  def start(self) -> None:
    self._candidates, self._held, self._rolled = list(self.state["held"]), [], False

  def take(self, seen: set[bytes]) -> int | None:
    """The next row none of whose texts is in `seen` (its texts are then added to `seen`);
    None when this batch has gone past a whole epoch's end without finding one."""
    s = self.state
    while True:
      if self._candidates:
        i = self._candidates.pop(0)
      else:
        if s["position"] >= len(self.rows):  # the epoch is over: what is still held back is lost
          if self._rolled:
            return None
          self._rolled = True
          s["dropped"] += len(self._held)
          self._held = []
          s["epoch"] += 1
          s["position"] = 0
        i = int(self._order(s["epoch"])[s["position"]])
        s["position"] += 1
      texts = {t.tobytes() for t in self.rows[i]}
      if texts & seen:
        self._held.append(i)
        s["held_back"] += 1
        continue
      seen |= texts
      return i

  def finish(self) -> None:
    self.state["held"] = self._held + self._candidates


def frame_rows(rows: list[list[np.ndarray]], special: dict[str, int], seq_len: int) -> dict:
  """`query_ids`/`query_mask` [b, L] and `doc_ids`/`doc_mask` [b, D, L] of `rows`: [CLS] text
  [SEP], truncated and padded to `seq_len`."""
  ids = np.full((len(rows), len(rows[0]), seq_len), special["pad"], np.int32)
  mask = np.zeros(ids.shape, np.int32)
  for r, row in enumerate(rows):
    for t, text in enumerate(row):
      body = text[: seq_len - 2]
      ids[r, t, : len(body) + 2] = np.concatenate([[special["cls"]], body, [special["sep"]]])
      mask[r, t, : len(body) + 2] = 1
  return {
      "query_ids": ids[:, 0],
      "query_mask": mask[:, 0],
      "doc_ids": ids[:, 1:],
      "doc_mask": mask[:, 1:],
  }


def real_tokens(rows: list[list[np.ndarray]], seq_len: int) -> np.ndarray:
  """[rows] the real (not padding) tokens of each row as framed: its texts, [CLS] and [SEP]."""
  return np.array([sum(min(len(t), seq_len - 2) + 2 for t in row) for row in rows], np.float64)


def is_state(state: dict | None) -> bool:
  """Whether an input state is a pair stream's (one dataset's or a mixture's)."""
  return bool(state) and (state.get("kind") == KIND or "held" in state)


def resume_state(saved: list[dict]) -> tuple[dict, str]:
  """The state every host resumes from, whatever the host count: the pair streams build each
  global batch the same on every host, so the hosts saved the same state."""
  if any(s != saved[0] for s in saved):
    raise errors.ConfigError(f"the saved pair-stream states of the {len(saved)} hosts disagree")
  return saved[0], "the pair stream's global position (the same on every host) goes on"


def local_rows(global_batch_size: int, process_index: int, process_count: int) -> slice:
  """This process's rows of the global batch; an error when the batch does not divide."""
  if global_batch_size % process_count:
    raise errors.ConfigError(
        f"the batch of {global_batch_size} rows does not divide over {process_count} processes"
    )
  b = global_batch_size // process_count
  return slice(process_index * b, (process_index + 1) * b)


class PairStream:
  """Batches of `frame_rows` of this process's rows of the global batch; endless, in a new
  order each epoch (`RowOrder`)."""

  def __init__(
      self,
      rows: list[list[np.ndarray]],
      special: dict[str, int],
      seq_len: int,
      global_batch_size: int,
      process_index: int = 0,
      process_count: int = 1,
      seed: int = 0,
      state: dict | None = None,
  ):
    self.local = local_rows(global_batch_size, process_index, process_count)
    if len(rows) < global_batch_size:
      raise errors.ConfigError(
          f"the pair data holds {len(rows)} rows, fewer than one batch of "
          f"{global_batch_size} — lower config.train.batch_size"
      )
    if state and "sources" in state:
      raise errors.ConfigError(
          "the input state was saved by a run mixing config.data.sources; this run reads one "
          "pair dataset (config.data.path) — resume with the config it was saved with"
      )
    self.rows, self.special, self.seq_len = rows, special, seq_len
    self.batch, self.seed = global_batch_size, seed
    self.order = RowOrder(rows, seed, {k: v for k, v in (state or {}).items() if k != "kind"})

  def get_state(self) -> dict:
    return json.loads(json.dumps({"kind": KIND, **self.order.state}))

  def __iter__(self):
    return self

  def _pick(self) -> list[int]:
    """The next global batch's row indices, none of whose texts repeats another's."""
    chosen, seen = [], set()
    self.order.start()
    while len(chosen) < self.batch:
      i = self.order.take(seen)
      if i is None:
        raise errors.BadInputError(
            f"the pair data cannot fill a batch of {self.batch} rows without repeating a "
            f"text: a whole epoch gave {len(chosen)} (most rows share a query, positive "
            "or negative) — lower config.train.batch_size or deduplicate the pairs"
        )
      chosen.append(i)
    self.order.finish()
    return chosen

  def __next__(self) -> dict:
    return frame_rows([self.rows[i] for i in self._pick()[self.local]], self.special, self.seq_len)

  def close(self) -> None:
    pass
