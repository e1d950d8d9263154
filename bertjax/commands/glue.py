"""`bertjax glue`: fine-tune a pretrained checkpoint on GLUE (or a custom TSV task) and score it.

  bertjax glue --task sst2 --init runs/base --data GLUE_DIR --workdir out/glue
  bertjax glue --task all --init runs/base --data tfds --tfds-data-dir ~/tfds --workdir out/glue
  bertjax glue --task rte --init runs/base --data GLUE_DIR --workdir out/rte --sweep --seeds 5
  bertjax glue --task custom --name reviews --train r/train.tsv --dev r/dev.tsv \\
      --text-columns review --label-column stars --init runs/base --workdir out/reviews

Writes OUT/results.json (task -> metric -> value), OUT/results.md, OUT/submission/<Name>.tsv
for every test set it has, and per task OUT/<task>/ with metrics.jsonl and the best epoch's
checkpoint (best/, best.json). See docs/glue.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertjax.cli import HelpFormatter
from bertjax.commands import finetune_args



def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="bertjax glue", description=__doc__,
                              formatter_class=HelpFormatter)
  p.add_argument("--task", required=True,
                 help="cola|sst2|mrpc|stsb|qqp|mnli|qnli|rte|wnli|ax|all|custom "
                      "(ax = the MNLI model's predictions on the diagnostic)")
  finetune_args.add_encoder_args(p)
  p.add_argument("--data", default="tfds", help="'tfds' (glue/<task>) or a GLUE_DIR in the "
                 "layout of the GLUE download (GLUE_DIR/SST-2/train.tsv, ...)")
  p.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir holding prepared glue/*")
  p.add_argument("--workdir", required=True, help="output directory (OUT)")
  g = p.add_argument_group("recipe (BERT's defaults)")
  finetune_args.add_recipe_args(g, learning_rate=2e-5, epochs=3, max_seq_len=128,
                                eval_untrained=False)
  g.add_argument("--sweep", action="store_true",
                 help="run every learning rate of --learning-rates x every seed of --seeds")
  g.add_argument("--learning-rates", default=None,
                 help="comma-separated grid for --sweep (default: by the encoder's width, "
                      "BERT's 5e-5,4e-5,3e-5,2e-5 for base/large; printed)")
  g.add_argument("--seeds", default="1",
                 help="with --sweep: a count N (seeds 0..N-1) or a comma list (0,7,9)")
  g.add_argument("--max-train-examples", type=int, default=0,
                 help="use only the first N training examples (smoke runs)")
  c = p.add_argument_group("custom tasks (--task custom)")
  c.add_argument("--name", default="custom", help="results key and submission file name")
  c.add_argument("--train", help="training TSV with a header row")
  c.add_argument("--dev", help="dev TSV (same columns)")
  c.add_argument("--test", help="optional test TSV (labels not needed)")
  c.add_argument("--text-columns", help="one or two column names: a[,b]")
  c.add_argument("--label-column", help="label column name")
  c.add_argument("--regression", action="store_true", help="float labels, MSE loss")
  return p


def _seeds(arg: str, sweep: bool, seed: int) -> list[int]:
  if not sweep:
    return [seed]
  parts = [s for s in arg.split(",") if s.strip()]
  try:
    values = [int(s) for s in parts]
  except ValueError:
    raise SystemExit(f"glue: --seeds={arg!r}: expected a count or a comma list of integers")
  return list(range(values[0])) if len(values) == 1 else values


def _task_list(args) -> list:
  from bertjax.tasks.glue import tasks, tsv

  if args.task == "custom":
    missing = [f"--{n.replace('_', '-')}" for n in ("train", "dev", "text_columns", "label_column")
               if not getattr(args, n)]
    if missing:
      raise SystemExit(f"glue: --task custom needs {', '.join(missing)}")
    cols = tuple(c.strip() for c in args.text_columns.split(",") if c.strip())
    if len(cols) not in (1, 2):
      raise SystemExit(f"glue: --text-columns={args.text_columns!r}: give one or two columns")
    labels = None if args.regression else tsv.custom_labels(args.train, cols, args.label_column)
    return [tasks.custom(args.name, args.train, args.dev, args.test, cols, args.label_column,
                         labels)]
  if args.task == "all":
    return [tasks.TASKS[n] for n in tasks.ALL]
  return [tasks.get(args.task)]


def _load_data(task, args):
  """Examples of every split, from TFDS, a GLUE_DIR, or the custom files."""
  from bertjax.tasks.glue import tfds_source, tsv

  if args.task == "custom":
    return tsv.load_task(task, "")
  if args.data == "tfds":
    return tfds_source.load_task(task, args.tfds_data_dir)
  if not os.path.isdir(args.data):
    raise SystemExit(f"glue: --data {args.data}: not 'tfds' and not a directory")
  return tsv.load_task(task, args.data)


def _check_test_files(task_list, args) -> None:
  """Read every test TSV before anything trains: a test row that cannot be read stops the
  command (ValueError `file:line: why`) instead of leaving it out of a submission."""
  from bertjax.tasks.glue import tsv

  if args.task == "custom" or args.data != "tfds":
    for task in task_list:
      tsv.load_tests(task, "" if args.task == "custom" else args.data)


def _report_skipped(task, examples, out_dir: str) -> None:
  """Per file, how many train/dev rows were skipped and the first of them; all of them go to
  OUT/<task>/skipped_rows.txt."""
  bad = [s for ex in examples.values() for s in ex.skipped]
  if not bad or jax_process_index() != 0:
    return
  path = os.path.join(out_dir, task.name, "skipped_rows.txt")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(bad) + "\n")
  for ex in examples.values():
    if ex.skipped:
      where, why = ex.skipped[0].split(": ", 1)
      name, _, line = where.rpartition(":")
      print(f"glue: {task.name}: {name}: skipped {len(ex.skipped)} malformed rows (first: line "
            f"{line}: {why}); all listed in {path}")


def run_task(task, enc, args, recipes) -> dict:
  """Fine-tune `task` once per recipe; write its submissions; return its results entry."""
  from bertjax.tasks.glue import features, finetune, metrics, submission

  examples = _load_data(task, args)
  _report_skipped(task, examples, args.workdir)
  if args.max_train_examples:
    ex = examples["train"]
    n = args.max_train_examples
    examples["train"] = features.Examples(ex.text_a[:n], ex.text_b and ex.text_b[:n],
                                          None if ex.labels is None else ex.labels[:n],
                                          ex.index[:n])
  print("glue: " + task.name + ": " + ", ".join(f"{k} {len(v)}" for k, v in examples.items()),
        flush=True)
  feats = {k: features.encode(enc.tokenizer, v, args.max_seq_len) for k, v in examples.items()}
  runs = []
  for r in recipes:
    sub = "" if len(recipes) == 1 else f"lr{r.learning_rate:g}-seed{r.seed}"
    res = finetune.train_and_evaluate(task, enc, feats, r, os.path.join(args.workdir, task.name,
                                                                        sub),
                                      progress=not args.no_progress)
    runs.append((r, res))
  best_recipe, best = max(runs, key=lambda rr: rr[1].dev[task.main_metric])
  entry = dict(best.dev)
  writer = jax_process_index() == 0  # every process computes; one writes
  if len(runs) > 1:
    entry.update(_spread(task, runs))
    if writer:
      _write_sweep(task, runs, best, args.workdir)
  for split in task.test:
    if writer and split.name in best.test:
      path = submission.write_submission(task, split, examples[split.name].index,
                                         best.test[split.name], args.workdir)
      print(f"glue: wrote {path}")
  if task.labels is not None and task.dev:
    dev0 = task.dev[0].name
    base = metrics.majority_baseline(feats["train"].labels_N, feats[dev0].labels_N)
    print(f"glue: {task.name}: majority-class dev accuracy {base:.4f}")
  print(f"glue: {task.name}: best {task.main_metric} {best.dev[task.main_metric]:.4f} "
        f"(epoch {best.best_epoch}, lr {best_recipe.learning_rate:g}, seed {best_recipe.seed})")
  return entry


def _spread(task, runs) -> dict[str, float]:
  """Median, mean and std over seeds at the learning rate whose seeds average best on dev
  (the unsuffixed metrics are the best run's: best on dev, an optimistic pick)."""
  import numpy as np

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


def _write_sweep(task, runs, best, out_dir: str) -> None:
  """OUT/<task>/sweep.json with every run; only the best run keeps its checkpoint (a BERT-base
  sweep would otherwise leave 20 copies of the model on disk)."""
  import shutil

  rows = [dict(learning_rate=r.learning_rate, seed=r.seed, best_epoch=res.best_epoch, **res.dev,
               best=res is best) for r, res in runs]
  with open(os.path.join(out_dir, task.name, "sweep.json"), "w") as f:
    json.dump(rows, f, indent=2)
  for _, res in runs:
    if res is not best:
      shutil.rmtree(os.path.join(res.workdir, "best"), ignore_errors=True)


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  import dataclasses

  from bertjax.tasks import finetuning
  from bertjax.tasks import encoder as encoder_lib
  from bertjax.tasks.glue import submission, tsv

  try:
    task_list = _task_list(args)
    _check_test_files(task_list, args)
    enc = encoder_lib.load_encoder(args.init, args.tokenizer, args.preset)
  except (ValueError, FileNotFoundError) as e:  # ConversionError, TokenizerError, ... too
    print(f"glue: {e}" if not str(e).startswith("glue:") else str(e), file=sys.stderr)
    return 2
  print(f"glue: encoder {enc.source}: {enc.config.num_layers} layers, hidden "
        f"{enc.config.hidden_size}, vocab {enc.config.vocab_size}; tokenizer {enc.tokenizer!r}")
  base = finetune_args.recipe_from_args(args, enc.config.hidden_size, "glue",
                                        announce=not args.sweep)
  if args.sweep:
    grid = args.learning_rates
    if grid is None:
      _, default_grid, why = finetuning.learning_rates_for(enc.config.hidden_size)
      grid = ",".join(f"{x:g}" for x in default_grid)
      print(f"glue: --sweep learning rates {grid} ({why}; --learning-rates overrides)")
    lrs = [float(x) for x in grid.split(",")]
  else:
    lrs = [base.learning_rate]
  recipes = [dataclasses.replace(base, learning_rate=lr, seed=s)
             for lr in lrs for s in _seeds(args.seeds, args.sweep, args.seed)]
  os.makedirs(args.workdir, exist_ok=True)
  failed = []
  for task in task_list:
    try:
      entry = run_task(task, enc, args, recipes)
    except tsv.GlueDataError as e:  # `--task all` goes on with the tasks whose data is there
      print(f"glue: {task.name}: {e}", file=sys.stderr)
      failed.append(task.name)
      continue
    if jax_process_index() == 0:
      submission.write_results(args.workdir, {task.name: entry})
    print(f"glue: {task.name}: " + ", ".join(f"{k} {v:.4f}" for k, v in entry.items()
                                             if not k.endswith("_runs")))
  print(f"glue: results in {os.path.join(args.workdir, 'results.json')} and results.md"
        + (f"; no data for {', '.join(failed)}" if failed else ""))
  return 1 if failed else 0


def jax_process_index() -> int:
  import jax

  return jax.process_index()
