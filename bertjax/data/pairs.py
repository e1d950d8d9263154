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
the data runs out are dropped (`rows_dropped`), both in the batches' metrics.
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


# ----------------------------------------------------------------------------- the stream


def load_rows(path: str, split: str) -> list[list[np.ndarray]]:
  """Every row of one split: [query, positive, negatives...] token arrays."""
  meta = records.load_metadata(path)
  rows = []
  for shard in records.split_shards(meta, path, split):
    rows.extend(records.read_documents(str(fs.path(path) / shard["file"])))
  return rows


class PairStream:
  """Batches of `query_ids`/`query_mask` [b, L] and `doc_ids`/`doc_mask` [b, D, L] (b: this
  process's rows of the global batch), [CLS] text [SEP], truncated and padded to `seq_len`;
  endless, in a new order each epoch (a permutation drawn from `seed` and the epoch)."""

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
    if global_batch_size % process_count:
      raise errors.ConfigError(
          f"the batch of {global_batch_size} rows does not divide over {process_count} processes"
      )
    if len(rows) < global_batch_size:
      raise errors.ConfigError(
          f"the pair data holds {len(rows)} rows, fewer than one batch of "
          f"{global_batch_size} — lower config.train.batch_size"
      )
    self.rows, self.special, self.seq_len = rows, special, seq_len
    self.batch, self.seed = global_batch_size, seed
    self.local = slice(
        process_index * global_batch_size // process_count,
        (process_index + 1) * global_batch_size // process_count,
    )
    self.state = dict(epoch=0, position=0, held=[], held_back=0, dropped=0)
    self.state.update(state or {})

  def get_state(self) -> dict:
    return json.loads(json.dumps(self.state))

  def __iter__(self):
    return self

  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

  def _pick(self) -> list[int]:
    """The next global batch's row indices, none of whose texts repeats another's."""
    s = self.state
    order = self._order(s["epoch"])
    chosen, seen, held = [], set(), []
    candidates = list(s["held"])
    epochs = 0
    while len(chosen) < self.batch:
      if candidates:
        i = candidates.pop(0)
      else:
        if s["position"] >= len(order):  # the epoch is over: what is still held back is lost
          epochs += 1
          if epochs > 1:
            raise errors.BadInputError(
                f"the pair data cannot fill a batch of {self.batch} rows without repeating a "
                f"text: a whole epoch gave {len(chosen)} (most rows share a query, positive "
                "or negative) — lower config.train.batch_size or deduplicate the pairs"
            )
          s["dropped"] += len(held)
          held = []
          s["epoch"] += 1
          s["position"], order = 0, self._order(s["epoch"])
        i = int(order[s["position"]])
        s["position"] += 1
      texts = {t.tobytes() for t in self.rows[i]}
      if texts & seen:
        held.append(i)
        s["held_back"] += 1
        continue
      seen |= texts
      chosen.append(i)
    s["held"] = held + candidates
    return chosen

  def _frame(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = np.full(self.seq_len, self.special["pad"], np.int32)
    body = ids[: self.seq_len - 2]
    out[: len(body) + 2] = np.concatenate([[self.special["cls"]], body, [self.special["sep"]]])
    mask = np.zeros(self.seq_len, np.int32)
    mask[: len(body) + 2] = 1
    return out, mask

  def __next__(self) -> dict:
    picked = self._pick()[self.local]
    framed = [[self._frame(t) for t in self.rows[i]] for i in picked]
    q = np.stack([f[0][0] for f in framed]), np.stack([f[0][1] for f in framed])
    d_ids = np.stack([np.stack([t[0] for t in f[1:]]) for f in framed])
    d_mask = np.stack([np.stack([t[1] for t in f[1:]]) for f in framed])
    return {"query_ids": q[0], "query_mask": q[1], "doc_ids": d_ids, "doc_mask": d_mask}

  def close(self) -> None:
    pass
