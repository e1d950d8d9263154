"""`bertjax glue`: fine-tune a pretrained checkpoint on GLUE, CLUE or a custom task and score it.

  bertjax glue --task sst2 --init runs/base --data GLUE_DIR --workdir out/glue
  bertjax glue --task tnews --init runs/zh --data tnews_public --workdir out/clue
  bertjax glue --task all --init runs/base --data tfds --tfds-data-dir ~/tfds --workdir out/glue
  bertjax glue --task rte --init runs/base --data GLUE_DIR --workdir out/rte --sweep --seeds 5
  bertjax glue --task custom --name reviews --train r/train.tsv --dev r/dev.tsv \\
      --text-columns review --label-column stars --init runs/base --workdir out/reviews
  bertjax glue --task custom --name news --train n/train.json --dev n/dev.json \\
      --text-fields title,body --label-field topic --init runs/base --workdir out/news

Writes OUT/results.json (task -> metric -> value), OUT/results.md, OUT/submission/<Name>.tsv
(CLUE: OUT/submission/<name>_predict.json) for every test set it has, and per task OUT/<task>/
with metrics.jsonl and the best epoch's checkpoint (best/, best.json). Every task's data is
read, and the checkpoint loaded, before OUT is created. See docs/glue.md.
"""

from __future__ import annotations

import argparse
import dataclasses

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.commands import finetune_args

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

TASK_NAMES = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax")
CLUE_NAMES = ("afqmc", "tnews", "iflytek", "cmnli", "ocnli", "csl", "cluewsc2020")
_CUSTOM_FLAGS = (
    "train",
    "dev",
    "test",
    "text_columns",
    "label_column",
    "text_fields",
    "label_field",
)
# --packing's default, by measurement (docs/glue.md, "Packing").
PACKING_DEFAULT = True
packed_examples = finetune_args.packed_examples  # examples a packed row holds at most


def _learning_rates(text: str) -> list[float]:
  """argparse type of --learning-rates: a comma list of numbers > 0."""
  rates = [args_lib.positive_float(x.strip()) for x in text.split(",") if x.strip()]
  if not rates:
    raise argparse.ArgumentTypeError(f"{text!r}: give one or more rates, e.g. 5e-5,3e-5")
  return rates


def _seeds(text: str) -> list[int]:
  """argparse type of --seeds: a count N (seeds 0..N-1) or a comma list of seeds."""
  parts = [x.strip() for x in text.split(",") if x.strip()]
  if len(parts) == 1:
    return list(range(args_lib.positive_int(parts[0])))
  if not parts:
    raise argparse.ArgumentTypeError(f"{text!r}: give a count (3) or a list of seeds (0,7,9)")
  return [args_lib.nonneg_int(x) for x in parts]


