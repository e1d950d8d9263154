"""Runs of `bertjax glue`: every task of a list, each over a grid of learning rates x seeds.

`run(tasks, encoder, options, recipes)` fine-tunes each task once per recipe
(`finetune.train_and_evaluate`), keeps the best run on dev (its checkpoint, its submissions),
and reports the spread over seeds at the learning rate whose seeds average best: median, mean
and std beside the best-on-dev figure (the paper's protocol, an optimistic pick). The command
(bertjax/commands/glue.py) only parses flags into `Options` and recipes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from typing import Sequence

import jax
import numpy as np

from bertjax.tasks import finetuning
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.glue import features, finetune, metrics, submission, tasks, tfds_source, tsv


@dataclasses.dataclass(frozen=True)
class Options:
  workdir: str  # OUT: results.json, results.md, submission/, one directory per task
  data: str = "tfds"  # "tfds", a GLUE_DIR, or "" for a custom task (its files are in the task)
  tfds_data_dir: str | None = None
  max_seq_len: int = 128
  max_train_examples: int = 0  # 0: all
  progress: bool = True


def parse_seeds(spec: str) -> list[int]:
  """ "3" -> [0, 1, 2]; "0,7,9" -> [0, 7, 9]."""
  try:
    values = [int(s) for s in spec.split(",") if s.strip()]
  except ValueError:
    raise ValueError(f"--seeds={spec!r}: expected a count or a comma list of integers") from None
  if not values:
    raise ValueError(f"--seeds={spec!r}: expected a count or a comma list of integers")
  return list(range(values[0])) if len(values) == 1 else values


def learning_rate_grid(spec: str | None, hidden_size: int) -> tuple[list[float], str]:
  """The sweep's learning rates: `spec` ("5e-5,3e-5") or the default for the encoder's width;
  and a line saying which."""
  if spec is not None:
    return [float(x) for x in spec.split(",") if x.strip()], "--learning-rates"
  _, grid, why = finetuning.learning_rates_for(hidden_size)
  return list(grid), f"{why}; --learning-rates overrides"


def recipes(
    base: finetuning.Recipe, learning_rates: Sequence[float], seeds: Sequence[int]
) -> list[finetuning.Recipe]:
  return [
      dataclasses.replace(base, learning_rate=lr, seed=s) for lr in learning_rates for s in seeds
  ]


def load_data(task: tasks.Task, opts: Options) -> dict[str, features.Examples]:
  """Examples of every split, from TFDS, a GLUE_DIR, or the custom files."""
  if not opts.data:
    return tsv.load_task(task, "")
  if opts.data == "tfds":
    return tfds_source.load_task(task, opts.tfds_data_dir)
  if not os.path.isdir(opts.data):
    raise ValueError(f"glue: --data {opts.data}: not 'tfds' and not a directory")
  return tsv.load_task(task, opts.data)


def check_test_files(task_list: Sequence[tasks.Task], opts: Options) -> None:
  """Read every test TSV before anything trains: a test row that cannot be read stops the
  command (ValueError `file:line: why`) instead of leaving it out of a submission."""
  if opts.data != "tfds":
    for task in task_list:
      tsv.load_tests(task, opts.data)


def report_skipped(task: tasks.Task, examples: dict, out_dir: str) -> None:
  """Per file, how many train/dev rows were skipped and the first of them; all of them go to
  OUT/<task>/skipped_rows.txt."""
  bad = [s for ex in examples.values() for s in ex.skipped]
  if not bad or jax.process_index() != 0:
    return
  path = os.path.join(out_dir, task.name, "skipped_rows.txt")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(bad) + "\n")
  for ex in examples.values():
    if ex.skipped:
      where, why = ex.skipped[0].split(": ", 1)
      name, _, line = where.rpartition(":")
      print(
          f"glue: {task.name}: {name}: skipped {len(ex.skipped)} malformed rows (first: line "
          f"{line}: {why}); all listed in {path}"
      )


def run_task(
    task: tasks.Task, enc: Encoder, opts: Options, recipe_list: Sequence[finetuning.Recipe]
) -> dict:
  """Fine-tune `task` once per recipe; write its submissions; return its results entry."""
  examples = load_data(task, opts)
  report_skipped(task, examples, opts.workdir)
  if opts.max_train_examples:
    ex, n = examples["train"], opts.max_train_examples
    examples["train"] = features.Examples(
        ex.text_a[:n],
        ex.text_b and ex.text_b[:n],
        None if ex.labels is None else ex.labels[:n],
        ex.index[:n],
    )
  print(
      "glue: " + task.name + ": " + ", ".join(f"{k} {len(v)}" for k, v in examples.items()),
      flush=True,
  )
  feats = {k: features.encode(enc.tokenizer, v, opts.max_seq_len) for k, v in examples.items()}
  runs = []
  for r in recipe_list:
    sub = "" if len(recipe_list) == 1 else f"lr{r.learning_rate:g}-seed{r.seed}"
    res = finetune.train_and_evaluate(
        task, enc, feats, r, os.path.join(opts.workdir, task.name, sub), progress=opts.progress
    )
    runs.append((r, res))
  best_recipe, best = max(runs, key=lambda rr: rr[1].dev[task.main_metric])
  entry = dict(best.dev)
  writer = jax.process_index() == 0  # every process computes; one writes
  if len(runs) > 1:
    entry.update(spread(task, runs))
    if writer:
      write_sweep(task, runs, best, opts.workdir)
  for split in task.test:
    if writer and split.name in best.test:
      path = submission.write_submission(
          task, split, examples[split.name].index, best.test[split.name], opts.workdir
      )
      print(f"glue: wrote {path}")
  if task.labels is not None and task.dev:
    dev0 = task.dev[0].name
    base = metrics.majority_baseline(feats["train"].labels_N, feats[dev0].labels_N)
    print(f"glue: {task.name}: majority-class dev accuracy {base:.4f}")
  print(
      f"glue: {task.name}: best {task.main_metric} {best.dev[task.main_metric]:.4f} "
      f"(epoch {best.best_epoch}, lr {best_recipe.learning_rate:g}, seed {best_recipe.seed})"
  )
  return entry


def spread(task: tasks.Task, runs) -> dict[str, float]:
  """Median, mean and std over seeds at the learning rate whose seeds average best on dev
  (the unsuffixed metrics are the best run's: best on dev, an optimistic pick)."""
  by_lr: dict[float, list] = {}
  for r, res in runs:
    by_lr.setdefault(r.learning_rate, []).append(res.dev)
  lr = max(by_lr, key=lambda k: np.mean([d[task.main_metric] for d in by_lr[k]]))
  devs = by_lr[lr]
  out = {}
  for m in devs[0]:
    values = np.array([d[m] for d in devs])
    out[f"{m}_median"] = float(np.median(values))
    out[f"{m}_mean"], out[f"{m}_std"] = float(values.mean()), float(values.std())
    out[f"{m}_runs"] = float(len(values))
  return out


def write_sweep(task: tasks.Task, runs, best, out_dir: str) -> None:
  """OUT/<task>/sweep.json with every run; only the best run keeps its checkpoint (a BERT-base
  sweep would otherwise leave 20 copies of the model on disk)."""
  rows = [
      dict(
          learning_rate=r.learning_rate,
          seed=r.seed,
          best_epoch=res.best_epoch,
          **res.dev,
          best=res is best,
      )
      for r, res in runs
  ]
  with open(os.path.join(out_dir, task.name, "sweep.json"), "w") as f:
    json.dump(rows, f, indent=2)
  for _, res in runs:
    if res is not best:
      shutil.rmtree(os.path.join(res.workdir, "best"), ignore_errors=True)


def run(
    task_list: Sequence[tasks.Task],
    enc: Encoder,
    opts: Options,
    recipe_list: Sequence[finetuning.Recipe],
) -> list[str]:
  """Every task in turn, results.json/results.md updated after each; returns the names of the
  tasks whose data was missing (`--task all` goes on with the others)."""
  os.makedirs(opts.workdir, exist_ok=True)
  failed = []
  for task in task_list:
    try:
      entry = run_task(task, enc, opts, recipe_list)
    except tsv.GlueDataError as e:
      print(f"glue: {task.name}: {e}", file=sys.stderr)
      failed.append(task.name)
      continue
    if jax.process_index() == 0:
      submission.write_results(opts.workdir, {task.name: entry})
    print(
        f"glue: {task.name}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in entry.items() if not k.endswith("_runs"))
    )
  print(
      f"glue: results in {os.path.join(opts.workdir, 'results.json')} and results.md"
      + (f"; no data for {', '.join(failed)}" if failed else "")
  )
  return failed
