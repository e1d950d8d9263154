"""Several prepared pair datasets mixed by weight: `config.data.sources` with the contrastive
objective.

    --config.data.sources='qa=runs/qa_pairs:0.7,titles=runs/title_pairs:0.3'

The sources are named and weighted as a corpus mixture's (`mixture.parse_sources`: NAME=PATH:
WEIGHT[:PHASE2_WEIGHT], weights normalised per phase), and a weight means the same: **the
source's share of the real training tokens** (a row's tokens: its query's and its documents',
[CLS] and [SEP] included, as truncated to the sequence length). Every source was prepared with
the same tokenizer, holds the same number of hard negatives per row (`check_negatives`) and
has the same query and document prompts (`check_prompts`), which the run records.

How a batch is drawn. Each source is one dataset's `pairs.RowOrder` (its own order each epoch,
from a seed derived from the run's seed and the source's name, and its rows held back). For
each global batch a generator seeded by (seed, step) draws every row's source with probability
proportional to weight / mean real tokens per row of that source (over its whole split), so
the realised token shares follow the weights; the row then comes from that source, the next
one none of whose texts the batch holds yet, whichever source holds the text (the no-duplicate
rule holds across sources). A source that has gone past a whole epoch's end within one batch
without a usable row gives no more rows to that batch: the rest of the batch's sources are
drawn again among the others. Every host builds the same global batch and takes its rows, so
the state (the step and every source's position) is the same on every host and a resume, on
any host count, goes on exactly (`pairs.resume_state`).
"""

from __future__ import annotations

import functools
import json
import logging

import numpy as np

from bertjax import errors
from bertjax.data import mixture, pairs, records
from bertjax.data.input_config import source_seed

_MIX = 26  # the generator's purpose, beside the run's seed and the step


def check_negatives(sources: list[mixture.Source], metas: list[dict]) -> None:
  """Every pair source holds the same number of hard negatives per row (one line naming the
  source and the field otherwise)."""
  pair = [(s, m) for s, m in zip(sources, metas) if pairs.is_pairs(m)]
  for s, meta in pair[1:]:
    (first, first_meta), n = pair[0], meta.get("negatives")
    if n != first_meta.get("negatives"):
      raise errors.ConfigError(
          f"config.data.sources: {s.name} ({s.path}) holds {n} hard negative(s) per row "
          f"(metadata.json `negatives`), {first.name} ({first.path}) "
          f"{first_meta.get('negatives')}; every source needs the same count — prepare them "
          "with the same number of --negative-fields"
      )


def check_prompts(sources: list[mixture.Source], metas: list[dict]) -> None:
  """Every pair source was prepared with the same query and document prompts, the ones the
  run records for its embeddings (one line naming the source otherwise)."""
  pair = [(s, pairs.prompts_of(m)) for s, m in zip(sources, metas) if pairs.is_pairs(m)]
  for s, prompts in pair[1:]:
    first, first_prompts = pair[0]
    if prompts != first_prompts:
      raise errors.ConfigError(
          f"config.data.sources: {s.name} ({s.path}) was prepared with prompts "
          f"{_shown(prompts)} (metadata.json `prompts`), {first.name} ({first.path}) with "
          f"{_shown(first_prompts)}; the run records one query and one document prompt for "
          "its embeddings — prepare every source with the same --query-prompt and "
          "--document-prompt"
      )


def _shown(prompts: dict[str, str]) -> str:
  return ", ".join(f"{k} {v!r}" for k, v in sorted(prompts.items())) or "none"


