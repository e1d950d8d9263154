r"""Ablation runner: pretrain every variant of a sweep, fine-tune each on GLUE, tabulate and plot.

  python -m experiments.ablate --sweep nsp|layers|size|modern|wwm|objective --scale demo|tiny|mini|base \
      --steps N [--seeds 0,1] [--data SHARDS] [--glue-data GLUE_DIR --tasks sst2,...] --out DIR

Sweeps (the BERT paper's ablations, and the modern ladder):
  nsp     MLM + NSP vs MLM only (Table 5) and SOP: experiments/pretrain.py, no_nsp.py, sop.py
  layers  L in {1, 2, 4, 6, 12} at the scale's width: experiments/layers.py
  size    the (L, H, A) grid of Table 6, shrunk for tiny/mini: experiments/size.py
  modern  BERT -> ModernBERT one change at a time, cumulative (experiments/modern.py; scale
          demo or tiny, default demo): held-out MLM accuracy at 15% masking on the same
          examples for every rung, after the last step (matched steps x batch x seq), at
          matched real tokens and at matched wall time, and the time to --target accuracy
  wwm     character masking vs whole-word masking (Cui et al. 2019) on Chinese: both arms read
          the same data, prepared once with a WordPiece vocab and `--word-segmenter jieba`
          (without --data: data/chinese/corpus.txt), and are scored on the same held-out
          masking (single characters); without --tasks, fine-tuned on data/chinese/reviews
          (scale demo or tiny, default demo)
  objective  MLM or ELECTRA's replaced-token detection (Clark et al. 2020), on BERT's block and
          on the modern ladder's best rung (experiments/objective.py), at equal model FLOPs:
          --steps is the BERT MLM arm's, every other arm runs the steps that cost the same
          FLOPs (bertjax.training.flops, ELECTRA's generator and sampling included); beside
          them the same architectures from random init. Without --tasks, fine-tuned on
          data/movie_snippets by `glue --sweep` (3 seeds x lr 1e-3, 3e-4, 3 epochs; the row
          is the lr whose seeds average best). Scale demo or tiny, default demo.

Every variant gets the same data (one prepared copy; the bundled corpus when --data is not
given), the same seeds, batch, steps and sequence length, so the data order is the same and
only the swept setting differs. Each variant runs once per seed (--seeds): the spread over
seeds is what a difference between variants must exceed. Writes, after every run:

  DIR/results.csv   one row per variant and seed: its settings, steps, final held-out MLM
                    perplexity and accuracy, pair-task accuracy, a column per task metric
  DIR/results.md    mean ± std over seeds per variant, in the paper's shape
  DIR/SWEEP.png     MLM perplexity and task scores against the swept setting: the mean with
                    ±1 std error bars and every seed as a dot, axes from 0

Rerunning the same command resumes: finished variants and tasks are read back, a variant whose
pretraining stopped half way resumes from its last checkpoint. DIR/sweep.json records the
sweep's settings; resuming with different ones is refused, so a table never mixes runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import traceback

# `python experiments/ablate.py` as well as `python -m`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import modern as modern_exp  # noqa: E402
from experiments.ablate_report import (  # noqa: E402; the sweep's results and their report
    final_eval,
    matched,
    modern_results,
    plot,
    plot_modern,
    task_results,
    write_csv,
    write_md,
)
from experiments.ablate_variants import (  # noqa: E402; the sweeps and their commands
    CHINESE,
    glue_argv,
    pretrain_argv,
    REPO,
    SCALES,
    SWEEPS,
    Variant,
    variants,
    WWM_SCALES,
)

# ----------------------------------------------------------------------------- running


def run_bertjax(argv: list[str], log: str, isolate: bool) -> int:
  """`bertjax ARGV...`, in this process (fast: one import of jax/TF) or in a child process."""
  print(f"\n$ bertjax {shlex.join(argv)}", flush=True)
  if isolate:
    with open(log, "a") as f:
      proc = subprocess.Popen(
          [sys.executable, "-m", "bertjax.cli", *argv],
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
      )
      for line in proc.stdout:  # echo and keep: the log explains a failure after the fact
        sys.stdout.write(line)
        f.write(line)
      return proc.wait()
  from bertjax import cli

  try:
    return cli.main(list(argv))
  except SystemExit as e:  # argument errors of the subcommands
    print(e, file=sys.stderr)
    return e.code if isinstance(e.code, int) else 2
  except Exception:  # noqa: BLE001 -- report, keep what is done, let a rerun resume
    traceback.print_exc()
    return 1


def step_flops(v: Variant, args, data: str) -> float:
  """Model FLOPs of one pretraining step of `v` as `bertjax pretrain` will run it: its config
  file with --set and its own overrides (parsed as the command line parses them), the data's
  vocabulary, ELECTRA's generator and sampling included (bertjax.training.flops)."""
  from absl import flags
  from ml_collections import config_flags

  from bertjax.training import config_checks, flops, train

  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=fv, lock_config=False)
  fv(
      ["ablate", f"--config={os.path.join(REPO, v.config)}"]
      + [f"--config.{kv}" for kv in [*args.set, *v.overrides]]
  )
  c = fv.config
  c.model.vocab_size = config_checks.read_metadata(data)["tokenizer"]["vocab_size"]
  bert = train.model_config(c)
  return flops.pretraining_flops_per_step(
      bert,
      c.train.batch_size,
      c.data.seq_len,
      c.data.max_predictions_per_seq,
      generator=train.electra_generator_config(c, bert),
  )


