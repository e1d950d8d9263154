"""`bertjax prepare`: tokenize raw text, records or a TFDS corpus into TFRecord shards of documents.

    bertjax prepare --input data/austen.txt --tokenizer data/tokenizer.model \
        --output runs/data --num-shards 8 --eval-fraction 0.02 --eval-shards 2
    bertjax prepare --input 'c4/en/c4-train.*.json.gz' --text-field text \
        --tokenizer c4.model --output runs/c4     # JSON lines: one document per record
    bertjax prepare --input 'fineweb/data/*.parquet' --tokenizer fw.model --output runs/fw
    bertjax prepare --input saved_dataset/ --format arrow --tokenizer t.model --output runs/hf
    bertjax prepare --tfds wikipedia/20230601.en:train --tfds-data-dir ~/tensorflow_datasets \
        --tokenizer wiki.model --output gs://.../wiki --num-shards 256 \
        --worker-index $K --num-workers 8      # on each of 8 machines
    bertjax prepare --input 'wiki/*.txt' --tokenizer bert-base-uncased/vocab.txt \
        --output runs/wiki-wp                  # a WordPiece vocab.txt works as well
    bertjax prepare --input 'zh/*.txt' --tokenizer zh-vocab/vocab.txt --output runs/zh \
        --word-segmenter jieba                 # whole-word masking of Chinese words
    bertjax prepare --input 'c4/*.json.gz' --tokenizer c4.model --output gs://.../c4 \
        --runner beam --beam-option runner=DataflowRunner --beam-option region=us-central1 \
        ...                                    # the same work on Dataflow (docs/data.md)
    bertjax prepare --kind pairs --input pairs.jsonl --tokenizer bert-base-uncased \
        --output runs/pairs                    # query/positive/negative rows (contrastive)
"""

from __future__ import annotations

import argparse
import json

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.commands.args import ArgumentParser, nonneg_int, open_fraction, positive_int
from bertjax.data import formats, prepare as prepare_lib, segment


def _parser() -> argparse.ArgumentParser:
  d = prepare_lib.PrepareConfig(output="", tokenizer="")
  p = ArgumentParser(prog="bertjax prepare", description=__doc__.split("\n")[0])
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument(
      "--input",
      nargs="+",
      metavar="FILE_OR_GLOB",
      help="text (one sentence per line, a blank line between documents), JSON lines, Parquet "
      "or Arrow files (one document per record), or a `datasets` save_to_disk directory",
  )
  src.add_argument("--tfds", metavar="NAME[:SPLIT]", help="a TFDS text dataset")
  p.add_argument(
      "--kind",
      choices=("corpus", "pairs"),
      default="corpus",
      help="corpus: documents for pretraining; pairs: JSON lines / Parquet rows of a query, a "
      "positive and zero or more negatives, for config.objective=contrastive (docs/data.md)",
  )
  p.add_argument("--query-field", default="query", help="--kind pairs: the query's field")
  p.add_argument(
      "--query-prompt",
      default="",
      metavar="TEXT",
      help='--kind pairs: prepended to every query, e.g. "query: " (default: none)',
  )
  p.add_argument(
      "--document-prompt",
      default="",
      metavar="TEXT",
      help='--kind pairs: prepended to every positive and negative, e.g. "passage: "',
  )
  p.add_argument("--positive-field", default="positive", help="--kind pairs: the positive's")
  p.add_argument(
      "--negative-fields",
      metavar="FIELD[,FIELD...]",
      help="--kind pairs: the negatives' fields, each a string or a list of strings (default: "
      "negative, when the rows have it)",
  )
  p.add_argument(
      "--format",
      choices=formats.FORMATS,
      default=d.input_format,
      help="format of the --input files; auto: by extension (.jsonl/.json[.gz|.zst|.bz2|.xz], "
      ".parquet, .arrow; anything else is text)",
  )
  p.add_argument(
      "--text-field",
      default=d.text_field,
      metavar="FIELD",
      help="the record field (JSON key, Parquet/Arrow column) holding the text; a dotted path "
      "such as meta.body reaches a nested one",
  )
  p.add_argument("--tfds-data-dir", help="TFDS data_dir holding the prepared dataset")
  p.add_argument("--tfds-text-key", default=d.tfds_text_key)
  p.add_argument(
      "--tokenizer",
      required=True,
      metavar="PREFIX.model|vocab.txt|tokenizer.json|DIR",
      help="SentencePiece model, WordPiece vocab.txt (uncased if a tokenizer_config.json beside "
      "it says so, else guessed from the vocab), a transformers tokenizer.json, or a checkpoint "
      "directory holding one of them",
  )
  p.add_argument("--output", required=True, metavar="DIR")
  p.add_argument(
      "--num-shards",
      type=positive_int,
      default=d.num_shards,
      help="train shards (per worker); at least the number of training hosts",
  )
  p.add_argument(
      "--eval-fraction",
      type=open_fraction,
      default=d.eval_fraction,
      help="share of documents held out in eval-*.tfrecord, in [0, 1)",
  )
  p.add_argument(
      "--eval-shards",
      type=positive_int,
      default=d.eval_shards,
      help="eval shards (per worker); at least the number of hosts",
  )
  p.add_argument("--worker-index", type=nonneg_int, default=d.worker_index)
  p.add_argument("--num-workers", type=positive_int, default=d.num_workers)
  p.add_argument(
      "--processes",
      type=positive_int,
      default=d.processes,
      help="tokenizer processes on this machine",
  )
  p.add_argument("--max-line-chars", type=positive_int, default=d.max_line_chars)
  p.add_argument("--max-doc-sentences", type=positive_int, default=d.max_doc_sentences)
  p.add_argument("--no-progress", action="store_true")
  p.add_argument(
      "--seed",
      type=nonneg_int,
      default=d.seed,
      help="seed of the document shuffle over the corpus (same seed, same shards)",
  )
  p.add_argument(
      "--overwrite",
      action="store_true",
      help="replace prepared data already in --output (else an error)",
  )
  p.add_argument(
      "--runner",
      choices=("local", "beam"),
      default="local",
      help="local: this machine's processes; beam: an Apache Beam pipeline (needs the beam "
      "extra), on Beam's DirectRunner with --processes workers unless --beam-option "
      "runner=... names another (DataflowRunner, FlinkRunner, SparkRunner; docs/data.md)",
  )
  p.add_argument(
      "--beam-option",
      action="append",
      default=[],
      metavar="KEY=VALUE",
      help="a Beam pipeline option (repeatable), e.g. runner=DataflowRunner, region=us-central1, "
      "direct_num_workers=4; KEY alone sets a switch",
  )
  p.add_argument(
      "--word-segmenter",
      choices=segment.SEGMENTERS,
      default=None,
      help="segment each sentence into words (Chinese) and store the words beside the tokens, "
      "so that --config.data.whole_word_mask=true masks every token of a word together "
      "(default: none; needs the package of that name)",
  )
  return p