class PairMixture:
  """Batches of `pairs.frame_rows` of this process's rows of the global batch, plus `sources`
  ([b, N] one-hot: each row's source, for the step's `tokens_by_source`); see the module
  docstring."""

  def __init__(
      self, names, rows, weights, special, seq_len, global_batch_size, *, local, seed, state
  ):
    self.names, self.rows, self.special, self.seq_len = list(names), rows, special, seq_len
    self.weights = np.asarray(weights, np.float64)
    self.batch, self.local, self.seed = global_batch_size, local, seed
    saved = (state or {}).get("sources", {})
    self.orders = [
        pairs.RowOrder(r, source_seed(seed, n), saved.get(n)) for n, r in zip(self.names, rows)
    ]
    self.step = int((state or {}).get("step", 0))
    mean = np.array([pairs.real_tokens(r, seq_len).mean() for r in rows])
    p = self.weights / mean
    self.p = p / p.sum()

  def __iter__(self) -> "PairMixture":
    return self

  def _pick(self) -> list[tuple[int, int]]:
    """(source, row) of every row of the next global batch, no text twice in it."""
    rng = np.random.default_rng([self.seed, _MIX, self.step])
    p = self.p.copy()
    draws = rng.choice(len(p), size=self.batch, p=p)
    chosen, seen = [], set()
    for o in self.orders:
      o.start()
    while len(chosen) < self.batch:
      k = int(draws[len(chosen)])
      i = self.orders[k].take(seen)
      if i is not None:
        chosen.append((k, i))
        continue
      p[k] = 0.0  # this source has nothing left for this batch: the rest drawn among the others
      if p.sum() <= 0:
        raise errors.BadInputError(
            f"config.data.sources ({', '.join(self.names)}) cannot fill a batch of "
            f"{self.batch} rows without repeating a text: a whole epoch of each gave "
            f"{len(chosen)} — lower config.train.batch_size or deduplicate the pairs"
        )
      draws[len(chosen) :] = rng.choice(len(p), size=self.batch - len(chosen), p=p / p.sum())
    for o in self.orders:
      o.finish()
    self.step += 1
    return chosen

  def __next__(self) -> dict[str, np.ndarray]:
    picked = self._pick()[self.local]
    batch = pairs.frame_rows([self.rows[k][i] for k, i in picked], self.special, self.seq_len)
    source_b = np.array([k for k, _ in picked])
    batch[mixture.SOURCE_FEATURE] = (source_b[:, None] == np.arange(len(self.names))).astype(
        np.int32
    )
    return batch

  def get_state(self) -> dict:
    states = [o.state for o in self.orders]
    return json.loads(
        json.dumps(
            {
                "kind": pairs.KIND,
                "step": self.step,
                "held_back": sum(s["held_back"] for s in states),  # what the metrics show
                "dropped": sum(s["dropped"] for s in states),
                "sources": dict(zip(self.names, states)),
            }
        )
    )

  def close(self) -> None:
    pass


@functools.lru_cache(maxsize=None)  # said once per run, not at every evaluation
def _say_left_out(names: tuple[str, ...]) -> None:
  logging.warning(
      "data: the held-out evaluation leaves out source(s) %s: no held-out pairs (prepare "
      "them with --eval-fraction F > 0)",
      ", ".join(names),
  )


def make(
    sources, *, seq_len, global_batch_size, process_index, process_count, seed, state, split
) -> PairMixture:
  """The mixture stream of `sources` ((name, path, weight) of this phase,
  `mixture.phase_weights`), train or held out. The held-out stream mixes the held-out rows of
  the sources of weight > 0 that hold some, with their weights; one warning names any left
  out."""
  local = pairs.local_rows(global_batch_size, process_index, process_count)
  metas = [records.load_metadata(path) for _, path, _ in sources]
  named = [mixture.Source(n, p, (w,)) for n, p, w in sources]
  mixture.check_tokenizers(named, metas)
  check_negatives(named, metas)
  check_prompts(named, metas)
  rows = [pairs.load_rows(path, split) for _, path, _ in sources]
  if split == "eval":
    left_out = tuple(n for (n, _, w), r in zip(sources, rows) if w > 0 and not r)
    if left_out:
      _say_left_out(left_out)
    kept = [(s, r) for s, r in zip(sources, rows) if s[2] > 0 and r]
    if not kept:
      raise errors.ConfigError(
          "config.data.sources: no source holds held-out pairs — prepare them with "
          "`--eval-fraction`, or set --config.eval.every_steps=0"
      )
    sources, rows = [s for s, _ in kept], [r for _, r in kept]
  names = [n for n, _, _ in sources]
  if state and "sources" not in state:
    raise errors.ConfigError(
        "the input state was saved by a run on one pair dataset (config.data.path); this run "
        "mixes config.data.sources — resume with the config it was saved with"
    )
  saved = sorted((state or {}).get("sources", {}))
  if state and saved != sorted(names):
    raise errors.ConfigError(
        f"the input state was saved with sources {saved}, this run has {sorted(names)}; "
        "a source can change its weight on resume, not its name"
    )
  empty = [n for n, r in zip(names, rows) if not r]
  if empty:
    raise errors.ConfigError(f"config.data.sources: {empty[0]} holds no training pairs")
  # A source of weight 0 in this phase is kept (its position travels), never drawn.
  return PairMixture(
      names,
      rows,
      [w for _, _, w in sources],
      records.special_ids(metas[0]),
      seq_len,
      global_batch_size,
      local=local,
      seed=seed,
      state=state,
  )
