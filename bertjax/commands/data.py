"""`bertjax data`: look at the MLM/NSP examples the model will be trained on.

bertjax data preview --data runs/data -n 5
bertjax data stats --data runs/data --seq-len 128 --pair-mode nsp --n 10000
"""

from __future__ import annotations

import argparse
import json
import sys

from bertjax.commands.args import HelpFormatter
from bertjax.data import pretraining

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def _add_stream_args(p: argparse.ArgumentParser) -> None:
  d = pretraining.InputConfig()
  p.add_argument("--data", required=True, metavar="DIR", help="output of `bertjax prepare`")
  p.add_argument("--split", choices=("train", "eval"), default="train")
  p.add_argument("--seq-len", type=int, default=d.seq_len)
  p.add_argument("--max-predictions", type=int, default=d.max_predictions_per_seq)
  p.add_argument("--pair-mode", choices=("nsp", "sop", "none"), default=d.pair_mode)
  p.add_argument("--mask-prob", type=float, default=d.mask_prob)
  p.add_argument("--short-seq-prob", type=float, default=d.short_seq_prob)
  p.add_argument("--whole-word-mask", action="store_true")
  p.add_argument("--seed", type=int, default=d.seed)
  p.add_argument(
      "--reader",
      choices=("tf.data", "python"),
      default=d.reader,
      help="shard reader; both give the same examples",
  )


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="bertjax data", description=__doc__.split("\n")[0], formatter_class=HelpFormatter
  )
  sub = p.add_subparsers(dest="action", required=True)
  pv = sub.add_parser(
      "preview",
      help="print decoded examples with their masks and labels",
      formatter_class=HelpFormatter,
  )
  _add_stream_args(pv)
  pv.add_argument("-n", type=int, default=5, help="examples to print")
  st = sub.add_parser(
      "stats",
      help="print masking/label statistics as one JSON object",
      formatter_class=HelpFormatter,
  )
  _add_stream_args(st)
  st.add_argument("--n", type=int, default=10_000, help="examples to measure")
  return p


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  from bertjax.data import inspect

  cfg = pretraining.InputConfig(
      source="prepared",
      path=args.data,
      seq_len=args.seq_len,
      max_predictions_per_seq=args.max_predictions,
      pair_mode=args.pair_mode,
      mask_prob=args.mask_prob,
      short_seq_prob=args.short_seq_prob,
      whole_word_mask=args.whole_word_mask,
      seed=args.seed,
      reader=args.reader,
  )
  split = args.split
  try:
    if args.action == "preview":
      print(inspect.preview(cfg, args.n, split=split))
    else:
      print(json.dumps(inspect.stats(cfg, args.n, split=split)))
  except (ValueError, OSError) as e:
    print(f"bertjax data: {e}", file=sys.stderr)
    return 1
  return 0
