"""`bertjax tokenizer`: train or inspect a tokenizer with BERT's special tokens.

bertjax tokenizer train --input data/austen.txt --vocab-size 8000 --output data/tokenizer
bertjax tokenizer train --kind wordpiece --input 'zh/*.txt' --output zh-vocab  # zh-vocab/vocab.txt
bertjax tokenizer encode --tokenizer data/tokenizer.model "It is a truth universally acknowledged"
bertjax tokenizer info --tokenizer data/tokenizer.model
"""

from __future__ import annotations

import argparse
import json

from bertjax import errors
from bertjax.commands.args import ArgumentParser, fraction, positive_int
from bertjax.commands.args import reword
from bertjax.data import tokenizer_train, wordpiece, wordpiece_train
from bertjax.runtime import fs

# The library's words for what this command's flags set (`reword`).
_FLAGS = {
    "TrainOptions.vocab_size=": "--vocab-size ",
    "TrainOptions.vocab_size": "--vocab-size",
    "TrainOptions.character_coverage=": "--character-coverage ",
    "TrainOptions.character_coverage": "--character-coverage",
    "TrainOptions.model_type=": "--model-type ",
    "output_prefix": "--output",
    "output_dir": "--output",
    "overwrite=True": "--overwrite",
}


def _add_tokenizer(p: argparse.ArgumentParser) -> None:
  p.add_argument(
      "--tokenizer",
      "--model",
      dest="tokenizer",
      required=True,
      metavar="PREFIX.model|vocab.txt|tokenizer.json",
      help="SentencePiece model, WordPiece vocab.txt or transformers tokenizer.json (--model is "
      "the older spelling)",
  )


def _parser() -> argparse.ArgumentParser:
  p = ArgumentParser(prog="bertjax tokenizer", description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="action", required=True)
  t = sub.add_parser(
      "train", help="train PREFIX.model + PREFIX.vocab, or (--kind wordpiece) DIR/vocab.txt"
  )
  t.add_argument(
      "--input",
      nargs="+",
      required=True,
      metavar="FILE_OR_GLOB",
      help="text files, one sentence per line",
  )
  t.add_argument(
      "--vocab-size",
      type=positive_int,
      default=None,
      help=f"pieces, special ones included; exact when given: a corpus that supports fewer is "
      f"an error giving the most it does (default: {tokenizer_train.DEFAULT_VOCAB_SIZE}, or "
      "the most the corpus supports if fewer; printed)",
  )
  t.add_argument(
      "--kind",
      choices=("sentencepiece", "wordpiece"),
      default="sentencepiece",
      help="sentencepiece: PREFIX.model + PREFIX.vocab; wordpiece: a BERT vocab.txt (every "
      "character of the corpus, hence every CJK ideograph, its own entry, as in "
      "bert-base-chinese), written as PREFIX/vocab.txt with a tokenizer_config.json beside it",
  )
  t.add_argument(
      "--output",
      required=True,
      metavar="PREFIX",
      help="file-name prefix (sentencepiece) or directory (wordpiece)",
  )
  t.add_argument(
      "--cased",
      action="store_true",
      help="wordpiece only: keep case and accents (default: uncased, as bert-base-chinese)",
  )
  t.add_argument("--model-type", choices=("unigram", "bpe"), default=None)
  t.add_argument(
      "--character-coverage",
      type=fraction,
      default=None,
      help=f"share of character occurrences given their own piece, {tokenizer_train.MIN_COVERAGE} "
      "to 1 (default: 1.0 when every character fits in the vocabulary, else chosen so that "
      "characters fill 70%% of it; printed)",
  )
  t.add_argument(
      "--no-byte-fallback",
      action="store_true",
      help="uncovered characters become [UNK] instead of UTF-8 byte pieces",
  )
  t.add_argument(
      "--overwrite",
      action="store_true",
      help="replace an existing PREFIX.model and PREFIX.vocab (else an error)",
  )
  e = sub.add_parser("encode", help="print the pieces and ids of some text")
  _add_tokenizer(e)
  e.add_argument("text", nargs="+")
  i = sub.add_parser("info", help="print vocab size, checksum and special tokens as JSON")
  _add_tokenizer(i)
  return p


def _train_wordpiece(args: argparse.Namespace) -> None:
  for flag, given in (
      ("--model-type", args.model_type is not None),
      ("--character-coverage", args.character_coverage is not None),
      ("--no-byte-fallback", args.no_byte_fallback),
  ):
    if given:
      raise errors.UsageError(
          f"{flag}: a SentencePiece option; --kind wordpiece gives every character an entry — "
          f"drop {flag}, or leave out --kind wordpiece"
      )
  try:
    tok = wordpiece_train.train_wordpiece(
        args.input, args.output, args.vocab_size, not args.cased, args.overwrite
    )
  except errors.UserError as e:
    raise reword(e, _FLAGS)
  shown = f"{args.output.rstrip('/')}/vocab.txt"
  print(f"wrote {shown}: vocab_size {tok.vocab_size}, sha256 {tok.sha256[:16]}")


def _train(args: argparse.Namespace) -> None:
  if args.kind == "wordpiece":
    return _train_wordpiece(args)
  if args.cased:
    raise errors.UsageError(
        "--cased: a WordPiece option (SentencePiece keeps case) — add --kind wordpiece, or drop "
        "--cased"
    )
  options = tokenizer_train.TrainOptions(
      vocab_size=args.vocab_size,
      model_type=args.model_type or "unigram",
      character_coverage=args.character_coverage,
      byte_fallback=not args.no_byte_fallback,
  )
  try:
    tok = tokenizer_train.train_tokenizer(args.input, args.output, options, args.overwrite)
  except errors.UserError as e:  # reworded, and left for the command line to report
    raise reword(e, _FLAGS)
  print(
      f"wrote {args.output}.model and {args.output}.vocab: vocab_size "
      f"{tok.vocab_size}, sha256 {tok.sha256[:16]}"
  )


def _load(path: str):
  if not fs.path(path).exists() and fs.path(path + ".model").is_file():
    raise errors.InputNotFoundError(
        f"--tokenizer {path}: no such file — did you mean {path}.model?"
    )
  return wordpiece.load_tokenizer(path)


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  if args.action == "train":
    _train(args)
    return 0
  tok = _load(args.tokenizer)
  if args.action == "encode":
    ids = tok.encode(" ".join(args.text))
    print(" ".join(tok.id_to_piece(i) for i in ids))
    print(" ".join(map(str, ids)))
    return 0
  special = (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id)
  info = {
      "path": str(tok.path),
      "vocab_size": tok.vocab_size,
      "sha256": tok.sha256,
      "special_tokens": {tok.id_to_piece(i): i for i in special},
  }
  print(json.dumps(info, indent=2))
  return 0
