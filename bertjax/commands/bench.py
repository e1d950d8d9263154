"""`bertjax bench`: how fast a BERT config trains here (tokens/s, MFU), beside Hugging Face.

  bertjax bench --preset mini --batch-size 32 --seq-len 128 --compare hf-torch,hf-flax
  bertjax bench --preset base --batch-size 16 --seq-len 128 --json
  bertjax bench input ...      the input pipeline's throughput (experiments/bench_input.py)

See docs/performance.md for the numbers on reference machines and how to read them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertjax.cli import HelpFormatter

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="bertjax bench", description=__doc__,
                              formatter_class=HelpFormatter)
  p.add_argument("--preset", default="base", help="model preset: tiny mini small medium base large")
  p.add_argument("--batch-size", type=int, default=16, help="global sequences per step")
  p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
  p.add_argument("--num-masked", type=int, default=0,
                 help="masked positions per sequence (default ceil(0.15 * seq-len): 20 at 128)")
  p.add_argument("--vocab-size", type=int, default=30522, help="vocabulary (BERT's: 30522)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="compute dtype; parameters stay float32")
  p.add_argument("--remat", default="none", choices=("none", "full", "dots"))
  p.add_argument("--scan-layers", action="store_true", help="nn.scan over layers (fast compile)")
  p.add_argument("--attention-dropout", type=float, default=0.1,
                 help="BERT's recipe is 0.1; 0 lets attention use jax.nn.dot_product_attention")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps (the first compiles)")
  p.add_argument("--steps", type=int, default=5, help="timed steps; the median is reported")
  p.add_argument("--compare", default="",
                 help="comma-separated peers: hf-torch, hf-torch-compile, hf-flax")
  p.add_argument("--peak-flops", type=float, default=0.0,
                 help="peak FLOP/s of the devices used (default: measured on CPU, published "
                      "dense bf16 peak on known GPUs/TPUs)")
  p.add_argument("--xla-flags", default="",
                 help="extra XLA_FLAGS for this run (set before JAX starts); write it as "
                      "--xla-flags='--xla_cpu_...=...' (with '=' so the value may start with --)")
  p.add_argument("--profile", default="", metavar="DIR",
                 help="also trace two warm steps with jax.profiler into DIR and print where "
                      "the step's time goes, by model op")
  p.add_argument("--profile-top", type=int, default=30, help="rows of the --profile breakdown")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  return p


def _bench_input(argv: list[str]) -> int:
  path = os.path.join(_REPO_ROOT, "experiments", "bench_input.py")
  if not os.path.exists(path):
    print(f"bertjax bench input: {path} not found; it ships in the source tree, not the wheel: "
          "run from a git checkout", file=sys.stderr)
    return 2
  import importlib.util  # a fixed file path, not a name chosen by a string

  mod_spec = importlib.util.spec_from_file_location("bertjax_bench_input", path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  return int(mod.main(argv) or 0)


def main(argv: list[str]) -> int:
  if argv and argv[0] == "input":
    return _bench_input(argv[1:])
  args = _parser().parse_args(argv)
  if args.xla_flags:
    if "jax" in sys.modules:
      print("bertjax bench: --xla-flags must be set before JAX starts; run the command on its "
            "own", file=sys.stderr)
      return 2
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
  from bertjax import bench
  from bertjax import bench_peers

  compare = tuple(c.strip() for c in args.compare.split(",") if c.strip())
  bad = [c for c in compare if c not in bench_peers.PEERS]
  if bad:
    print(f"bertjax bench: --compare {','.join(bad)}: unknown peer; valid: "
          f"{', '.join(bench_peers.PEERS)}", file=sys.stderr)
    return 2
  try:
    spec = bench.BenchSpec(preset=args.preset, batch_size=args.batch_size, seq_len=args.seq_len,
                           num_masked=args.num_masked, vocab_size=args.vocab_size,
                           dtype=args.dtype, remat=args.remat, scan_layers=args.scan_layers,
                           attention_dropout=args.attention_dropout, warmup=args.warmup,
                           steps=args.steps, peak_flops=args.peak_flops)
  except ValueError as e:
    print(f"bertjax bench: {e}", file=sys.stderr)
    return 2
  result = bench.run(spec, compare, repo_root=_REPO_ROOT, profile_dir=args.profile)
  if args.profile:
    prof = result["profile"]
    result["profile"] = {**prof, "ops": prof["ops"][:args.profile_top]}
  print(json.dumps(result) if args.json else bench.format_report(result))
  if args.profile and not args.json:
    print()
    print(bench.format_profile(prof, args.profile_top))
  return 0
