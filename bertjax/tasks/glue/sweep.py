"""Runs of `bertjax glue`: every task of a list, each over a grid of learning rates x seeds.

`run(tasks, encoder, options, recipes)` fine-tunes each task once per recipe
(`finetune.train_and_evaluate`; a task's runs share one Trainer, a `finetuning.TrainerCache`),
keeps the best run on dev (its checkpoint, its submissions), and reports the spread over seeds
at the learning rate whose seeds average best: median, mean and std beside the best-on-dev
figure (the paper's protocol, an optimistic pick). The command
(bertjax/commands/glue.py) parses and checks flags into `Options` and recipes, and has
`check_data` read every task's data before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import jax
import numpy as np

from bertjax import errors
from bertjax.runtime import fs
from bertjax.tasks import files, finetuning
from bertjax.tasks import recipe as recipe_lib
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
  packing: int = 0  # > 0: pack up to this many examples into a row (`finetune.train_and_evaluate`)


def learning_rate_grid(rates: Sequence[float] | None, hidden_size: int) -> tuple[list[float], str]:
  """The sweep's learning rates: `rates` if given, else the default for the encoder's width;
  and a line saying which."""
  if rates:
    return list(rates), "as given"
  _, grid, why = recipe_lib.learning_rates_for(hidden_size)
  return list(grid), why


def recipes(
    base: recipe_lib.Recipe, learning_rates: Sequence[float], seeds: Sequence[int]
) -> list[recipe_lib.Recipe]:
  return [
      dataclasses.replace(base, learning_rate=lr, seed=s) for lr in learning_rates for s in seeds
  ]


def load_data(task: tasks.Task, opts: Options) -> dict[str, features.Examples]:
  """Examples of every split, from TFDS, a GLUE_DIR, or the custom files."""
  if opts.data == "tfds":
    return tfds_source.load_task(task, opts.tfds_data_dir)
  return tsv.load_task(task, _glue_dir(opts))


def _glue_dir(opts: Options) -> str:
  if opts.data and not fs.path(opts.data).is_dir():
    raise errors.InputNotFoundError(
        f"data {opts.data}: not 'tfds' and no such directory — expected a GLUE_DIR in the "
        "layout of the GLUE download (GLUE_DIR/SST-2/train.tsv, ...)"
    )
  return opts.data


def check_data(task_list: Sequence[tasks.Task], opts: Options) -> None:
  """Every task's data, checked before anything is written or trained: TSV files are read
  whole (a missing file, a bad header, a test row that cannot be read or a split without a
  usable row stops the command, naming the file); TFDS splits must be prepared."""
  for task in task_list:
    if opts.data == "tfds":
      tfds_source.check_task(task, opts.tfds_data_dir)
    else:
      tsv.check_task(task, _glue_dir(opts))


def report_skipped(task: tasks.Task, examples: dict, out_dir: str) -> None:
  """Per file, how many train/dev rows were skipped and the first of them; all of them go to
  OUT/<task>/skipped_rows.txt."""
  bad = [s for ex in examples.values() for s in ex.skipped]
  if not bad or jax.process_index() != 0:
    return
  path = files.join(out_dir, task.name, "skipped_rows.txt")
  fs.path(path).parent.mkdir(parents=True, exist_ok=True)
  fs.path(path).write_text("\n".join(bad) + "\n")
  for ex in examples.values():
    if ex.skipped:
      where, why = ex.skipped[0].split(": ", 1)
      name, _, line = where.rpartition(":")
      print(
          f"glue: {task.name}: {name}: skipped {len(ex.skipped)} malformed rows (first: line "
          f"{line}: {why}); all listed in {path}"
      )


def run_task(
    task: tasks.Task, enc: Encoder, opts: Options, recipe_list: Sequence[recipe_lib.Recipe]
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
  trainers = finetuning.TrainerCache()  # the task's runs share one Trainer; dropped with it
  runs = []
  for r in recipe_list:
    sub = "" if len(recipe_list) == 1 else f"lr{r.learning_rate:g}-seed{r.seed}"
    res = finetune.train_and_evaluate(
        task,
        enc,
        feats,
        r,
        files.join(opts.workdir, task.name, sub),
        progress=opts.progress,
        packing=opts.packing,
        trainers=trainers,
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
  (fs.path(out_dir) / task.name / "sweep.json").write_text(json.dumps(rows, indent=2))
  for _, res in runs:
    if res is not best:
      try:
        (fs.path(res.workdir) / "best").rmtree(missing_ok=True)
      except OSError:  # a checkpoint left behind costs space, not results
        pass


def run(
    task_list: Sequence[tasks.Task],
    enc: Encoder,
    opts: Options,
    recipe_list: Sequence[recipe_lib.Recipe],
) -> None:
  """Every task in turn, results.json/results.md updated after each (`check_data` first)."""
  fs.path(opts.workdir).mkdir(parents=True, exist_ok=True)
  written = None
  for task in task_list:
    entry = run_task(task, enc, opts, recipe_list)
    if jax.process_index() == 0:
      written = submission.write_results(opts.workdir, {task.name: entry})
    print(
        f"glue: {task.name}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in entry.items() if not k.endswith("_runs"))
    )
  if written:
    print(f"glue: results in {written[0]} and {fs.path(written[1]).name}")
