"""`bertjax bench`: how fast a BERT config trains here (tokens/s, MFU), beside Hugging Face and
keras-hub.

  bertjax bench --preset mini --batch-size 32 --seq-len 128 --compare hf-torch,hf-flax
  bertjax bench --preset base --batch-size 16 --seq-len 128 --json
  bertjax bench --preset mini --seq-len 512 --batch-size 4 --data DIR --compare-packing
  bertjax bench --config contrastive --compare sentence-transformers
                               the contrastive objective's training steps/s beside
                               sentence-transformers' MultipleNegativesRankingLoss in PyTorch,
                               same weights and batch (bertjax/bench/contrastive.py); defaults:
                               --preset mini --batch-size 32 --seq-len 128, one hard negative
  bertjax bench input ...      the input pipeline's throughput (prepare, readers, stream)
  bertjax bench finetune ...   one fine-tuning epoch + dev eval beside Hugging Face PyTorch
                               (and keras-hub on Keras's JAX backend: --compare keras-hub)
  bertjax bench encode ...     `bertjax embed`'s documents/s beside sentence-transformers'
                               encode (--compare sentence-transformers; bertjax/bench/encode.py)

See docs/performance.md for the numbers on reference machines and how to read them. The work is
`bertjax.bench` (pretraining, input, finetuning); this module reads the flags.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from bertjax import errors, locations
from bertjax.commands import args as args_lib
from bertjax.commands import glue as glue_cmd
from bertjax.commands.args import (
    ArgumentParser,
    nonneg_int,
    open_fraction,
    positive_float,
    positive_int,
)

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).
# The paths a user names go through `bertjax.runtime.fs` (etils.epath): local or gs://.


# ----------------------------------------------------------------------------------- flags

# `--config contrastive`'s defaults where they differ from the MLM step's: minutes on 2 cores.
CONTRASTIVE_DEFAULTS = {"preset": "mini", "batch_size": 32}
MLM_DEFAULTS = {"preset": "base", "batch_size": 16}
# The MLM step's flags that mean nothing for a recipe's step.
MLM_ONLY = ("num_masked", "peak_flops", "profile", "data", "packing", "compare_packing")


def _pretraining_flags(p: argparse.ArgumentParser) -> None:
  p.add_argument(
      "--preset",
      default=None,
      help="model preset: tiny mini small medium base large (default base; with --config "
      f"contrastive: {CONTRASTIVE_DEFAULTS['preset']})",
  )
  p.add_argument(
      "--batch-size",
      type=positive_int,
      default=None,
      help="global sequences per step (default 16; with --config contrastive: "
      f"{CONTRASTIVE_DEFAULTS['batch_size']} queries, each with its positive and a hard negative)",
  )
  p.add_argument(
      "--config",
      default="",
      metavar="RECIPE",
      help="time this recipe of experiments/pretrain.py instead of the MLM step: contrastive "
      "(the contrastive objective; --compare sentence-transformers: MultipleNegativesRanking"
      "Loss in PyTorch on the same weights and batch, in turns; docs/retrieval.md)",
  )
  p.add_argument("--seq-len", type=positive_int, default=128, help="tokens per sequence (<= 512)")
  p.add_argument(
      "--num-masked",
      type=nonneg_int,
      default=0,
      help="masked positions per sequence (default ceil(0.15 * seq-len): 20 at 128)",
  )
  p.add_argument(
      "--vocab-size", type=positive_int, default=30522, help="vocabulary (BERT's: 30522)"
  )
  p.add_argument(
      "--dtype",
      default="float32",
      choices=("float32", "bfloat16"),
      help="compute dtype; parameters stay float32",
  )
  p.add_argument("--remat", default="none", choices=("none", "full", "dots"))
  p.add_argument("--scan-layers", action="store_true", help="nn.scan over layers (fast compile)")
  p.add_argument(
      "--attention-dropout",
      type=open_fraction,
      default=0.1,
      help="BERT's recipe is 0.1; 0 lets attention use jax.nn.dot_product_attention",
  )
  p.add_argument(
      "--warmup", type=positive_int, default=2, help="untimed steps (the first compiles)"
  )
  p.add_argument(
      "--steps", type=positive_int, default=5, help="timed steps; the median is reported"
  )
  p.add_argument(
      "--compare",
      default="",
      help="comma-separated peers: hf-torch, hf-torch-compile, hf-flax, keras-hub (keras-hub's "
      "BertMaskedLM on Keras's JAX backend, in a child process; MLM only, no NSP); with "
      "--config contrastive: sentence-transformers",
  )
  p.add_argument(
      "--peak-flops",
      type=args_lib.nonneg_float,
      default=0.0,
      help="peak FLOP/s of the devices used (default: measured on CPU, published "
      "dense bf16 peak on known GPUs/TPUs)",
  )
  p.add_argument(
      "--xla-flags",
      default="",
      help="extra XLA_FLAGS for this run (set before JAX starts); write it as "
      "--xla-flags='--xla_cpu_...=...' (with '=' so the value may start with --)",
  )
  p.add_argument(
      "--profile",
      default="",
      metavar="DIR",
      help="also trace two warm steps with jax.profiler into DIR and print where "
      "the step's time goes, by model op",
  )
  p.add_argument(
      "--profile-top", type=positive_int, default=30, help="rows of the --profile breakdown"
  )
  p.add_argument(
      "--data",
      default="",
      metavar="DIR",
      help="time batches of this prepared directory's stream instead of synthetic full rows, "
      "and report real (not padding) tokens/s",
  )
  p.add_argument(
      "--packing", action="store_true", help="with --data: several whole examples per row"
  )
  p.add_argument(
      "--compare-packing",
      action="store_true",
      help="with --data: time the unpacked and the packed step in turns in this one run and "
      "print real tokens/s packed / unpacked",
  )
  p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _input_flags(p: argparse.ArgumentParser) -> None:
  p.add_argument("--corpus", default=str(locations.DATA_DIR / "austen.txt"), help="raw text")
  p.add_argument("--tokenizer", default=str(locations.DATA_DIR / "tokenizer.model"))
  p.add_argument("--copies", type=positive_int, default=4, help="corpus copies for the large run")
  p.add_argument("--batch", type=positive_int, default=256, help="stream batch size")
  p.add_argument(
      "--steps",
      type=positive_int,
      default=400,
      help="batches timed per stream run; several epochs of the default corpus",
  )
  p.add_argument("--readers", default="tf.data,python", help="shard readers to time")
  p.add_argument("--data", help="only read and stream this prepared directory (no prepare)")
  p.add_argument(
      "--formats",
      metavar="LIST",
      help="instead of the full benchmark: `prepare` on one process over the same documents "
      "(--copies x --corpus) as text, jsonl, jsonl.gz and/or parquet: documents/s, tokens/s, "
      "peak memory and where the time goes",
  )
  p.add_argument("--google-bert-dir", help="unpacked bert-tensorflow sdist (optional)")
  p.add_argument(
      "--google-copies", type=positive_int, default=1, help="corpus copies for Google's script"
  )
  p.add_argument("--workdir", help="where the prepared copies go (default: a temporary directory)")
  p.add_argument("--json", metavar="PATH", help="also write the results here")
  p.add_argument(
      "--config",
      metavar="RECIPE",
      help="with --accelerator: the pretraining recipe, as `bertjax compile --config`",
  )
  p.add_argument(
      "--accelerator",
      metavar="TYPE",
      help="instead of the full benchmark: the rows/s per host the recipe needs on this TPU "
      "slice (e.g. v4-32), the stream's rate per worker here, and the workers needed",
  )


def _finetune_flags(p: argparse.ArgumentParser) -> None:
  p.add_argument("--task-dir", default=str(locations.DATA_DIR / "movie_snippets"))
  p.add_argument("--tokenizer", default=str(locations.DATA_DIR / "tokenizer.model"))
  p.add_argument("--preset", default="mini", help="model preset: tiny mini small ...")
  p.add_argument("--epochs", type=positive_int, default=1)
  p.add_argument("--batch-size", type=positive_int, default=32, help="global batch size")
  p.add_argument("--eval-batch-size", type=positive_int, default=64)
  p.add_argument("--learning-rate", type=positive_float, default=5e-4, help="peak, both runs")
  p.add_argument("--max-seq-len", type=positive_int, default=128, help="tokens per row (<= 512)")
  p.add_argument(
      "--length-bucket",
      type=nonneg_int,
      default=8,
      help="bertjax pads batches to a multiple of this; 0: to --max-seq-len",
  )
  p.add_argument(
      "--max-lengths",
      type=positive_int,
      default=8,
      help="bertjax: at most this many batch lengths",
  )
  p.add_argument(
      "--max-train-examples", type=nonneg_int, default=0, help="first N rows (quick runs)"
  )
  p.add_argument(
      "--packing",
      action="store_true",
      help="bertjax packs short examples into --max-seq-len rows, as `glue --packing` does",
  )
  p.add_argument("--seed", type=nonneg_int, default=0)
  p.add_argument(
      "--compare",
      default="hf-torch,hf-torch-flat",
      help="comma-separated peers: hf-torch (padding each batch), hf-torch-flat (transformers' "
      "padding-free path: timed where the installed transformers keeps the flattened examples "
      "apart, measured each run), keras-hub (BertTextClassifier on Keras's JAX backend, every "
      "batch padded to --max-seq-len; not in the default); '' for bertjax alone",
  )
  p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _parser() -> ArgumentParser:
  p = ArgumentParser(prog="bertjax bench", description=__doc__)
  _pretraining_flags(p)
  sub = p.add_subparsers(dest="bench", title="other benchmarks", metavar="{input,finetune,encode}")
  _input_flags(
      sub.add_parser(
          "input",
          help="the input pipeline: prepare MB/s and memory, readers, stream examples/s",
          description="Input benchmark: `bertjax prepare` MB/s and peak memory (1x and "
          "--copies x the corpus), the shard readers' tokens/s, the stream's examples/s at seq "
          "128 and 512; optionally Google's create_pretraining_data.py on the same text. "
          "Prints one JSON object (see experiments/bench_input.py for the expected figures).",
      )
  )
  _finetune_flags(
      sub.add_parser(
          "finetune",
          help="one fine-tuning run + dev eval beside Hugging Face PyTorch",
          description="Wall time and dev accuracy of fine-tuning a random-init encoder on a "
          "single-sentence TSV task (train.tsv, dev.tsv: sentence<TAB>label), beside "
          "transformers' BertForSequenceClassification in PyTorch on the same token "
          "ids (each batch padded to its longest row, AdamW, linear schedule) and, with "
          "--compare keras-hub, keras-hub's BertTextClassifier on Keras's JAX backend.",
      )
  )
  e = sub.add_parser(
      "encode",
      help="embedding documents/s beside sentence-transformers' encode",
      description="bertjax/bench/encode.py's docstring: the bundled retrieval corpus, a "
      "random model of each --shape, packed rows against sentence-transformers' padded "
      "batches, float32 on the CPU, in the same run.",
  )
  e.add_argument("--compare", default="", help="sentence-transformers, or nothing")
  e.add_argument(
      "--shape",
      default="bert-mini,minilm-l6-h384",
      help="comma-separated model shapes: bert-mini, minilm-l6-h384 (default: both)",
  )
  e.add_argument("--max-docs", type=positive_int, default=None, help="the first N documents")
  e.add_argument("--batch-size", type=positive_int, default=32, help="packed rows per pass")
  e.add_argument("--json", action="store_true", help="print one JSON object per shape")
  return p


def _bench_encode(args) -> int:
  from bertjax.bench import encode

  shapes = [s for s in args.shape.split(",") if s]
  bad = [s for s in shapes if s not in encode.SHAPES]
  if bad or not shapes:
    raise errors.ConfigError(f"--shape {args.shape!r}; valid: {', '.join(encode.SHAPES)}")
  compare = _peers(args.compare)
  if set(compare) - {"sentence-transformers"}:
    raise errors.ConfigError(f"--compare {args.compare!r}; valid: sentence-transformers")
  rows = []
  for shape in shapes:
    rows.append(encode.run_encode(shape, compare, args.max_docs, args.batch_size))
    print(json.dumps(rows[-1]) if args.json else encode.format_report(rows[-1:]), flush=True)
  return 0


def _subparser(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
  (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
  return sub.choices[name]


# ---------------------------------------------------------------- the library's words -> flags


def _flag_names(p: argparse.ArgumentParser, spec: str) -> dict[str, str]:
  """`args.flag_names` for the options of `p` (each dest is the spec's field of that name)."""
  return {"compare=": "--compare ", **args_lib.flag_names(p, spec)}


def _peers(text: str) -> tuple[str, ...]:
  return tuple(c.strip() for c in text.split(",") if c.strip())


# ------------------------------------------------------------------------------ pretraining


def _set_xla_flags(args) -> None:
  if args.xla_flags:
    if "jax" in sys.modules:
      raise errors.UsageError(
          "--xla-flags must be set before JAX starts — run `bertjax bench` on its own"
      )
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()


def _with_defaults(args, defaults: dict) -> None:
  for dest, value in defaults.items():
    if getattr(args, dest) is None:
      setattr(args, dest, value)


def _bench_pretraining(args, p: argparse.ArgumentParser) -> int:
  from bertjax.runtime import fs

  if args.config:
    return _bench_recipe(args, p)
  _with_defaults(args, MLM_DEFAULTS)
  if args.profile and fs.path(args.profile).exists() and not fs.path(args.profile).is_dir():
    raise errors.ConfigError(
        f"--profile {args.profile}: is a file — name a directory for the trace"
    )
  _set_xla_flags(args)
  from bertjax.bench import pretraining as bench, profile, spec as bench_spec

  with args_lib.in_flag_words(_flag_names(p, "BenchSpec")):
    bench.check_peers(_peers(args.compare))
    spec = _spec(
        args,
        num_masked=args.num_masked,
        peak_flops=args.peak_flops,
        data=args.data or "",
        packing=args.packing,
        compare_packing=args.compare_packing,
    )
    if args.profile and args.compare_packing:
      raise errors.UsageError("--profile traces one step: run it without --compare-packing")
    result = bench.run(
        spec, _peers(args.compare), repo_root=str(locations.REPO_ROOT), profile_dir=args.profile
    )
  if args.profile:
    prof = result["profile"]
    result["profile"] = {**prof, "ops": prof["ops"][: args.profile_top]}
  print(json.dumps(result) if args.json else bench_spec.format_report(result))
  if args.profile and not args.json:
    print()
    print(profile.format_profile(prof, args.profile_top))
  return 0


def _spec(args, **step_flags):
  """The BenchSpec of the flags both steps share, and `step_flags` (the MLM step's own)."""
  from bertjax.bench import spec as bench_spec

  return bench_spec.BenchSpec(
      preset=args.preset,
      batch_size=args.batch_size,
      seq_len=args.seq_len,
      vocab_size=args.vocab_size,
      dtype=args.dtype,
      remat=args.remat,
      scan_layers=args.scan_layers,
      attention_dropout=args.attention_dropout,
      warmup=args.warmup,
      steps=args.steps,
      **step_flags,
  )


def _bench_recipe(args, p: argparse.ArgumentParser) -> int:
  """`bench --config contrastive`: the recipe's step, beside sentence-transformers'."""
  given = [d for d in MLM_ONLY if getattr(args, d) != p.get_default(d)]
  if given:
    flag = "--" + given[0].replace("_", "-")
    raise errors.UsageError(f"{flag}: times the MLM step only — drop it or --config")
  _with_defaults(args, CONTRASTIVE_DEFAULTS)
  _set_xla_flags(args)
  from bertjax.bench import contrastive

  with args_lib.in_flag_words(_flag_names(p, "BenchSpec")):
    spec = _spec(args)
    result = contrastive.run(spec, args.config, _peers(args.compare))
  print(json.dumps(result) if args.json else contrastive.format_report(result))
  return 0


# ------------------------------------------------------------------------------------ input


def _check_output(path: str | None) -> None:
  from bertjax.runtime import fs

  if not path:
    return
  parent = fs.absolute(path).parent
  if not parent.is_dir():
    raise errors.InputNotFoundError(f"--json {path}: no directory {parent} — create it first")
  if fs.path(path).is_dir():
    raise errors.ConfigError(f"--json {path}: is a directory — name a file")


def _bench_input(args, p: argparse.ArgumentParser) -> int:
  from bertjax.bench import input as input_bench

  _check_output(args.json)
  if args.accelerator or args.config:
    return _bench_host_check(args)
  with args_lib.in_flag_words(_flag_names(p, "InputBenchSpec")):
    spec = input_bench.InputBenchSpec(
        corpus=args.corpus,
        tokenizer=args.tokenizer,
        copies=args.copies,
        batch=args.batch,
        steps=args.steps,
        readers=tuple(r.strip() for r in args.readers.split(",") if r.strip()),
        data=args.data or "",
        google_bert_dir=args.google_bert_dir or "",
        google_copies=args.google_copies,
        workdir=args.workdir or "",
        formats=tuple(f.strip() for f in (args.formats or "").split(",") if f.strip()),
    )
    results = input_bench.run(spec)
  print(json.dumps(results, indent=2))
  if args.json:
    from bertjax.runtime import fs

    fs.path(args.json).write_text(json.dumps(results, indent=2) + "\n")
  return 0


def _bench_host_check(args) -> int:
  """`bench input --config RECIPE --accelerator TYPE`: does one host's stream keep up?"""
  from bertjax.bench import input as input_bench
  from bertjax.commands import pretrain
  from bertjax.data import bundled
  from bertjax.runtime import fs

  if not (args.accelerator and args.config):
    missing = "--accelerator TYPE (e.g. v4-32)" if args.config else "--config RECIPE (e.g. base)"
    raise errors.UsageError(f"--config and --accelerator go together — add {missing}")
  config = pretrain.load_config(args.config)
  input_bench.host_needs(config, args.accelerator)  # a bad slice fails before any work
  if args.data and not (fs.path(args.data) / "metadata.json").is_file():
    raise errors.InputNotFoundError(
        f"--data {args.data}: no metadata.json — name a directory written by `bertjax prepare`"
    )
  with tempfile.TemporaryDirectory() as tmp:
    data = fs.path(args.data) if args.data else fs.path(tmp) / "data"
    if not args.data:
      bundled.prepare_into(data)
    result = input_bench.host_check(config, args.accelerator, data, args.steps, args.batch)
  print(input_bench.format_host_check(result))
  if args.json:
    fs.path(args.json).write_text(json.dumps(result, indent=2) + "\n")
  return 0


# --------------------------------------------------------------------------------- finetune


def _bench_finetune(args, p: argparse.ArgumentParser) -> int:
  from bertjax.bench import finetuning
  from bertjax.runtime import compile_cache

  with args_lib.in_flag_words(_flag_names(p, "FinetuneSpec")):
    compare = _peers(args.compare)
    finetuning.check_peers(compare)
    spec = finetuning.FinetuneSpec(
        task_dir=args.task_dir,
        tokenizer=args.tokenizer,
        preset=args.preset,
        epochs=args.epochs,
        batch_size=args.batch_size,
        eval_batch_size=args.eval_batch_size,
        learning_rate=args.learning_rate,
        max_seq_len=args.max_seq_len,
        length_bucket=args.length_bucket,
        max_lengths=args.max_lengths,
        max_train_examples=args.max_train_examples,
        packing=glue_cmd.packed_examples(args.max_seq_len) if args.packing else 0,
        seed=args.seed,
    )
    spec.check_inputs()
    own_cache = None
    if compile_cache.cache_dir() is not None and "jax" not in sys.modules:
      # An empty cache of its own, so that the cold run compiles and the warm one can only
      # read what the cold one wrote.
      own_cache = tempfile.mkdtemp(prefix="bertjax-bench-xla-")
      os.environ["JAX_COMPILATION_CACHE_DIR"] = own_cache
    try:
      result = finetuning.run_finetune(spec, compare)
    finally:
      if own_cache:
        shutil.rmtree(own_cache, ignore_errors=True)
  print(json.dumps(result) if args.json else finetuning.format_finetune_report(result))
  return 0


def main(argv: list[str]) -> int:
  p = _parser()
  args = p.parse_args(argv)
  if args.bench == "input":
    return _bench_input(args, _subparser(p, "input"))
  if args.bench == "finetune":
    return _bench_finetune(args, _subparser(p, "finetune"))
  if args.bench == "encode":
    return _bench_encode(args)
  return _bench_pretraining(args, p)