def variant_steps(v: Variant, args, data: str) -> int:
  """The pretraining steps of `v`: --steps, except in the objective sweep, where every arm gets
  the model FLOPs of --steps steps of the first arm (BERT's MLM): budget / its FLOPs per step."""
  if args.sweep != "objective" or v.random_init_of:
    return args.steps
  budget = args.steps * step_flops(variants(args.sweep, args.scale)[0], args, data)
  return max(1, round(budget / step_flops(v, args, data)))


def run_variant(v: Variant, args, data: str, seed: int) -> dict:
  """Pretrain and fine-tune one variant with one seed (skipping what is done); its row."""
  vdir = os.path.join(args.out, v.name, f"seed{seed}")
  workdir, glue_dir = os.path.join(vdir, "pretrain"), os.path.join(vdir, "glue")
  os.makedirs(vdir, exist_ok=True)
  steps = variant_steps(v, args, data)
  row = {
      "variant": v.name,
      **v.settings,
      "scale": args.scale,
      "steps": steps,
      "batch_size": args.batch_size or "",
      "seq_len": args.seq_len or "",
      "seed": seed,
  }
  if v.random_init_of:  # the same architecture as that run, fresh weights
    source = os.path.join(args.out, v.random_init_of, f"seed{seed}", "pretrain")
    final = os.path.join(
        source, "checkpoints", str(variant_steps(_variant(v.random_init_of, args), args, data))
    )
    if not os.path.isdir(final):
      raise RuntimeError(
          f"ablate: {v.name}: takes the architecture of {v.random_init_of}, which has no final "
          f"checkpoint at {final}; run that variant first (drop --only, or add it)"
      )
    row["steps"] = 0
    init_args = {"init": "random", "preset": final, "tokenizer": os.path.join(source, "tokenizer")}
  else:
    row.update(pretrain(v, args, data, seed, workdir, vdir, steps))
    # The final checkpoint, by its step: what fine-tuning starts from is unambiguous.
    final_ckpt = os.path.join(workdir, "checkpoints", str(steps))
    init_args = {"init": final_ckpt if os.path.isdir(final_ckpt) else workdir}
  for task in args.tasks:
    res = task_results(glue_dir, task)
    if res is None:
      rc = run_bertjax(
          glue_argv(task, args, out=os.path.join(glue_dir, task), seed=seed, **init_args),
          os.path.join(vdir, f"glue_{task}.log"),
          args.isolate,
      )
      res = task_results(glue_dir, task)
      if rc != 0 or res is None:
        raise RuntimeError(
            f"ablate: {v.name}: fine-tuning on {task} failed (exit {rc}); "
            f"see {os.path.join(glue_dir, task)}"
        )
    row.update(res)
  return row


def _variant(name: str, args) -> Variant:
  return next(v for v in variants(args.sweep, args.scale) if v.name == name)


def pretrain(v: Variant, args, data: str, seed: int, workdir: str, vdir: str, steps: int) -> dict:
  """Pretrain `v` for `steps` steps (resuming; nothing when done); its held-out figures."""
  ev = final_eval(workdir, steps)
  if ev is None:
    state = "resuming" if os.path.isdir(os.path.join(workdir, "checkpoints")) else "starting"
    print(f"ablate: {v.name}: {state} pretraining ({steps} steps)", flush=True)
    t = time.time()
    rc = run_bertjax(
        pretrain_argv(v, args, workdir, data, seed, steps),
        os.path.join(vdir, "pretrain.log"),
        args.isolate,
    )
    ev = final_eval(workdir, steps)
    if rc != 0 or ev is None:
      raise RuntimeError(
          f"ablate: {v.name}: pretraining failed (exit {rc}); see "
          f"{workdir}/metrics.jsonl and the output above. Rerun the same "
          "command to resume."
      )
    print(f"ablate: {v.name}: pretrained in {time.time() - t:.0f}s", flush=True)
  else:
    print(f"ablate: {v.name}: pretraining done, read from {workdir}", flush=True)
  row = {k: val for k, val in ev.items() if val is not None}
  # No pair task; or, in the modern and objective sweeps, held-out rows of single segments
  # (or a pair task in only some arms): not a column.
  if v.settings.get("pair_task") == "none" or args.sweep in ("modern", "objective"):
    row.pop("nsp_accuracy", None)
  if args.sweep == "modern":
    row.update(modern_results(workdir, args.scale))
  if args.sweep == "objective":
    row["train_tflops"] = steps * step_flops(v, args, data) / 1e12
  return row


