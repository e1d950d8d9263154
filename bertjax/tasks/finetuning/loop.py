"""The fine-tuning loop: epochs of a `trainer.Trainer` on a task's rows, the best epoch kept.

    steps = loop.total_steps(train_arrays, recipe, packing)
    result = loop.fit(trainer, train_arrays, recipe, evaluate, "f1", workdir)
    loop.save_params(workdir, result.best_params, meta)

Batches are length-aware (`batching.py`): a task of short sentences trains at the cost of its
real tokens with a few compiled shapes, a length kept only if the padding it saves over the run
outweighs a compile. Packed (`trainer.packing`): instead of length buckets, each epoch's
shuffled examples are packed first-fit-decreasing into rows of the arrays' length
(`batching.packed_epoch`); the loss averages over the examples present. Host batches are built
and transferred ahead by pretraining's prefetcher (`prefetch.prefetch_to_device`) and the loss
is read one step late. "weights" (1 real row, 0 padding) is added to every batch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bertjax.runtime import fs
from bertjax.tasks import batching
from bertjax.tasks.batching import epoch_batches, padded_lengths, train_batch
from bertjax.tasks.recipe import Recipe, steps_per_epoch
from bertjax.tasks.finetuning import MIN_BATCHES_PER_LENGTH, compile_tokens
from bertjax.tasks.finetuning.trainer import Trainer, batch_shards, prefetch_batches, progress_bar
from bertjax.training import sharding


def packed_plan(train: dict[str, np.ndarray], recipe: Recipe, max_per_row: int, shards: int):
  """(example lengths, rows per batch, steps per epoch) of packed training (`fit`): every
  epoch packs into as many rows, whatever its shuffle (first-fit-decreasing sees only the
  lengths)."""
  lengths_N = batching.example_lengths(train["attention_mask"])
  n_rows = len(batching.pack_examples(lengths_N, train["input_ids"].shape[1], max_per_row))
  per_batch = batching.packed_batch_rows(recipe.batch_size, len(lengths_N), n_rows, shards)
  steps = -(-n_rows // per_batch)
  return lengths_N, per_batch, min(steps, recipe.max_steps) if recipe.max_steps else steps


def total_steps(train: dict[str, np.ndarray], recipe: Recipe, packing: int = 0) -> int:
  """The run's optimizer steps, `recipe.epochs` x the steps of an epoch: packed (`packing`
  examples a row at most, `packed_plan`) or one example a row (`steps_per_epoch`)."""
  if packing:
    steps = packed_plan(train, recipe, packing, batch_shards(recipe))[2]
  else:
    steps = steps_per_epoch(len(train["input_ids"]), recipe)
  return recipe.epochs * steps


@dataclasses.dataclass
class FitResult:
  best: dict[str, float]  # the best epoch's dev metrics
  best_epoch: int
  best_params: Any  # on device
  history: list[dict]  # per epoch (0 = before training, if asked): train_loss, dev metrics


def fit(
    trainer: Trainer,
    train: dict[str, np.ndarray],
    recipe: Recipe,
    evaluate: Callable[[Any], dict[str, float]],
    main_metric: str,
    workdir: str,
    eval_untrained: bool = False,
    progress: bool = True,
    run_name: str = "",
    predicts: tuple[dict[str, np.ndarray], ...] = (),
) -> FitResult:
  """Train for `recipe.epochs` on the rows of `train`, scoring `evaluate(params)` after each
  epoch; the epoch with the highest `main_metric` is kept. Writes workdir/metrics.jsonl.
  The predict steps of `predicts` (the arrays `evaluate` predicts on, at
  `recipe.eval_batch_size`) are compiled with the train steps, side by side.
  Batches are length-aware (`epoch_batches`, seeded by `recipe.seed`) or packed
  (`trainer.packing`: `batching.packed_epoch`) and prefetched; the
  loss is read one step late (progress bar) or once an epoch, so the host never syncs a step.
  `run_name` (a GLUE task) goes into the progress bars and log lines."""
  fs.path(workdir).mkdir(parents=True, exist_ok=True)
  what = f"{run_name} " if run_name else ""
  epoch_plan, steps, shapes = _epoch_plan(
      trainer, train, recipe, f"{trainer.name}: {what}", progress
  )
  # every step the run will use and the state's init, compiled side by side from their shapes
  abstract = trainer.built.abstract
  trainer.compile_ahead(
      [("train", abstract, batch) for batch in shapes]
      + [
          job
          for arrays in predicts
          for job in trainer.predict_jobs(abstract.params, arrays, recipe.eval_batch_size)
      ],
      init=True,
  )
  state = trainer.init_state(recipe.seed, recipe.learning_rate)
  rng = np.random.default_rng(recipe.seed)
  history, best, best_epoch, best_params = [], None, 0, None
  # Written as it goes and flushed after each epoch (an object store uploads it whole on flush).
  with (fs.path(workdir) / "metrics.jsonl").open("w") as log:
    if eval_untrained:
      entry = dict(epoch=0, **evaluate(state.params))
      history.append(entry)
      log.write(json.dumps(entry) + "\n")
      print(f"{trainer.name}: {what}untrained: " + _fmt(entry), flush=True)
    for epoch in range(1, recipe.epochs + 1):
      t0 = time.time()
      host = (make() for make in epoch_plan(rng)[:steps])
      losses = []
      bar = progress_bar(
          steps, f"{run_name or trainer.name} epoch {epoch}/{recipe.epochs}", progress
      )
      with prefetch_batches(trainer, host) as batches:
        for batch in batches:
          state, loss = trainer.train_step(state, batch)
          losses.append(loss)
          if progress and len(losses) >= 2:  # read one step late: the device never waits
            bar.set_postfix(loss=f"{float(losses[-2]):.4f}", refresh=False)
          bar.update(1)
      bar.close()
      dev = evaluate(state.params)
      entry = dict(
          epoch=epoch,
          train_loss=float(jnp.mean(jnp.stack(losses))),
          **dev,
          seconds=round(time.time() - t0, 1),
      )
      history.append(entry)
      log.write(json.dumps(entry) + "\n")
      log.flush()
      improved = best is None or dev[main_metric] > best[main_metric]
      print(
          f"{trainer.name}: {what}epoch {epoch}: " + _fmt(entry) + (" (best)" if improved else ""),
          flush=True,
      )
      if improved:
        best, best_epoch = dev, epoch
        best_params = jax.tree.map(jnp.copy, state.params)  # the step donates state.params
  return FitResult(best=best, best_epoch=best_epoch, best_params=best_params, history=history)


def _epoch_plan(trainer: Trainer, train: dict, recipe: Recipe, say: str, progress: bool):
  """(plan(rng) -> the epoch's batches as thunks that build them, steps per epoch, a host
  batch of every shape to compile): length-bucketed batches of `recipe.batch_size` rows, or
  packed rows (`trainer.packing`)."""
  n, max_len = train["input_ids"].shape
  if trainer.packing:
    shards = sharding.num_batch_shards(trainer.mesh) * jax.process_count()
    lengths_N, per_batch, steps = packed_plan(train, recipe, trainer.packing, shards)
    if progress:
      print(
          f"{say}packed rows of {max_len} tokens, up to {trainer.packing} examples each, "
          f"{per_batch} rows a batch ({np.mean(lengths_N):.1f} real tokens per example; "
          "--no-packing)",
          flush=True,
      )

    def build(rows):
      return batching.packed_batch(train, lengths_N, rows, trainer.packing, per_batch)[0]

    def packed(rng):
      epoch = batching.packed_epoch(lengths_N, max_len, trainer.packing, per_batch, rng)
      return [functools.partial(build, rows) for rows in epoch]

    return packed, steps, [build([[0]])]
  padded_N = padded_lengths(
      train["attention_mask"],
      recipe.length_bucket,
      MIN_BATCHES_PER_LENGTH * recipe.batch_size,
      recipe.max_lengths,
      compile_tokens(recipe.batch_size, recipe.epochs),
  )
  lengths = [int(x) for x in np.unique(padded_N)]
  if progress:
    print(
        f"{say}batch lengths {', '.join(map(str, lengths))} "
        f"({np.mean(padded_N):.1f} tokens per row, {np.mean(train['attention_mask'].sum(1)):.1f} "
        "real; --length-bucket, --max-lengths)",
        flush=True,
    )

  def bucketed(rng):
    return [
        functools.partial(train_batch, train, idx, int(padded_N[idx].max()), recipe.batch_size)
        for idx in epoch_batches(padded_N, recipe.batch_size, rng)
    ]

  one = np.arange(min(n, 1))
  shapes = [train_batch(train, one, length, recipe.batch_size) for length in lengths]
  return bucketed, steps_per_epoch(n, recipe), shapes


def _fmt(entry: dict) -> str:
  return " ".join(
      f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
      for k, v in entry.items()
      if k != "epoch"
  )


def save_params(workdir: str, params, meta: dict) -> None:
  """The fine-tuned parameters (orbax) under workdir/best/, what they are in best.json."""
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(fs.absolute(workdir) / "best", params, force=True)
  if jax.process_index() == 0:
    (fs.path(workdir) / "best.json").write_text(json.dumps(meta, indent=2))
