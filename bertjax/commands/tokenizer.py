"""`bertjax tokenizer`: train or inspect a SentencePiece tokenizer with BERT's special tokens.

bertjax tokenizer train --input data/austen.txt --vocab-size 8000 --output data/tokenizer
bertjax tokenizer encode --model data/tokenizer.model "It is a truth universally acknowledged"
bertjax tokenizer info --model data/tokenizer.model
"""

from __future__ import annotations

import argparse
import json
import sys

from bertjax.commands.args import HelpFormatter
from bertjax.data import tokenizer as tokenizer_lib

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="bertjax tokenizer", description=__doc__.split("\n")[0], formatter_class=HelpFormatter
  )
  sub = p.add_subparsers(dest="action", required=True)
  t = sub.add_parser(
      "train", help="train PREFIX.model + PREFIX.vocab", formatter_class=HelpFormatter
  )
  t.add_argument(
      "--input",
      nargs="+",
      required=True,
      metavar="FILE_OR_GLOB",
      help="text files, one sentence per line",
  )
  t.add_argument("--vocab-size", type=int, default=8000)
  t.add_argument("--output", required=True, metavar="PREFIX")
  t.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram")
  t.add_argument(
      "--character-coverage",
      type=float,
      default=None,
      help="share of character occurrences given their own piece (default: 1.0 "
      "when every character fits in the vocabulary, else chosen so that "
      "characters fill 70%% of it; printed)",
  )
  t.add_argument(
      "--no-byte-fallback",
      action="store_true",
      help="uncovered characters become [UNK] instead of UTF-8 byte pieces",
  )
  e = sub.add_parser(
      "encode", help="print the pieces and ids of some text", formatter_class=HelpFormatter
  )
  e.add_argument("--model", required=True)
  e.add_argument("text", nargs="+")
  i = sub.add_parser(
      "info",
      help="print vocab size, checksum and special tokens as JSON",
      formatter_class=HelpFormatter,
  )
  i.add_argument("--model", required=True)
  return p


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.action == "train":
      options = tokenizer_lib.TrainOptions(
          vocab_size=args.vocab_size,
          model_type=args.model_type,
          character_coverage=args.character_coverage,
          byte_fallback=not args.no_byte_fallback,
      )
      tok = tokenizer_lib.train_tokenizer(args.input, args.output, options)
      print(
          f"wrote {args.output}.model and {args.output}.vocab: vocab_size "
          f"{tok.vocab_size}, sha256 {tok.sha256[:16]}"
      )
    elif args.action == "encode":
      tok = tokenizer_lib.SentencePieceTokenizer(args.model)
      ids = tok.encode(" ".join(args.text))
      print(" ".join(tok.id_to_piece(i) for i in ids))
      print(" ".join(map(str, ids)))
    else:
      tok = tokenizer_lib.SentencePieceTokenizer(args.model)
      print(
          json.dumps(
              {
                  "path": str(tok.path),
                  "vocab_size": tok.vocab_size,
                  "sha256": tok.sha256,
                  "special_tokens": dict(
                      zip(tokenizer_lib.SPECIAL_PIECES, range(tokenizer_lib.NUM_SPECIAL))
                  ),
              },
              indent=2,
          )
      )
  except (ValueError, OSError) as e:
    print(f"bertjax tokenizer: {e}", file=sys.stderr)
    return 1
  return 0
