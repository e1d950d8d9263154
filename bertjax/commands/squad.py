"""`bertjax squad`: fine-tune a pretrained checkpoint on SQuAD v1.1 or v2.0 and score it.

  bertjax squad --init runs/base --train train-v1.1.json --dev dev-v1.1.json --version 1.1 \\
      --workdir out/squad11
  bertjax squad --init uncased_L-12_H-768_A-12 --train train-v2.0.json --dev dev-v2.0.json \\
      --version 2.0 --workdir out/squad20 --null-threshold -1.5
  bertjax squad --init runs/zh --train cmrc2018_train.json --dev cmrc2018_dev.json \\
      --version 1.1 --metric cmrc2018 --workdir out/cmrc2018

Writes OUT/predictions.json (question id -> answer, the input of the official evaluation
script), OUT/nbest_predictions.json, OUT/null_odds.json (v2.0), OUT/results.json (official EM/F1
in percent; for v2.0 also HasAns/NoAns and the best null threshold), OUT/metrics.jsonl per epoch,
OUT/skipped_questions.txt when questions were malformed, the --test questions' answers
(OUT/test_predictions.json; CLUE's OUT/submission/cmrc2018_predict.json with --metric
cmrc2018), and the best epoch's parameters in OUT/best/ with OUT/best.json. Chinese contexts (no spaces) are split at every CJK character, so
an answer can start and end at any of them; --metric cmrc2018 scores with CMRC 2018's EM and
character-level F1 (and their average). See docs/tasks.md.
"""

from __future__ import annotations

import argparse

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.commands import finetune_args

# --packing's default: off, as nothing measured it faster (docs/tasks.md, "Packing").
PACKING_DEFAULT = False

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def _parser() -> argparse.ArgumentParser:
  p = args_lib.ArgumentParser(prog="bertjax squad", description=__doc__)
  finetune_args.add_encoder_args(p)
  p.add_argument("--train", required=True, help="SQuAD training JSON")
  p.add_argument("--dev", required=True, help="SQuAD dev JSON (scored after every epoch)")
  p.add_argument(
      "--test",
      help="optional SQuAD JSON to answer with the best epoch (no answers needed): "
      "OUT/test_predictions.json, or with --metric cmrc2018 CLUE's "
      "OUT/submission/cmrc2018_predict.json",
  )
  p.add_argument("--version", required=True, choices=("1.1", "2.0"))
  p.add_argument(
      "--metric",
      choices=("squad", "cmrc2018"),
      default="squad",
      help="squad: the official SQuAD EM/F1; cmrc2018: CMRC 2018's EM and character-level F1 "
      "(punctuation removed as its evaluation script does; with --version 1.1)",
  )
  p.add_argument("--workdir", required=True, help="output directory (OUT)")
  g = p.add_argument_group("features and decoding (google-research/bert's defaults)")
  g.add_argument(
      "--max-seq-len",
      type=args_lib.positive_int,
      default=384,
      help="tokens per window; at least --max-query-length + 8",
  )
  g.add_argument("--doc-stride", type=args_lib.positive_int, default=128)
  g.add_argument("--max-query-length", type=args_lib.positive_int, default=64)
  g.add_argument("--n-best", type=args_lib.positive_int, default=20)
  g.add_argument("--max-answer-length", type=args_lib.positive_int, default=30, help="in tokens")
  g.add_argument(
      "--null-threshold",
      type=args_lib.finite_float,
      default=0.0,
      help="v2.0: answer '' when null score - best span score exceeds this",
  )
  g = p.add_argument_group("recipe")
  finetune_args.add_recipe_args(g, learning_rate=3e-5, epochs=2, max_seq_len=None)
  finetune_args.add_packing_arg(g, PACKING_DEFAULT, "windows", 'docs/tasks.md, "Packing"')
  return p


def _read(path: str, version: str, training: bool):
  """The questions of one SQuAD file (and the skipped ones); a file without one usable
  question is refused, naming the first reason."""
  from bertjax.tasks.squad import data

  examples, skipped = data.read(path, version, training)
  if not examples:
    first = f"; first: {skipped[0]}" if skipped else ""
    raise data.SquadDataError(
        f"{path}: no usable questions ({len(skipped)} skipped{first}) — is it SQuAD "
        f"v{version} (--version)?"
    )
  return examples, skipped


def _read_test(path: str, version: str):
  """The questions of a test file; one that cannot be read stops the command (every question
  needs its answer in the submission)."""
  from bertjax.tasks.squad import data

  examples, skipped = data.read(path, version, training=False, labelled=False)
  if skipped:
    raise data.SquadDataError(
        f"{skipped[0]} — every test question needs an answer, so the predictions would be "
        "incomplete: fix this question"
    )
  if not examples:
    raise data.SquadDataError(f"{path}: no questions to answer")
  return examples


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  if args.max_seq_len < args.max_query_length + 8:
    raise errors.ConfigError(
        f"--max-seq-len {args.max_seq_len} leaves no room for the context after a "
        f"--max-query-length {args.max_query_length} question — raise --max-seq-len to at "
        f"least {args.max_query_length + 8} or lower --max-query-length"
    )
  if args.metric == "cmrc2018" and args.version != "1.1":
    raise errors.ConfigError(
        "--metric cmrc2018 scores CMRC 2018, whose every question has an answer: use "
        "--version 1.1 (2.0's unanswerable questions are SQuAD's)"
    )
  finetune_args.check_recipe_args(args)
  from bertjax.runtime import fs
  from bertjax.tasks import files
  from bertjax.tasks.squad import train

  train_ex, bad_train = _read(args.train, args.version, training=True)
  dev_ex, bad_dev = _read(args.dev, args.version, training=False)
  test_ex = _read_test(args.test, args.version) if args.test else []
  enc = finetune_args.load_encoder(args)
  # Every check has passed: from here on the command prints and writes.
  fs.path(args.workdir).mkdir(parents=True, exist_ok=True)
  finetune_args.report_skipped(
      "squad", bad_train + bad_dev, files.join(args.workdir, "skipped_questions.txt")
  )
  print(
      f"squad: encoder {enc.source}: {enc.config.num_layers} layers, hidden "
      f"{enc.config.hidden_size}; tokenizer {enc.tokenizer!r}",
      flush=True,
  )
  recipe = finetune_args.recipe_from_args(args, enc.config.hidden_size, "squad")
  opts = train.Options(
      version=args.version,
      max_seq_len=args.max_seq_len,
      doc_stride=args.doc_stride,
      max_query_length=args.max_query_length,
      n_best=args.n_best,
      max_answer_length=args.max_answer_length,
      null_threshold=args.null_threshold,
      eval_untrained=args.eval_untrained,
      metric=args.metric,
  )
  packing = finetune_args.packed_examples(args.max_seq_len) if args.packing else 0
  result = train.train_and_evaluate(
      enc,
      train_ex,
      dev_ex,
      recipe,
      opts,
      args.workdir,
      progress=not args.no_progress,
      packing=packing,
      test=test_ex,
  )
  print(
      f"squad: best epoch {result.best_epoch}: "
      + ", ".join(
          f"{k} {v:.2f}" for k, v in result.best.items() if not k.endswith(("_total", "skip"))
      )
  )
  print(f"squad: wrote {files.join(args.workdir, 'predictions.json')} and results.json")
  if test_ex:
    print(f"squad: wrote {files.join(args.workdir, train.test_predictions_name(opts))}")
  return 0
