"""Several prepared datasets mixed by weight: `config.data.sources`.

    --config.data.sources='web=runs/web:0.7,books=runs/books:0.3'
    --config.data.sources='web=runs/web:0.7:0.5,books=gs://b/books:0.3:0.5'   # phase 2: 50/50

Each entry is NAME=PATH:WEIGHT, or NAME=PATH:W1:W2 with a weight for the second phase (a later
phase keeps the last weight given); the weights are normalised. A weight is the source's share
of the real (non-padding) training tokens, as mixture recipes state them, not of rows or
documents: a corpus of short texts gets more rows for the same weight. Every source was
prepared with the same tokenizer.

How it is drawn. Each source is a stream of its own (`pretraining.PreparedStream`: its blocks,
its hosts' turns, its epochs), with a seed of its own derived from the run's seed and the
source's name. For each batch, every row's source is drawn from a seeded generator keyed by
(seed, host, step), with probability proportional to weight / mean real tokens per row of that
source so far (before its first row: of its first block's rows), so the realised token shares
follow the weights whatever the sources' row lengths. The rows then come from the sources' streams in
that order. The state is every source's stream position plus the tokens and rows drawn from
each, so a resume, on the same or another host count (`resume_states`), goes on exactly.

A source that runs out starts its next epoch, as a single dataset's stream always has: mixture
recipes repeat their small, good sources on purpose. The run says so once per source, and
`bertjax data stats --sources` shows after how many training tokens each source repeats
(`epoch_after_tokens`: its training split's tokens / its weight).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re

import numpy as np

from bertjax import errors
from bertjax.data import masking, records
from bertjax.data.blocks import examples_per_row
from bertjax.data.input_config import AUTO, check_state, source_configs

_MIX = 25  # purpose of the hash that draws the rows' sources
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
SOURCE_FEATURE = "sources"  # [B, N] one-hot: the source of each row (the step counts tokens)


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  path: str
  weights: tuple[float, ...]  # per phase; a later phase keeps the last

  def weight(self, phase: int) -> float:
    return self.weights[min(phase, len(self.weights) - 1)]


def _split_weights(entry: str, field: str) -> tuple[str, tuple[float, ...]]:
  """'runs/web:0.7:0.5' -> ('runs/web', (0.7, 0.5)); the path may hold ':' (gs://)."""
  path, weights = entry, []
  while len(weights) < 2 and ":" in path:
    head, tail = path.rsplit(":", 1)
    try:
      weights.insert(0, float(tail))
    except ValueError:
      break
    path = head
  if not weights:
    raise errors.ConfigError(
        f"{field}: {entry!r} has no weight — write NAME=PATH:WEIGHT, e.g. web=runs/web:0.7"
    )
  return path, tuple(weights)


def parse_sources(text, field: str = "config.data.sources") -> tuple[Source, ...]:
  """'NAME=PATH:WEIGHT[:PHASE2_WEIGHT],...' -> Sources (empty: ()). Errors name the entry."""
  if not text or not str(text).strip():
    return ()
  out = []
  for entry in (e.strip() for e in str(text).split(",")):
    if not entry:
      continue
    name, eq, rest = entry.partition("=")
    name = name.strip()
    if not eq or not _NAME.fullmatch(name):
      raise errors.ConfigError(
          f"{field}: {entry!r} is not NAME=PATH:WEIGHT (NAME: letters, digits, _ . -), "
          "e.g. 'web=runs/web:0.7,books=runs/books:0.3'"
      )
    path, weights = _split_weights(rest.strip(), field)
    if not path:
      raise errors.ConfigError(f"{field}: source {name!r} has no path")
    bad = [w for w in weights if not (math.isfinite(w) and w >= 0)]
    if bad:
      raise errors.ConfigError(f"{field}: source {name!r} has weight {bad[0]:g}; weights are >= 0")
    out.append(Source(name, path, weights))
  names = [s.name for s in out]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise errors.ConfigError(f"{field}: source name(s) {twice} given twice; names are unique")
  phases = max(len(s.weights) for s in out)
  for p in range(phases):
    if sum(s.weight(p) for s in out) <= 0:
      raise errors.ConfigError(f"{field}: the weights of phase {p + 1} are all 0")
  return tuple(out)


def phase_weights(sources: tuple[Source, ...], phase: int) -> tuple[tuple[str, str, float], ...]:
  """(name, path, normalised weight) of each source in phase `phase` (0-based)."""
  total = sum(s.weight(phase) for s in sources)
  return tuple((s.name, s.path, s.weight(phase) / total) for s in sources)


def check_tokenizers(sources: tuple[Source, ...], metas: list[dict]) -> None:
  """Every source prepared with the same tokenizer (same file, by its digest)."""
  first = metas[0]["tokenizer"]
  for s, meta in zip(sources[1:], metas[1:]):
    tok = meta["tokenizer"]
    if tok.get("sha256") and first.get("sha256"):
      same = tok["sha256"] == first["sha256"]
    else:  # data prepared before the digest was recorded
      same = (tok.get("vocab_size"), tok.get("special_ids")) == (
          first.get("vocab_size"),
          first.get("special_ids"),
      )
    if not same:
      raise errors.ConfigError(
          f"config.data.sources: {s.name} ({s.path}) was prepared with another tokenizer than "
          f"{sources[0].name} ({sources[0].path}); prepare every source with the same "
          "`--tokenizer`"
      )


def train_tokens(path: str) -> int:
  """Tokens of a prepared dataset's training split (metadata.json)."""
  meta = records.load_metadata(path)
  return sum(s.get("tokens", 0) for s in meta["shards"] if s["split"] == "train")


class MixtureStream:
  """Batches whose rows come from several sources' streams; see the module docstring."""

  def __init__(self, cfg, names, weights, streams, rows, fingerprint, state):
    self.cfg, self.names, self.streams, self.rows = cfg, list(names), streams, rows
    self.weights = np.asarray(weights, np.float64)
    self.fingerprint = fingerprint
    self.spec = streams[0].spec
    mixed = state.get("mixture", {})
    self.tokens = np.asarray(mixed.get("tokens", [0.0] * len(names)), np.float64)
    self.drawn = np.asarray(mixed.get("rows", [0] * len(names)), np.float64)
    self.step = state.get("step", 0)
    self.epochs = [s.get_state()["epoch"] for s in streams]  # where this stream started
    self.repeated = [False] * len(streams)

  def __iter__(self) -> "MixtureStream":
    return self

  def probabilities(self) -> np.ndarray:
    """A row's chance to come from each source: weight / mean real tokens per row so far
    (before a source's first row: the mean of its first block's rows)."""
    mean = self.tokens / np.maximum(self.drawn, 1)
    for i in np.flatnonzero((self.drawn == 0) & (self.weights > 0)):
      mean[i] = self.streams[i].upcoming_real_tokens()
    p = self.weights / np.maximum(mean, 1.0)
    return p / p.sum()

  def __next__(self) -> dict[str, np.ndarray]:
    n = len(self.streams)
    rng = np.random.default_rng(
        int(
            masking.key(
                self.cfg.seed,
                _MIX,
                self.fingerprint["process_index"],
                self.fingerprint["process_count"],
                self.step,
            )
        )
    )
    source_B = rng.choice(n, size=self.rows, p=self.probabilities())
    counts = np.bincount(source_B, minlength=n)
    parts = [self.streams[i].take(int(c)) for i, c in enumerate(counts) if c]
    # Rows grouped by source (stable), then put back in drawn order.
    order = np.argsort(np.argsort(source_B, kind="stable"), kind="stable")
    batch = {k: np.concatenate([p[k] for p in parts])[order] for k in parts[0]}
    real_B = batch["attention_mask"].sum(1)
    self.tokens += np.bincount(source_B, weights=real_B, minlength=n)
    self.drawn += counts
    batch[SOURCE_FEATURE] = (source_B[:, None] == np.arange(n)).astype(np.int32)
    self.step += 1
    self._note_epochs()
    return batch

  def _note_epochs(self) -> None:
    """Says once per source when it repeats: when its stream first enters another epoch."""
    for i, s in enumerate(self.streams):
      epoch = s.get_state()["epoch"]
      if epoch > self.epochs[i] and not self.repeated[i]:
        self.repeated[i] = True
        logging.warning(
            "data: source %r has used all its documents by batch %d of this host and repeats "
            "them (epoch %d): its weight asks for more tokens than it holds "
            "(`bertjax data stats --sources` shows when each source repeats)",
            self.names[i],
            self.step,
            epoch + 1,
        )

  def close(self) -> None:
    for s in self.streams:
      s.close()

  def get_state(self) -> dict:
    return {
        **self.fingerprint,
        "step": self.step,
        "mixture": {"tokens": self.tokens.tolist(), "rows": self.drawn.tolist()},
        "sources": {name: s.get_state() for name, s in zip(self.names, self.streams)},
    }


def resume_states(saved: list[dict], process_count: int, resume_one) -> tuple[list[dict], str]:
  """The mixture states of H hosts -> those of `process_count` hosts: each source's through
  `resume_one` (hosts.resume_states); the tokens and rows drawn so far are summed and shared
  out evenly (they only steer the draws)."""
  first = saved[0]
  names = list(first["sources"])
  per_source, said = {}, []
  for name in names:
    per_source[name], what = resume_one([s["sources"][name] for s in saved], process_count)
    said.append(f"{name}: {what}")
  tokens = np.sum([s["mixture"]["tokens"] for s in saved], 0) / process_count
  drawn = np.sum([s["mixture"]["rows"] for s in saved], 0) / process_count
  keep = {k: v for k, v in first.items() if k not in ("sources", "mixture", "process_index")}
  new = [
      {
          **keep,
          "process_index": h,
          "process_count": process_count,
          "mixture": {"tokens": tokens.tolist(), "rows": drawn.tolist()},
          "sources": {name: per_source[name][h] for name in names},
      }
      for h in range(process_count)
  ]
  return new, "; ".join(said)


def make(cfg, *, global_batch_size, process_index, process_count, state, split, make_one):
  """The mixture stream of `cfg.sources` ((name, path, weight), ...); `make_one` builds one
  source's stream (pretraining.make_stream)."""
  sources = list(cfg.sources)  # a source of weight 0 (in this phase) is kept, never drawn
  if split == "eval":  # held-out batches from the sources that hold some
    held = []
    for s in sources:
      meta = records.load_metadata(s[1])
      if s[2] > 0 and records.split_shards(meta, s[1], "eval"):
        held.append(s)
    if not held:
      raise errors.ConfigError(
          "config.data.sources: no source holds held-out documents — prepare them with "
          "`--eval-fraction`, or set --config.eval.every_steps=0"
      )
    sources = held
  names = [s[0] for s in sources]
  weights = [s[2] for s in sources]
  rows = global_batch_size // process_count
  state = dict(state or {})
  saved_names = sorted(state.get("sources", {}))
  if state.get("sources") is not None and saved_names != sorted(names):
    raise errors.ConfigError(
        f"the input state was saved with sources {saved_names}, this run has {sorted(names)}; "
        "a source can change its weight on resume, not its name"
    )
  one = source_configs(dataclasses.replace(cfg, sources=tuple(sources)))
  if cfg.packing and cfg.max_examples_per_row == AUTO:  # one E: the shapes agree
    e = examples_per_row(dataclasses.replace(cfg, sources=tuple(sources)))
    cfg = dataclasses.replace(cfg, max_examples_per_row=e)
    one = [dataclasses.replace(c, max_examples_per_row=e) for c in one]
  # The worker processes are shared out among the sources (the batches do not depend on them).
  workers = cfg.workers // len(one) if cfg.workers > 1 else cfg.workers
  streams = [
      make_one(
          dataclasses.replace(c, workers=workers),
          global_batch_size=global_batch_size,
          process_index=process_index,
          process_count=process_count,
          state=state.get("sources", {}).get(name),
          split=split,
      )
      for c, name in zip(one, names)
  ]
  fingerprint = {**streams[0].fingerprint, "seed": cfg.seed, "source_names": sorted(names)}
  check_state(state, fingerprint)
  return MixtureStream(cfg, names, weights, streams, rows, fingerprint, state)