def main(argv: list[str]) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  if args.kind == "pairs":
    return _pairs(args)
  if args.worker_index >= args.num_workers:
    raise errors.ConfigError(
        f"--worker-index {args.worker_index} must be < --num-workers {args.num_workers} "
        "(workers are numbered from 0)"
    )
  if args.beam_option and args.runner != "beam":
    raise errors.UsageError("--beam-option goes with --runner beam; add --runner beam or drop it")
  if args.tfds_data_dir and not args.tfds:
    raise errors.UsageError("--tfds-data-dir goes with --tfds NAME; drop it for --input files")
  if args.tfds and (args.format != "auto" or args.text_field != "text"):
    raise errors.UsageError(
        "--format and --text-field go with --input files; a TFDS dataset names its text "
        "feature with --tfds-text-key"
    )
  cfg = prepare_lib.PrepareConfig(
      output=args.output,
      tokenizer=args.tokenizer,
      inputs=tuple(args.input or ()),
      input_format=args.format,
      text_field=args.text_field,
      tfds=args.tfds,
      tfds_data_dir=args.tfds_data_dir,
      tfds_text_key=args.tfds_text_key,
      num_shards=args.num_shards,
      eval_fraction=args.eval_fraction,
      eval_shards=args.eval_shards,
      worker_index=args.worker_index,
      num_workers=args.num_workers,
      processes=args.processes,
      max_line_chars=args.max_line_chars,
      max_doc_sentences=args.max_doc_sentences,
      progress=not args.no_progress,
      overwrite=args.overwrite,
      seed=args.seed,
      word_segmenter=args.word_segmenter,
  )
  try:
    if args.runner == "beam":
      from bertjax.data import beam_prepare

      meta = beam_prepare.prepare(cfg, args.beam_option)
    else:
      meta = prepare_lib.prepare(cfg)
  except errors.UserError as e:  # reworded, and left for the command line to report
    renames = {"input": "inputs", "format": "input_format"}
    raise args_lib.reword(e, args_lib.flag_names(parser, "PrepareConfig", renames))
  summary = {
      k: meta[k]
      for k in ("documents", "sentences", "tokens", "skipped", "repaired", "warnings", "seconds")
  }
  summary["shards"] = len(meta["shards"])
  summary["MB/s"] = round(meta["input_bytes"] / 1e6 / max(meta["seconds"], 1e-9), 2)
  print(json.dumps(summary))
  return 0


def _pairs(args) -> int:
  from bertjax.data import corpus, pairs

  if args.tfds:
    raise errors.UsageError("--kind pairs reads --input files (JSON lines or Parquet)")
  fields = args.negative_fields
  cfg = pairs.PairsConfig(
      output=args.output,
      tokenizer=args.tokenizer,
      inputs=tuple(corpus.expand_inputs(args.input)),
      query_field=args.query_field,
      positive_field=args.positive_field,
      negative_fields=None if fields is None else tuple(f for f in fields.split(",") if f),
      eval_fraction=args.eval_fraction,
      overwrite=args.overwrite,
      query_prompt=args.query_prompt,
      document_prompt=args.document_prompt,
  )
  meta = pairs.prepare(cfg)
  split = {s["split"]: s["documents"] for s in meta["shards"]}
  skipped = {p: sum(w.values()) for p, w in meta["skipped"].items()}
  print(
      json.dumps(
          dict(
              rows=meta["documents"],
              train=split.get("train", 0),
              eval=split.get("eval", 0),
              negatives=meta["negatives"],
              skipped=skipped,
              seconds=meta["seconds"],
          )
      )
  )
  return 0
