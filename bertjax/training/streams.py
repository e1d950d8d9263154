"""The batches an objective trains and is evaluated on, which its `stream`, `evaluate` and
`has_eval_data` members pick (`objective.Objective`): the MLM/NSP example stream
(`bertjax.data.pretraining`, MLM and ELECTRA) and the stream of query/document pairs
(`bertjax.data.pairs`, the contrastive objective); their held-out metrics; and whether the
prepared data holds held-out examples at all.
"""

from __future__ import annotations

import collections
import functools
import os

import jax
import numpy as np

from bertjax.data import mixture, pair_mixture, pairs, prefetch, pretraining, records
from bertjax.data.tokenizer import MASK_ID
from bertjax.training import losses
from bertjax.training.phases import Phase


@functools.lru_cache(maxsize=None)  # said once per run
def input_workers(workers: int | None) -> int:
  """config.data.workers, or by default half the host's cores (the rest run the loop, tf.data's
  reader and XLA's host work), at most 32; 0 or 1 builds the examples in this process."""
  if workers is None:
    cores = os.cpu_count() or 1
    workers = min(32, cores // 2)
    print(
        f"data: {workers} input worker process(es) (half of {cores} cores; "
        "config.data.workers sets it)",
        flush=True,
    )
  return workers


def held_out(config, split: str, name: str, default):
  """config.eval.NAME for the held-out stream when set, else the training data's value: runs
  that train on different data (masking rate, pairs, packing, seed) can then be scored on the
  same masked examples (experiments/modern.py)."""
  value = config.eval.get(name) if split == "eval" else None
  return default if value is None else value


def mlm_stream(config, phase: Phase, state: dict | None, split: str = "train"):
  """The MLM/NSP example stream of `phase` (`bertjax.data.pretraining`), train or held out."""
  d = config.data
  seed = held_out(config, split, "seed", config.seed)
  seed += 1000 if split == "eval" and d.source == "synthetic" else 0
  cfg = pretraining.InputConfig(
      source=d.source,
      path=d.path or "",
      seq_len=phase.seq_len,
      max_predictions_per_seq=phase.max_predictions,
      pair_mode=held_out(config, split, "pair_mode", d.pair_mode),
      mask_prob=held_out(config, split, "mask_prob", d.mask_prob),
      whole_word_mask=held_out(config, split, "whole_word_mask", d.whole_word_mask),
      mask_token_prob=d.mask_token_prob,
      random_token_prob=d.random_token_prob,
      seed=seed,
      vocab_size=config.model.vocab_size,
      packing=held_out(config, split, "packing", d.packing),
      max_examples_per_row=d.max_examples_per_row,
      # Evaluation streams are short: worker processes would cost more to start than they save.
      workers=input_workers(d.get("workers")) if split == "train" else 0,
      sources=mixture.phase_weights(mixture.parse_sources(d.get("sources")), phase.index),
  )
  stream = pretraining.make_stream(
      cfg,
      global_batch_size=phase.batch_size if split == "train" else config.eval.batch_size,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      state=state,
      split=split,
  )
  return stream


def pair_stream(config, phase: Phase, state: dict | None, split: str = "train"):
  """The contrastive objective's batches: one pair dataset's (`bertjax.data.pairs`), or a
  mixture's (`config.data.sources`, `bertjax.data.pair_mixture`)."""
  batch = phase.batch_size if split == "train" else config.eval.batch_size
  seed = config.seed + (1000 if split == "eval" else 0)
  sources = mixture.phase_weights(mixture.parse_sources(config.data.get("sources")), phase.index)
  if sources:
    return pair_mixture.make(
        sources,
        seq_len=phase.seq_len,
        global_batch_size=batch,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        seed=seed,
        state=state,
        split=split,
    )
  meta = records.load_metadata(config.data.path)
  return pairs.PairStream(
      pairs.load_rows(config.data.path, split),
      records.special_ids(meta),
      phase.seq_len,
      batch,
      jax.process_index(),
      jax.process_count(),
      seed=seed,
      state=state,
  )


def mlm_evaluate(config, setup, params, phase: Phase, meta: dict | None) -> dict[str, float]:
  """Held-out MLM/NSP metrics over config.eval.steps batches, `eval_` prefixed; `meta`: the
  prepared data's metadata.json (None for synthetic data). `setup`: a `train.Setup`."""
  stream = mlm_stream(config, phase, None, split="eval")
  mask_id = records.special_ids(meta)["mask"] if meta else MASK_ID
  totals, target_counts = None, collections.Counter()
  for _ in range(config.eval.steps):
    host_batch = next(stream)
    host_batch["at_mask"] = np.asarray(losses.at_mask_token(host_batch, mask_id))
    # This process's targets there, for the best constant guess below.
    target_counts.update(host_batch["masked_ids"][host_batch["at_mask"] > 0].tolist())
    sums = setup.eval_step(params, prefetch.global_batch(host_batch, setup.batch_sharding))
    totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
  totals = jax.device_get(totals)
  means = setup.objective.finalize(totals)  # ELECTRA: the generator's MLM, the discriminator's
  out = {f"eval_{k}": float(v) for k, v in means.items()}
  # The best constant guess at the same positions: the most frequent target there. A model
  # that has not learned to use context (the unigram plateau) scores about this.
  n = sum(target_counts.values())
  out["eval_mask_constant_accuracy"] = target_counts.most_common(1)[0][1] / n if n else 0.0
  return out


def pairs_evaluate(config, setup, params, phase: Phase, meta: dict | None) -> dict[str, float]:
  """Held-out contrastive loss, top-1 accuracy and mean rank, each batch its own negatives."""
  stream, totals = pair_stream(config, phase, None, split="eval"), None
  for _ in range(config.eval.steps):
    sums = setup.eval_step(params, prefetch.global_batch(next(stream), setup.batch_sharding))
    totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
  means = setup.objective.finalize(jax.device_get(totals))
  return {f"eval_{k}": float(v) for k, v in means.items()}


def pairs_have_eval_data(config, meta: dict | None, writer) -> bool:
  """False (with one warning) when the prepared pairs (a mixture's: its sources') hold fewer
  held-out rows than one held-out batch (each batch is its own negatives)."""
  sources = mixture.parse_sources(config.data.get("sources"))
  paths = [s.path for s in sources] or [config.data.path]
  held = 0
  for path in paths:
    shards = (meta if path == config.data.path else records.load_metadata(path))["shards"]
    held += sum(s["documents"] for s in shards if s["split"] == "eval")
  if held >= config.eval.batch_size:
    return True
  where = "the sources of config.data.sources hold" if sources else f"{config.data.path} holds"
  writer.log(
      f"warning: {where} {held} held-out pairs, fewer than "
      f"config.eval.batch_size={config.eval.batch_size}: training without held-out "
      "evaluation. Lower config.eval.batch_size, or prepare with a larger --eval-fraction"
  )
  return False


def mlm_has_eval_data(config, meta: dict | None, writer) -> bool:
  """False (with one warning) when the prepared data holds no held-out documents. Any number
  of held-out files serves any number of processes (each reads blocks of all of them)."""
  sources = mixture.parse_sources(config.data.get("sources"))
  if sources:  # a mixture evaluates on the sources that hold held-out documents
    paths = [s.path for s in sources]
    if any(records.split_shards(records.load_metadata(p), p, "eval") for p in paths):
      return True
  elif meta is None or records.split_shards(meta, config.data.path, "eval"):
    return True
  where = "no source of config.data.sources holds" if sources else f"{config.data.path} holds no"
  writer.log(
      f"warning: {where} held-out documents: training without held-out "
      "evaluation. `bertjax prepare --eval-fraction F` writes them; "
      "--config.eval.every_steps=0 silences this"
  )
  return False


def describe(stream, config, phase: Phase) -> list[str]:
  """What the run says of its stream: a mixture's shares, the pairs, or the packing."""
  lines = []
  if isinstance(stream, mixture.MixtureStream):
    shares = ", ".join(f"{name} {w:.0%} ({path})" for name, path, w in stream.cfg.sources if w > 0)
    lines.append(f"data: a mixture; shares of the real tokens: {shares}")
  if isinstance(stream, (pairs.PairStream, pair_mixture.PairMixture)):
    each = [stream.rows] if isinstance(stream, pairs.PairStream) else stream.rows
    if isinstance(stream, pair_mixture.PairMixture):
      shares = ", ".join(
          f"{name} {w:.0%} ({len(rows)} pairs)"
          for name, w, rows in zip(stream.names, stream.weights, each)
          if w > 0
      )
      lines.append(f"data: a mixture of pair datasets; shares of the real tokens: {shares}")
    lines.append(
        f"data: {sum(map(len, each))} pairs, each with {len(each[0][0]) - 2} hard "
        f"negative(s); every batch's {phase.batch_size} rows share their documents as negatives"
    )
  elif stream.cfg.packing:
    auto = "measured on the corpus" if not config.data.get("max_examples_per_row") else "set"
    lines.append(
        f"packing: up to {stream.cfg.max_examples_per_row} examples per row at seq "
        f"{phase.seq_len} ({auto})"
    )
  return lines
