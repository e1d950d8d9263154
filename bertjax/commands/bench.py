"""`bertjax bench`: how fast a BERT config trains here (tokens/s, MFU), beside Hugging Face.

  bertjax bench --preset mini --batch-size 32 --seq-len 128 --compare hf-torch,hf-flax
  bertjax bench --preset base --batch-size 16 --seq-len 128 --json
  bertjax bench input ...      the input pipeline's throughput (experiments/bench_input.py)
  bertjax bench finetune ...   one fine-tuning epoch + dev eval beside Hugging Face PyTorch

See docs/performance.md for the numbers on reference machines and how to read them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from bertjax.commands.args import HelpFormatter

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="bertjax bench", description=__doc__, formatter_class=HelpFormatter
  )
  p.add_argument("--preset", default="base", help="model preset: tiny mini small medium base large")
  p.add_argument("--batch-size", type=int, default=16, help="global sequences per step")
  p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
  p.add_argument(
      "--num-masked",
      type=int,
      default=0,
      help="masked positions per sequence (default ceil(0.15 * seq-len): 20 at 128)",
  )
  p.add_argument("--vocab-size", type=int, default=30522, help="vocabulary (BERT's: 30522)")
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
      type=float,
      default=0.1,
      help="BERT's recipe is 0.1; 0 lets attention use jax.nn.dot_product_attention",
  )
  p.add_argument("--warmup", type=int, default=2, help="untimed steps (the first compiles)")
  p.add_argument("--steps", type=int, default=5, help="timed steps; the median is reported")
  p.add_argument(
      "--compare", default="", help="comma-separated peers: hf-torch, hf-torch-compile, hf-flax"
  )
  p.add_argument(
      "--peak-flops",
      type=float,
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
  p.add_argument("--profile-top", type=int, default=30, help="rows of the --profile breakdown")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  return p


def _bench_input(argv: list[str]) -> int:
  path = os.path.join(_REPO_ROOT, "experiments", "bench_input.py")
  if not os.path.exists(path):
    print(
        f"bertjax bench input: {path} not found; it ships in the source tree, not the wheel: "
        "run from a git checkout",
        file=sys.stderr,
    )
    return 2
  import importlib.util  # a fixed file path, not a name chosen by a string

  mod_spec = importlib.util.spec_from_file_location("bertjax_bench_input", path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  return int(mod.main(argv) or 0)


def _finetune_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="bertjax bench finetune",
      formatter_class=HelpFormatter,
      description="Wall time and dev accuracy of fine-tuning a random-init encoder on a "
      "single-sentence TSV task (train.tsv, dev.tsv: sentence<TAB>label), beside "
      "transformers' BertForSequenceClassification in PyTorch on the same token "
      "ids (each batch padded to its longest row, AdamW, linear schedule).",
  )
  p.add_argument("--task-dir", default=os.path.join(_REPO_ROOT, "data", "movie_snippets"))
  p.add_argument("--tokenizer", default=os.path.join(_REPO_ROOT, "data", "tokenizer.model"))
  p.add_argument("--preset", default="mini", help="model preset: tiny mini small ...")
  p.add_argument("--epochs", type=int, default=1)
  p.add_argument("--batch-size", type=int, default=32, help="global batch size")
  p.add_argument("--eval-batch-size", type=int, default=64)
  p.add_argument("--learning-rate", type=float, default=5e-4, help="peak, both runs")
  p.add_argument("--max-seq-len", type=int, default=128)
  p.add_argument(
      "--length-bucket",
      type=int,
      default=8,
      help="bertjax pads batches to a multiple of this; 0: to --max-seq-len",
  )
  p.add_argument(
      "--max-lengths", type=int, default=8, help="bertjax: at most this many batch lengths"
  )
  p.add_argument("--max-train-examples", type=int, default=0, help="first N rows (quick runs)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--compare", default="hf-torch", help="hf-torch, or '' for bertjax alone")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  return p


def _bench_finetune(argv: list[str]) -> int:
  args = _finetune_parser().parse_args(argv)
  from bertjax.runtime import compile_cache

  own_cache = None
  if compile_cache.cache_dir() is not None and "jax" not in sys.modules:
    # An empty cache of its own, so that the cold run compiles and the warm one can only
    # read what the cold one wrote.
    own_cache = tempfile.mkdtemp(prefix="bertjax-bench-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = own_cache
  try:
    return _run_bench_finetune(args)
  finally:
    if own_cache:
      shutil.rmtree(own_cache, ignore_errors=True)


def _run_bench_finetune(args) -> int:
  from bertjax.bench import pretraining as bench

  spec = bench.FinetuneSpec(
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
      seed=args.seed,
  )
  compare = tuple(c.strip() for c in args.compare.split(",") if c.strip())
  try:
    result = bench.run_finetune(spec, compare)
  except (ValueError, FileNotFoundError) as e:
    print(f"bertjax bench finetune: {e}", file=sys.stderr)
    return 2
  print(json.dumps(result) if args.json else bench.format_finetune_report(result))
  return 0


def main(argv: list[str]) -> int:
  if argv and argv[0] == "input":
    return _bench_input(argv[1:])
  if argv and argv[0] == "finetune":
    return _bench_finetune(argv[1:])
  args = _parser().parse_args(argv)
  if args.xla_flags:
    if "jax" in sys.modules:
      print(
          "bertjax bench: --xla-flags must be set before JAX starts; run the command on its " "own",
          file=sys.stderr,
      )
      return 2
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
  from bertjax.bench import pretraining as bench
  from bertjax.bench import peers as bench_peers

  compare = tuple(c.strip() for c in args.compare.split(",") if c.strip())
  bad = [c for c in compare if c not in bench_peers.PEERS]
  if bad:
    print(
        f"bertjax bench: --compare {','.join(bad)}: unknown peer; valid: "
        f"{', '.join(bench_peers.PEERS)}",
        file=sys.stderr,
    )
    return 2
  try:
    spec = bench.BenchSpec(
        preset=args.preset,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        num_masked=args.num_masked,
        vocab_size=args.vocab_size,
        dtype=args.dtype,
        remat=args.remat,
        scan_layers=args.scan_layers,
        attention_dropout=args.attention_dropout,
        warmup=args.warmup,
        steps=args.steps,
        peak_flops=args.peak_flops,
    )
  except ValueError as e:
    print(f"bertjax bench: {e}", file=sys.stderr)
    return 2
  result = bench.run(spec, compare, repo_root=_REPO_ROOT, profile_dir=args.profile)
  if args.profile:
    prof = result["profile"]
    result["profile"] = {**prof, "ops": prof["ops"][: args.profile_top]}
  print(json.dumps(result) if args.json else bench.format_report(result))
  if args.profile and not args.json:
    print()
    print(bench.format_profile(prof, args.profile_top))
  return 0
