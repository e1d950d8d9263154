"""`bertjax data`: look at the MLM/NSP examples the model will be trained on.

bertjax data preview --data runs/data -n 5
bertjax data stats --data runs/data --seq-len 128 --pair-mode nsp -n 10000
bertjax data stats --data runs/data --seq-len 512 --max-predictions 80 --packing
bertjax data stats --sources 'web=runs/web:0.7,books=runs/books:0.3'   # a mixture, as pretrain's
"""

from __future__ import annotations

import argparse
import json

from bertjax import errors
from bertjax.commands.args import ArgumentParser, fraction, nonneg_int, positive_int
from bertjax.data import pretraining
from bertjax.runtime import fs

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

# Tokens an example needs besides its text: [CLS] A [SEP] B [SEP], or [CLS] A [SEP].
_MIN_SEQ_LEN = {"nsp": 5, "sop": 5, "none": 3}


def _add_stream_args(p: argparse.ArgumentParser, n: int, n_help: str) -> None:
  d = pretraining.InputConfig()
  data = p.add_mutually_exclusive_group(required=True)
  data.add_argument("--data", metavar="DIR", help="output of `bertjax prepare`")
  data.add_argument(
      "--sources",
      metavar="SPEC",
      help="a mixture, as config.data.sources writes it: 'NAME=DIR:WEIGHT[:PHASE2_WEIGHT],...'; "
      "stats then reports each source's requested and realised share of the real tokens",
  )
  p.add_argument(
      "--phase",
      type=int,
      choices=(1, 2),
      default=1,
      help="with --sources: the phase whose weights to draw with",
  )
  p.add_argument("--split", choices=("train", "eval"), default="train")
  p.add_argument("--seq-len", type=positive_int, default=d.seq_len)
  p.add_argument("--max-predictions", type=positive_int, default=d.max_predictions_per_seq)
  p.add_argument("--pair-mode", choices=("nsp", "sop", "none"), default=d.pair_mode)
  p.add_argument("--mask-prob", type=fraction, default=d.mask_prob)
  p.add_argument("--short-seq-prob", type=fraction, default=d.short_seq_prob)
  p.add_argument("--whole-word-mask", action="store_true")
  p.add_argument("--seed", type=nonneg_int, default=d.seed)
  p.add_argument(
      "--reader",
      choices=("tf.data", "python"),
      default=d.reader,
      help="shard reader; both give the same examples",
  )
  p.add_argument(
      "--packing",
      action="store_true",
      help="several whole examples per row, as `config.data.packing` trains on",
  )
  p.add_argument(
      "--max-examples-per-row",
      type=nonneg_int,
      default=d.max_examples_per_row,
      metavar="E",
      help="with --packing: examples a row may hold; 0 (default): measured on the corpus, as "
      "pretrain does (the most a row of the first blocks holds with no cap)",
  )
  # -n is the spelling; --n, which `data stats` had, is kept as an alias.
  p.add_argument("-n", "--n", dest="n", type=positive_int, default=n, help=n_help)


def _parser() -> argparse.ArgumentParser:
  p = ArgumentParser(prog="bertjax data", description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="action", required=True)
  pv = sub.add_parser("preview", help="print decoded examples with their masks and labels")
  _add_stream_args(pv, 5, "examples to print (with --packing: rows)")
  st = sub.add_parser("stats", help="print masking/label statistics as one JSON object")
  _add_stream_args(st, 10_000, "examples to measure")
  return p


def _check(args: argparse.Namespace) -> None:
  """What the flags' types cannot see: how they go together, and that --data is a directory."""
  need = _MIN_SEQ_LEN[args.pair_mode]
  if args.seq_len < need:
    raise errors.ConfigError(
        f"--seq-len {args.seq_len} is too short for --pair-mode {args.pair_mode}: it must be "
        f">= {need} ([CLS] and [SEP]s included)"
    )
  if args.sources:
    from bertjax.data import mixture

    for s in mixture.parse_sources(args.sources, "--sources"):
      _check_dir(s.path, f"--sources {s.name}={s.path}")
    return
  _check_dir(args.data, f"--data {args.data}")


def _check_dir(path: str, field: str) -> None:
  data = fs.path(path)
  if not data.exists():
    raise errors.InputNotFoundError(
        f"{field}: no such directory — give the --output of `bertjax prepare`"
    )
  if data.is_file():
    raise errors.ConfigError(f"{field}: is a file — give the directory `bertjax prepare` wrote")


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  _check(args)
  from bertjax.data import inspect

  from bertjax.data import mixture

  sources = mixture.parse_sources(args.sources, "--sources")
  cfg = pretraining.InputConfig(
      source="prepared",
      path=args.data or "",
      sources=mixture.phase_weights(sources, args.phase - 1) if sources else (),
      seq_len=args.seq_len,
      max_predictions_per_seq=args.max_predictions,
      pair_mode=args.pair_mode,
      mask_prob=args.mask_prob,
      short_seq_prob=args.short_seq_prob,
      whole_word_mask=args.whole_word_mask,
      seed=args.seed,
      reader=args.reader,
      packing=args.packing,
      max_examples_per_row=args.max_examples_per_row,
  )
  if args.action == "preview":
    print(inspect.preview(cfg, args.n, split=args.split))
  else:
    print(json.dumps(inspect.stats(cfg, args.n, split=args.split)))
  return 0