def prepare_bundled(out: str) -> str:
  """The bundled corpus, prepared once for all variants (same shards, same order)."""
  from bertjax.data import bundled

  return bundled.prepared_dir(out)


def prepare_chinese(out: str, isolate: bool) -> str:
  """data/chinese/corpus.txt, prepared once for both arms of the wwm sweep: a WordPiece
  vocab.txt trained on it (every ideograph an entry, as bert-base-chinese), then `prepare
  --word-segmenter jieba` (5% of documents held out). Reused when already there."""
  data, vocab = os.path.join(out, "data"), os.path.join(out, "vocab")
  if os.path.exists(os.path.join(data, "metadata.json")):
    return data
  corpus = os.path.join(CHINESE, "corpus.txt")
  steps = [
      ["tokenizer", "train", "--kind", "wordpiece", "--input", corpus, "--output", vocab],
      [
          "prepare",
          "--input",
          corpus,
          "--tokenizer",
          os.path.join(vocab, "vocab.txt"),
          "--output",
          data,
          "--word-segmenter",
          "jieba",
          "--num-shards",
          "2",
          "--eval-fraction",
          "0.05",
          "--overwrite",
      ],
  ]
  for argv in steps:
    if os.path.exists(os.path.join(vocab, "vocab.txt")) and argv[0] == "tokenizer":
      continue
    rc = run_bertjax(argv, os.path.join(out, "prepare.log"), isolate)
    if rc != 0:
      raise SystemExit(f"ablate: preparing {corpus} failed (exit {rc}); see the output above")
  return data


def check_segmented(data: str) -> None:
  """The wwm sweep needs data prepared with a word segmenter (else wwm masks characters)."""
  if "://" in data:
    return  # remote: the stream's own check applies
  path = os.path.join(data, "metadata.json")
  try:
    with open(path) as f:
      segmenter = json.load(f).get("word_segmenter")
  except OSError:
    raise SystemExit(f"ablate: --data {data}: no metadata.json; give `bertjax prepare` output")
  if not segmenter:
    raise SystemExit(
        f"ablate: --data {data}: prepared without a word segmenter, so whole-word masking "
        "would mask single characters; prepare it with --word-segmenter jieba"
    )


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog="python -m experiments.ablate",
      description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--sweep", required=True, choices=SWEEPS)
  p.add_argument(
      "--scale",
      default=None,
      choices=SCALES,
      help="experiments/pretrain.py variant (default tiny; modern: demo, or tiny)",
  )
  p.add_argument("--steps", type=int, required=True, help="pretraining steps per variant")
  p.add_argument("--out", required=True, help="output directory; rerun to resume")
  p.add_argument("--data", default=None, help="prepared shards (default: the bundled corpus)")
  p.add_argument("--glue-data", default="tfds", help="GLUE_DIR of TSVs, or 'tfds'")
  p.add_argument("--tasks", default="", help="comma list of GLUE tasks, e.g. sst2,mrpc,qnli")
  p.add_argument("--glue-flags", default="", help="extra `bertjax glue` flags, e.g. '--epochs 1'")
  p.add_argument("--only", default="", help="comma list of variant names to run (default all)")
  p.add_argument(
      "--seeds",
      default="0",
      help="comma list of seeds; every variant runs with " "each (>= 2 give error bars)",
  )
  p.add_argument("--batch-size", type=int, default=0, help="global batch (default: config's)")
  p.add_argument(
      "--seq-len", type=int, default=0, help="pretraining sequence length (default: the config's)"
  )
  p.add_argument(
      "--set",
      action="append",
      default=[],
      metavar="KEY=VALUE",
      help="config override for every variant, e.g. train.learning_rate=1e-3",
  )
  p.add_argument(
      "--target",
      type=float,
      default=None,
      help="modern: held-out MLM accuracy timed to (default experiments/modern.py's "
      f"TARGET_MLM_ACCURACY, {modern_exp.TARGET_MLM_ACCURACY})",
  )
  p.add_argument(
      "--isolate",
      action="store_true",
      help="run each pretrain/glue in its own process (logs in DIR/VARIANT/*.log)",
  )
  args = p.parse_args(argv)
  args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  try:
    args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
  except ValueError:
    p.error(f"--seeds {args.seeds!r}: a comma list of integers, e.g. --seeds 0,1")
  if not args.seeds or len(set(args.seeds)) != len(args.seeds):
    p.error(f"--seeds {args.seeds}: at least one seed, none twice")
  if args.tasks and args.glue_data != "tfds" and not os.path.isdir(args.glue_data):
    p.error(f"--glue-data {args.glue_data}: not a directory (GLUE_DIR with SST-2/, MRPC/, ...)")
  if args.steps < 1:
    p.error("--steps must be >= 1")
  if args.sweep == "modern":
    args.scale = args.scale or "demo"
    if args.scale not in modern_exp.SCALES:
      p.error(f"--scale {args.scale}: the modern sweep runs at {', '.join(modern_exp.SCALES)}")
    if args.seq_len or args.batch_size:
      p.error("--seq-len/--batch-size: the modern sweep's scale fixes them (experiments/modern.py)")
    if args.target is None:
      args.target = modern_exp.TARGET_MLM_ACCURACY
  elif args.target is not None:
    p.error("--target: only the modern sweep times to a target")
  if args.sweep == "wwm":
    args.scale = args.scale or "demo"
    if args.scale not in WWM_SCALES:
      p.error(f"--scale {args.scale}: the wwm sweep runs at {', '.join(WWM_SCALES)}")
    masking = [kv for kv in args.set if kv.split("=")[0].endswith("whole_word_mask")]
    if masking:
      p.error(f"--set {masking[0]}: the wwm sweep sets the masking itself; drop it")
    if not args.tasks and args.glue_data == "tfds":
      args.tasks = ["zh_reviews"]  # data/chinese/reviews
  if args.sweep == "objective":
    args.scale = args.scale or "demo"
    if args.scale not in modern_exp.SCALES:
      p.error(f"--scale {args.scale}: the objective sweep runs at {', '.join(modern_exp.SCALES)}")
    if args.seq_len or args.batch_size:
      p.error(
          "--seq-len/--batch-size: the objective sweep's scale fixes them (experiments/modern.py)"
      )
    if not args.tasks and args.glue_data == "tfds":
      args.tasks = ["movie_snippets"]  # data/movie_snippets
  args.scale = args.scale or "tiny"
  if "://" not in args.out:
    args.out = os.path.abspath(args.out)  # orbax wants absolute checkpoint paths
  return args


