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
import dataclasses
import sys

from bertjax.commands.args import HelpFormatter
from bertjax.commands import finetune_args

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="bertjax glue", description=__doc__, formatter_class=HelpFormatter
  )
  p.add_argument(
      "--task",
      required=True,
      help="cola|sst2|mrpc|stsb|qqp|mnli|qnli|rte|wnli|ax|all|custom "
      "(ax = the MNLI model's predictions on the diagnostic)",
  )
  finetune_args.add_encoder_args(p)
  p.add_argument(
      "--data",
      default="tfds",
      help="'tfds' (glue/<task>) or a GLUE_DIR in the "
      "layout of the GLUE download (GLUE_DIR/SST-2/train.tsv, ...)",
  )
  p.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir holding prepared glue/*")
  p.add_argument("--workdir", required=True, help="output directory (OUT)")
  g = p.add_argument_group("recipe (BERT's defaults)")
  finetune_args.add_recipe_args(
      g, learning_rate=2e-5, epochs=3, max_seq_len=128, eval_untrained=False
  )
  g.add_argument(
      "--pooling",
      choices=("cls", "mean"),
      default="cls",
      help="what the classifier reads: cls, BERT's pooled [CLS]; mean, the mean of the last "
      "layer's token states",
  )
  g.add_argument(
      "--sweep",
      action="store_true",
      help="run every learning rate of --learning-rates x every seed of --seeds",
  )
  g.add_argument(
      "--learning-rates",
      default=None,
      help="comma-separated grid for --sweep (default: by the encoder's width, "
      "BERT's 5e-5,4e-5,3e-5,2e-5 for base/large; printed)",
  )
  g.add_argument(
      "--seeds", default="1", help="with --sweep: a count N (seeds 0..N-1) or a comma list (0,7,9)"
  )
  g.add_argument(
      "--max-train-examples",
      type=int,
      default=0,
      help="use only the first N training examples (smoke runs)",
  )
  c = p.add_argument_group("custom tasks (--task custom)")
  c.add_argument("--name", default="custom", help="results key and submission file name")
  c.add_argument("--train", help="training TSV with a header row")
  c.add_argument("--dev", help="dev TSV (same columns)")
  c.add_argument("--test", help="optional test TSV (labels not needed)")
  c.add_argument("--text-columns", help="one or two column names: a[,b]")
  c.add_argument("--label-column", help="label column name")
  c.add_argument("--regression", action="store_true", help="float labels, MSE loss")
  return p


def _task_list(args) -> list:
  from bertjax.tasks.glue import tasks, tsv

  if args.task == "custom":
    missing = [
        f"--{n.replace('_', '-')}"
        for n in ("train", "dev", "text_columns", "label_column")
        if not getattr(args, n)
    ]
    if missing:
      raise SystemExit(f"glue: --task custom needs {', '.join(missing)}")
    cols = tuple(c.strip() for c in args.text_columns.split(",") if c.strip())
    if len(cols) not in (1, 2):
      raise SystemExit(f"glue: --text-columns={args.text_columns!r}: give one or two columns")
    labels = None if args.regression else tsv.custom_labels(args.train, cols, args.label_column)
    return [
        tasks.custom(args.name, args.train, args.dev, args.test, cols, args.label_column, labels)
    ]
  if args.task == "all":
    return [tasks.TASKS[n] for n in tasks.ALL]
  return [tasks.get(args.task)]


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  from bertjax.tasks import encoder as encoder_lib
  from bertjax.tasks.glue import sweep

  opts = sweep.Options(
      workdir=args.workdir,
      data="" if args.task == "custom" else args.data,
      tfds_data_dir=args.tfds_data_dir,
      max_seq_len=args.max_seq_len,
      max_train_examples=args.max_train_examples,
      progress=not args.no_progress,
  )
  try:
    task_list = _task_list(args)
    sweep.check_test_files(task_list, opts)
    enc = encoder_lib.load_encoder(args.init, args.tokenizer, args.preset)
    seeds = sweep.parse_seeds(args.seeds) if args.sweep else [args.seed]
  except (ValueError, FileNotFoundError) as e:  # ConversionError, TokenizerError, ... too
    print(f"glue: {e}" if not str(e).startswith("glue:") else str(e), file=sys.stderr)
    return 2
  print(
      f"glue: encoder {enc.source}: {enc.config.num_layers} layers, hidden "
      f"{enc.config.hidden_size}, vocab {enc.config.vocab_size}; tokenizer {enc.tokenizer!r}"
  )
  base = finetune_args.recipe_from_args(
      args, enc.config.hidden_size, "glue", announce=not args.sweep
  )
  base = dataclasses.replace(base, pooling=args.pooling)
  lrs = [base.learning_rate]
  if args.sweep:
    lrs, why = sweep.learning_rate_grid(args.learning_rates, enc.config.hidden_size)
    print(f"glue: --sweep learning rates {','.join(f'{x:g}' for x in lrs)} ({why})")
  failed = sweep.run(task_list, enc, opts, sweep.recipes(base, lrs, seeds))
  return 1 if failed else 0