def _parser() -> argparse.ArgumentParser:
  p = args_lib.ArgumentParser(prog="bertjax glue", description=__doc__)
  p.add_argument(
      "--task",
      required=True,
      help=f"{'|'.join(TASK_NAMES)}|all|custom (ax = the MNLI model's predictions on the "
      f"diagnostic), or a CLUE task: {'|'.join(CLUE_NAMES)}",
  )
  finetune_args.add_encoder_args(p)
  p.add_argument(
      "--data",
      default="tfds",
      help="'tfds' (glue/<task>) or a GLUE_DIR in the "
      "layout of the GLUE download (GLUE_DIR/SST-2/train.tsv, ...); a CLUE task: the directory "
      "holding its train.json, dev.json and test.json",
  )
  p.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir holding prepared glue/*")
  p.add_argument("--workdir", required=True, help="output directory (OUT)")
  g = p.add_argument_group("recipe (BERT's defaults)")
  finetune_args.add_recipe_args(
      g,
      learning_rate=2e-5,
      epochs=3,
      max_seq_len=128,
      min_seq_len=(4, "[CLS] a [SEP] b [SEP]"),
      eval_untrained=False,
  )
  g.add_argument(
      "--pooling",
      choices=("cls", "mean"),
      default="cls",
      help="what the classifier reads: cls, BERT's pooled [CLS]; mean, the mean of the last "
      "layer's token states",
  )
  finetune_args.add_packing_arg(g, PACKING_DEFAULT, "examples", 'docs/glue.md, "Packing"')
  g.add_argument(
      "--sweep",
      action="store_true",
      help="run every learning rate of --learning-rates x every seed of --seeds",
  )
  g.add_argument(
      "--learning-rates",
      type=_learning_rates,
      default=None,
      help="comma-separated grid for --sweep (default: by the encoder's width, "
      "BERT's 5e-5,4e-5,3e-5,2e-5 for base/large; printed)",
  )
  g.add_argument(
      "--seeds",
      type=_seeds,
      default=None,
      help="with --sweep: a count N (seeds 0..N-1) or a comma list (0,7,9) (default: 1)",
  )
  g.add_argument(
      "--max-train-examples",
      type=args_lib.nonneg_int,
      default=0,
      help="use only the first N training examples (smoke runs); 0: all",
  )
  c = p.add_argument_group("custom tasks (--task custom)")
  c.add_argument("--name", default="custom", help="results key and submission file name")
  c.add_argument("--train", help="training TSV with a header row, or JSON lines (--text-fields)")
  c.add_argument("--dev", help="dev file (same columns or fields)")
  c.add_argument("--test", help="optional test file (labels not needed)")
  c.add_argument("--text-columns", help="TSV: one or two column names: a[,b]")
  c.add_argument("--label-column", help="TSV: label column name")
  c.add_argument(
      "--text-fields",
      help="JSON lines (one object a line): one or two field names: a[,b]; a field may hold a "
      "list of strings (joined by spaces)",
  )
  c.add_argument(
      "--label-field",
      help='JSON lines: label field name; a test record\'s "id" names its submission line',
  )
  c.add_argument("--regression", action="store_true", help="float labels, MSE loss")
  return p


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def _check_flags(args) -> None:
  """Flags that only make sense together."""
  if args.task != "custom":
    given = [_flag(n) for n in _CUSTOM_FLAGS if getattr(args, n)] + (
        ["--regression"] if args.regression else []
    )
    if given:
      raise errors.ConfigError(
          f"{', '.join(given)}: only for --task custom (--task {args.task} reads its own files)"
      )
  if args.sweep and args.learning_rate is not None:
    raise errors.ConfigError(
        "--learning-rate: a --sweep runs the grid of --learning-rates — give the rate there"
    )
  if not args.sweep:
    given = [f for f in ("--learning-rates", "--seeds") if getattr(args, f[2:].replace("-", "_"))]
    if given:
      raise errors.ConfigError(
          f"{' and '.join(given)}: only with --sweep (one run: --learning-rate, --seed)"
      )


def _task_list(args) -> list:
  """The tasks of --task; a custom task's training file is read for its label list."""
  from bertjax.tasks.glue import tasks, tsv

  if args.task == "custom":
    jsonl = bool(args.text_fields or args.label_field)
    if jsonl and (args.text_columns or args.label_column):
      raise errors.ConfigError(
          "--text-columns/--label-column name TSV columns, --text-fields/--label-field JSON "
          "fields: give one pair, for the kind of files --train is"
      )
    if not jsonl and (args.train or "").endswith((".json", ".jsonl")):
      raise errors.ConfigError(
          f"--train {args.train}: a JSON-lines file is read by --text-fields and --label-field "
          "(--text-columns and --label-column name the columns of a TSV file)"
      )
    text_flag, label_flag = ("text_fields", "label_field") if jsonl else _TSV_FLAGS
    missing = [_flag(n) for n in ("train", "dev", text_flag, label_flag) if not getattr(args, n)]
    if missing:
      raise errors.ConfigError(
          f"--task custom needs {', '.join(missing)} (JSON lines: --text-fields and "
          "--label-field instead of --text-columns and --label-column)"
      )
    text, label = getattr(args, text_flag), getattr(args, label_flag)
    cols = tuple(c.strip() for c in text.split(",") if c.strip())
    if len(cols) not in (1, 2):
      raise errors.ConfigError(
          f"{_flag(text_flag)} {text!r}: give one or two names, e.g. review or question,answer"
      )
    fmt = "jsonl" if jsonl else "tsv"
    labels = None if args.regression else tsv.custom_labels(args.train, cols, label, fmt)
    return [tasks.custom(args.name, args.train, args.dev, args.test, cols, label, labels, fmt)]
  if args.task == "all":
    return [tasks.TASKS[n] for n in tasks.ALL]
  if args.task not in TASK_NAMES + CLUE_NAMES:
    raise errors.ConfigError(
        f"--task {args.task!r} is not a task — valid: {', '.join(TASK_NAMES)}, all, custom, "
        f"and CLUE's {', '.join(CLUE_NAMES)}"
    )
  return [tasks.get(args.task)]


_TSV_FLAGS = ("text_columns", "label_column")


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  _check_flags(args)
  task_list = _task_list(args)
  finetune_args.check_recipe_args(args)
  from bertjax.runtime import fs
  from bertjax.tasks.glue import sweep

  if args.task in CLUE_NAMES and args.data == "tfds":
    raise errors.ConfigError(
        f"--task {args.task} reads CLUE's JSON-lines files: pass --data DIR, the directory "
        "holding its train.json, dev.json and test.json (as CLUE distributes them)"
    )
  opts = sweep.Options(
      workdir=args.workdir,
      data="" if args.task == "custom" else args.data,
      tfds_data_dir=args.tfds_data_dir,
      max_seq_len=args.max_seq_len,
      max_train_examples=args.max_train_examples,
      progress=not args.no_progress,
      packing=packed_examples(args.max_seq_len) if args.packing else 0,
  )
  if opts.data not in ("", "tfds") and not fs.path(opts.data).is_dir():
    want = (
        f"the directory holding {args.task}'s train.json, dev.json and test.json"
        if args.task in CLUE_NAMES
        else "a GLUE_DIR in the layout of the GLUE download (GLUE_DIR/SST-2/train.tsv, ...)"
    )
    raise errors.InputNotFoundError(
        f"--data {opts.data}: not 'tfds' and no such directory — pass {want}"
    )
  sweep.check_data(task_list, opts)
  enc = finetune_args.load_encoder(args)
  # Every check has passed: from here on the command prints and writes.
  print(
      f"glue: encoder {enc.source}: {enc.config.num_layers} layers, hidden "
      f"{enc.config.hidden_size}, vocab {enc.config.vocab_size}; tokenizer {enc.tokenizer!r}"
  )
  base = finetune_args.recipe_from_args(
      args, enc.config.hidden_size, "glue", announce=not args.sweep
  )
  base = dataclasses.replace(base, pooling=args.pooling)
  lrs, seeds = [base.learning_rate], [args.seed]
  if args.sweep:
    lrs, why = sweep.learning_rate_grid(args.learning_rates, enc.config.hidden_size)
    why = why if args.learning_rates else f"{why}; --learning-rates overrides"
    seeds = args.seeds or [0]
    print(
        f"glue: --sweep learning rates {','.join(f'{x:g}' for x in lrs)} ({why}), seeds "
        f"{','.join(map(str, seeds))}"
    )
  sweep.run(task_list, enc, opts, sweep.recipes(base, lrs, seeds))
  return 0