def check_resume(args, data: str) -> None:
  """Refuse to mix runs with different settings in one table."""
  settings = {
      k: getattr(args, k)
      for k in (
          "sweep",
          "scale",
          "steps",
          "seeds",
          "batch_size",
          "seq_len",
          "set",
          "glue_data",
          "glue_flags",
          "target",
      )
  }
  settings["data"] = data
  path = os.path.join(args.out, "sweep.json")
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if diff:
      raise SystemExit(
          f"ablate: {path}: this directory holds a sweep with other settings "
          f"(was, now): {diff}; use another --out, or the same arguments to resume"
      )
  with open(path, "w") as f:
    json.dump(settings, f, indent=2)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  command = "python -m experiments.ablate " + shlex.join(sys.argv[1:] if argv is None else argv)
  v_list = variants(args.sweep, args.scale)
  if args.only:
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - {v.name for v in v_list})
    if unknown:
      raise SystemExit(
          f"ablate: --only {unknown}: not in sweep {args.sweep}; valid: "
          f"{', '.join(v.name for v in v_list)}"
      )
    v_list = [v for v in v_list if v.name in names]
  os.makedirs(args.out, exist_ok=True)
  if args.data:
    data = args.data if "://" in args.data else os.path.abspath(args.data)
  elif args.sweep == "wwm":
    data = prepare_chinese(args.out, args.isolate)
  else:
    data = prepare_bundled(args.out)
  if args.sweep == "wwm":
    check_segmented(data)
  check_resume(args, data)
  rows = []
  # Seed by seed: a whole table after the first seed, the spreads as the others finish.
  for v, seed in [(v, seed) for seed in args.seeds for v in v_list]:
    try:
      rows.append(run_variant(v, args, data, seed))
    except RuntimeError as e:
      print(e, file=sys.stderr)
      return 1
    rows.sort(key=lambda r: ([v.name for v in v_list].index(r["variant"]), r["seed"]))
    points = matched(rows) if args.sweep == "modern" else {}  # before the CSV: its columns
    write_csv(os.path.join(args.out, "results.csv"), rows, v_list)
    write_md(os.path.join(args.out, "results.md"), rows, v_list, args, command, points)
    draw = plot_modern if args.sweep == "modern" else plot
    draw(os.path.join(args.out, f"{args.sweep}.png"), rows, v_list, args)
  print(
      f"ablate: {len(rows)} runs ({len(v_list)} variants x {len(args.seeds)} seeds); results in {args.out}/results.csv, results.md and "
      f"{args.sweep}.png"
  )
  with open(os.path.join(args.out, "results.md")) as f:
    print(f.read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
