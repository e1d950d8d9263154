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
import csv
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # `python experiments/ablate.py` as well as `python -m`
from experiments import layers as layers_exp  # noqa: E402
from experiments import modern as modern_exp  # noqa: E402
from experiments import objective as objective_exp  # noqa: E402
from experiments import size as size_exp  # noqa: E402

SWEEPS = ("nsp", "layers", "size", "modern", "wwm", "objective")
SCALES = ("demo", "tiny", "mini", "base")


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str  # directory and row name
  config: str  # --config of `bertjax pretrain`
  settings: dict  # the swept setting(s): CSV columns, table columns, plot x axis
  label: str  # x tick label in the plot
  overrides: tuple[str, ...] = ()  # KEY=VALUE config overrides of this variant, after --set
  # Not pretrained: fine-tuned from random init with the architecture (and tokenizer) of this
  # variant's run with the same seed (`glue --init random --preset RUN`).
  random_init_of: str = ""


# The wwm sweep: the held-out stream masks single tokens (characters) in both arms, so both are
# scored on the same masked positions; only the training stream's masking differs.
WWM_EVAL = "eval.whole_word_mask=false"
WWM_SCALES = ("demo", "tiny")
CHINESE = os.path.join(REPO, "data", "chinese")
# Fine-tuning tasks of the bundled files: `bertjax glue --task custom` with these flags.
CUSTOM_TASKS = {
    "zh_reviews": [
        "--train",
        os.path.join(CHINESE, "reviews", "train.tsv"),
        "--dev",
        os.path.join(CHINESE, "reviews", "dev.tsv"),
        "--text-columns",
        "sentence",
        "--label-column",
        "label",
    ],
    "movie_snippets": [
        "--train",
        os.path.join(REPO, "data", "movie_snippets", "train.tsv"),
        "--dev",
        os.path.join(REPO, "data", "movie_snippets", "dev.tsv"),
        "--text-columns",
        "sentence",
        "--label-column",
        "label",
    ],
}
# The objective sweep's fine-tuning when --glue-flags is not given: the grid of
# experiments.transfer's finding (every encoder's best lr was 1e-3 or 3e-4; 3e-3 diverged).
OBJECTIVE_GLUE_FLAGS = "--sweep --learning-rates 1e-3,3e-4 --epochs 3"
OBJECTIVE_FT_SEEDS = 3  # fine-tuning seeds per pretrained model (random init: 3 per row seed)


def variants(sweep: str, scale: str) -> list[Variant]:
  """The variants of one sweep, in table order."""
  exp = "experiments"
  if sweep == "nsp":
    return [
        Variant("nsp", f"{exp}/pretrain.py:{scale}", {"pair_task": "NSP"}, "MLM + NSP"),
        Variant("no_nsp", f"{exp}/no_nsp.py:{scale}", {"pair_task": "none"}, "No NSP"),
        Variant("sop", f"{exp}/sop.py:{scale}", {"pair_task": "SOP"}, "MLM + SOP"),
    ]
  if sweep == "layers":
    return [
        Variant(f"layers{n}", f"{exp}/layers.py:{scale},layers={n}", {"layers": n}, str(n))
        for n in layers_exp.LAYERS
    ]
  if sweep == "size":
    return [
        Variant(
            f"L{l}_H{h}_A{a}",
            f"{exp}/size.py:{scale},L={l},H={h},A={a}",
            {"L": l, "H": h, "A": a},
            f"{l}/{h}/{a}",
        )
        for l, h, a in size_exp.GRID[scale]
    ]
  if sweep == "modern":
    return [
        Variant(name, f"{exp}/modern.py:{scale},rung={name}", {"rung": i, "change": change}, change)
        for i, (name, (change, _)) in enumerate(modern_exp.RUNGS.items())
    ]
  if sweep == "wwm":
    cfg = f"{exp}/pretrain.py:{scale}"
    return [
        Variant(
            "char",
            cfg,
            {"masking": "character"},
            "character",
            ("data.whole_word_mask=false", WWM_EVAL),
        ),
        Variant(
            "wwm",
            cfg,
            {"masking": "whole word (jieba)"},
            "whole word (jieba)",
            ("data.whole_word_mask=true", WWM_EVAL),
        ),
    ]
  if sweep == "objective":
    out = []
    for block, block_label in (("bert", "BERT"), ("modern", "modern")):
      cfg = f"{exp}/objective.py:{scale},block={block}"
      for objective, label in (("mlm", "MLM"), ("electra", "ELECTRA")):
        settings = {"objective": label, "block": block_label}
        out.append(
            Variant(
                f"{objective}_{block}",
                f"{cfg},objective={objective}",
                settings,
                f"{label}, {block_label}",
            )
        )
      out.append(
          Variant(
              f"random_{block}",
              f"{cfg},objective=mlm",
              {"objective": "none (random init)", "block": block_label},
              f"random init, {block_label}",
              random_init_of=f"mlm_{block}",
          )
      )
    return out
  raise ValueError(f"--sweep {sweep!r}; valid: {', '.join(SWEEPS)}")


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


def read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line:
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill; the rest is still good
          pass
  return rows


def final_eval(workdir: str, steps: int) -> dict | None:
  """The held-out metrics at step `steps`, or None while pretraining is unfinished."""
  rows = [
      r
      for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
      if r.get("step") == steps and "eval_mlm_loss" in r
  ]
  if not rows:
    return None
  r = rows[-1]
  ppl = r.get("eval_mlm_perplexity", math.exp(r["eval_mlm_loss"]))
  return {
      "mlm_perplexity": ppl,
      "mlm_accuracy": r.get("eval_mlm_accuracy"),
      "nsp_accuracy": r.get("eval_nsp_accuracy"),
      # ELECTRA's discriminator on the held-out split (its mlm_* are the generator's)
      "disc_accuracy_replaced": r.get("eval_disc_accuracy_replaced"),
      "disc_accuracy_original": r.get("eval_disc_accuracy_original"),
  }


MODERN_EVALS = 10  # held-out evaluations per run of the modern sweep


def eval_curve(workdir: str, batch: int, seq_len: int) -> list[dict]:
  """The run's held-out evaluations in step order, each with the real (not padding) training
  tokens up to it, from the progress rows' real_token_fraction (logged at every evaluation),
  and elapsed_sec: wall time since the loop started, compilation and evaluations included."""
  # A step's progress row before its evaluation's (the file has them the other way round).
  rows = sorted(
      read_jsonl(os.path.join(workdir, "metrics.jsonl")),
      key=lambda r: (r["step"], "eval_mlm_accuracy" in r),
  )
  curve, tokens, last = [], 0.0, 0
  for r in rows:
    if "real_token_fraction" in r and r["step"] > last:
      tokens += batch * seq_len * r["real_token_fraction"] * (r["step"] - last)
      last = r["step"]
    if "eval_mlm_accuracy" in r:
      curve.append(
          {
              "step": r["step"],
              "tokens": tokens,
              "wall_s": r["elapsed_sec"],
              "mlm_accuracy": r["eval_mlm_accuracy"],
          }
      )
  return curve


def modern_results(workdir: str, scale: str) -> dict:
  """The modern sweep's per-run figures beside final_eval's: the curve (for matched tokens and
  wall time, filled in by `matched`) and the time to target as the loop reported it."""
  seq_len, batch = modern_exp.SCALES[scale]
  curve = eval_curve(workdir, batch, seq_len)
  reached = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "time_to_target" in r]
  hit = reached[-1]["time_to_target"] if reached else None
  out = {
      "_curve": curve,
      "batch_size": batch,
      "seq_len": seq_len,
      "real_mtokens": curve[-1]["tokens"] / 1e6,
      "wall_s": curve[-1]["wall_s"],
  }
  if hit:
    out.update(target_step=hit["step"], target_wall_s=hit["wall_s"])
  return out


def _closest(curve: list[dict], key: str, value: float) -> dict:
  return min(curve, key=lambda p: abs(p[key] - value))


def matched(rows: list[dict]) -> dict:
  """Each modern row's held-out accuracy at the evaluation closest to a common number of real
  training tokens and to a common wall time: the smallest final of all runs (every run has
  been there). Returns those two common points."""
  curves = [r["_curve"] for r in rows if r.get("_curve")]
  if not curves:
    return {}
  tokens = min(c[-1]["tokens"] for c in curves)
  wall = min(c[-1]["wall_s"] for c in curves)
  for r in rows:
    if r.get("_curve"):
      r["acc_at_tokens"] = _closest(r["_curve"], "tokens", tokens)["mlm_accuracy"]
      r["acc_at_wall"] = _closest(r["_curve"], "wall_s", wall)["mlm_accuracy"]
  return {"tokens": tokens, "wall_s": wall}


def task_results(glue_dir: str, task: str) -> dict | None:
  path = os.path.join(glue_dir, task, "results.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    entry = json.load(f).get(task)
  if entry is None:
    return None
  return {f"{task}_{k}": v for k, v in entry.items() if not k.endswith("_runs")}


def pretrain_argv(
    v: Variant, args, workdir: str, data: str, seed: int, steps: int | None = None
) -> list[str]:
  """`bertjax pretrain` of `v` with `seed` for `steps` steps (default --steps)."""
  steps = args.steps if steps is None else steps
  # The config file by absolute path: the sweep may be started from any directory.
  argv = [
      "pretrain",
      "--config",
      os.path.join(REPO, v.config),
      "--workdir",
      workdir,
      f"--config.train.steps={steps}",
      f"--config.seed={seed}",
      f"--config.data.path={data}",
      # resumable mid-variant, without saving every few steps of a short run
      f"--config.checkpoint.every_steps={max(25, steps // 4)}",
  ]
  if args.sweep == "modern":
    every = max(1, steps // MODERN_EVALS)
    argv += [
        # a curve of held-out evaluations: matched tokens and wall time pick points on it
        f"--config.eval.every_steps={every}",
        f"--config.log_every_steps={every}",  # real tokens counted up to each evaluation
        f"--config.train.warmup_steps={max(1, steps // 10)}",  # 10% of any --steps
        f"--config.eval.target_mlm_accuracy={args.target}",
    ]
  else:
    argv += [
        f"--config.eval.every_steps={steps}",  # one evaluation, at the end
        f"--config.log_every_steps={max(1, min(50, steps // 4))}",
    ]
  if args.sweep == "objective":  # every arm warms up over 10% of its own steps
    argv.append(f"--config.train.warmup_steps={max(1, steps // 10)}")
  if args.seq_len:
    # The config's masking rate (BERT's 15%; the demo's 30%), rounded up: 0.15 * 128 -> 20.
    from experiments import pretrain as pretrain_exp

    rate = pretrain_exp.get_config(args.scale).data.mask_prob
    argv += [
        f"--config.data.seq_len={args.seq_len}",
        f"--config.data.max_predictions_per_seq={math.ceil(rate * args.seq_len - 1e-9)}",
    ]
  if args.batch_size:
    argv.append(f"--config.train.batch_size={args.batch_size}")
  return argv + [f"--config.{kv}" for kv in [*args.set, *v.overrides]]


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


def glue_argv(
    task: str, args, init: str, out: str, seed: int, preset: str = "", tokenizer: str = ""
) -> list[str]:
  """`bertjax glue` of one task from `init` (a checkpoint, or "random": the architecture of the
  checkpoint `preset`, the tokenizer `tokenizer`)."""
  if task in CUSTOM_TASKS:  # a bundled task: its files, not --glue-data
    where = ["custom", "--name", task, *CUSTOM_TASKS[task]]
  else:
    where = [task, "--data", args.glue_data]
  flags = shlex.split(args.glue_flags)
  if args.sweep == "objective" and not args.glue_flags:
    flags = shlex.split(OBJECTIVE_GLUE_FLAGS)
    # Random init: each row seed its own fine-tuning seeds (each its own initial weights).
    first = seed * OBJECTIVE_FT_SEEDS if init == "random" else 0
    flags += ["--seeds", ",".join(str(first + i) for i in range(OBJECTIVE_FT_SEEDS))]
  return [
      "glue",
      "--task",
      *where,
      "--init",
      init,
      *(["--preset", preset, "--tokenizer", tokenizer] if init == "random" else []),
      "--workdir",
      out,
      "--seed",
      str(seed),
      "--no-progress",
  ] + flags


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


# ----------------------------------------------------------------------------- reporting

METRIC_NAMES = {
    "mlm_perplexity": "MLM ppl",
    "mlm_accuracy": "MLM acc",
    "nsp_accuracy": "pair acc",
    # the objective sweep's
    "disc_accuracy_replaced": "RTD acc replaced",
    "disc_accuracy_original": "RTD acc original",
    "train_tflops": "train TFLOPs",
    # the modern sweep's
    "acc_at_tokens": "MLM acc @ tokens",
    "acc_at_wall": "MLM acc @ wall",
    "real_mtokens": "real tokens (M)",
    "wall_s": "wall s",
    "target_step": "target step",
    "target_wall_s": "target s",
}
SETTING_NAMES = {
    "pair_task": "Pair task",
    "layers": "#L",
    "L": "#L",
    "H": "#H",
    "A": "#A",
    "masking": "Masking",
    "objective": "Objective",
    "block": "Block",
}


def columns(rows: list[dict], v_list: list[Variant]) -> tuple[list[str], list[str], list[str]]:
  """(setting, pretraining metric, task metric) columns, in a stable order."""
  settings = list(v_list[0].settings)
  fixed = {"variant", *settings, "scale", "steps", "batch_size", "seq_len", "seed", *METRIC_NAMES}
  metrics = [m for m in METRIC_NAMES if any(m in r for r in rows)]
  tasks = sorted({k for r in rows for k in r if k not in fixed and not k.startswith("_")})
  return settings, metrics, tasks


SPREAD_SUFFIXES = ("_mean", "_median", "_std")  # a task's spread over `glue --sweep`'s seeds


def shown_tasks(tasks: list[str]) -> list[str]:
  """The task columns of the table and plot: a metric's mean over the fine-tuning seeds where
  `glue --sweep` gave one (its unsuffixed value is the best run's, an optimistic pick), else
  the metric; medians and stds stay in the CSV."""
  out = []
  for k in tasks:
    if k.endswith(SPREAD_SUFFIXES):
      continue
    out.append(k + "_mean" if k + "_mean" in tasks else k)
  return out


def write_csv(path: str, rows: list[dict], v_list: list[Variant]) -> None:
  settings, metrics, tasks = columns(rows, v_list)
  fields = [
      "variant",
      *settings,
      "scale",
      "steps",
      "batch_size",
      "seq_len",
      "seed",
      *metrics,
      *tasks,
  ]
  with open(path + ".tmp", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for r in rows:
      w.writerow({k: r.get(k, "") for k in fields})
  os.replace(path + ".tmp", path)


def _fmt(x) -> str:
  if x is None or x == "":
    return "-"
  if isinstance(x, float):
    return f"{x:.2f}" if abs(x) >= 10 else f"{x:.4f}"
  return str(x)


def by_variant(rows: list[dict], v_list: list[Variant]) -> list[tuple[Variant, list[dict]]]:
  """The rows of each variant (one per seed), in table order; variants without rows left out."""
  out = [(v, [r for r in rows if r["variant"] == v.name]) for v in v_list]
  return [(v, rs) for v, rs in out if rs]


def spread(rs: list[dict], key: str) -> tuple[float, float, int] | None:
  """(mean, sample std (0 for one seed), n) of `key` over the seeds that have it."""
  vals = [float(r[key]) for r in rs if r.get(key) not in (None, "")]
  if not vals:
    return None
  mean = sum(vals) / len(vals)
  std = (sum((x - mean) ** 2 for x in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
  return mean, std, len(vals)


def _fmt_spread(sp) -> str:
  if sp is None:
    return "-"
  mean, std, n = sp
  return f"{_fmt(mean)} ± {_fmt(std)}" if n > 1 else _fmt(mean)


def _modern_intro(args, points: dict) -> str:
  seq_len, batch = modern_exp.SCALES[args.scale]
  return (
      f"{args.steps} steps of {batch} x {seq_len} per rung (every rung the same steps x "
      f"batch x seq), seeds {','.join(map(str, args.seeds))}; each rung adds one change to "
      "the one above. Every rung is scored on the same held-out examples at 15% masking "
      "(single unpacked segments), mean ± std over seeds. MLM acc / ppl: after the last step. "
      f"@ tokens: at the evaluation closest to {points.get('tokens', 0) / 1e6:.3f}M real "
      "(not padding) training tokens, the fewest any run trained on (packing puts more real "
      "tokens in the same steps). @ wall: at the evaluation closest to "
      f"{points.get('wall_s', 0):.0f} s of wall time (from the loop's start, compilation and "
      "evaluations included), the shortest run. Target: the first evaluation at held-out MLM "
      f"accuracy >= {args.target} (step and wall s, over the seeds that reached it)."
  )


def _objective_intro(args) -> str:
  seq_len, batch = modern_exp.SCALES[args.scale]
  return (
      f"Every pretrained arm gets the model FLOPs of {args.steps} steps of BERT's MLM arm at "
      f"{batch} x {seq_len} (the steps column: each arm's own; ELECTRA's FLOPs count its "
      "generator and sampling), seeds "
      f"{','.join(map(str, args.seeds))}. MLM acc / ppl: held-out, 15% masking, after the last "
      "step (an ELECTRA arm's are its generator's, a quarter of the width); RTD acc: its "
      "discriminator on the held-out replaced and original tokens. Task columns: dev metrics "
      "after fine-tuning at the learning rate whose fine-tuning seeds average best (`_mean`), "
      "then mean ± std over the pretraining seeds; random init: the same architecture, fresh "
      "weights, each row seed its own fine-tuning seeds."
  )


def write_md(
    path: str,
    rows: list[dict],
    v_list: list[Variant],
    args,
    command: str,
    points: dict | None = None,
) -> None:
  settings, metrics, tasks = columns(rows, v_list)
  tasks = shown_tasks(tasks)
  modern = args.sweep == "modern"
  objective = args.sweep == "objective"  # each arm its own steps: shown
  head = (
      [SETTING_NAMES.get(s, s) for s in settings]
      + ["seeds"]
      + (["steps"] if objective else [])
      + [METRIC_NAMES[m] for m in metrics]
      + tasks
      + (["reached target"] if modern else [])
  )
  intro = (
      _modern_intro(args, points or {})
      if modern
      else _objective_intro(args)
      if args.sweep == "objective"
      else f"{args.steps} pretraining steps per run, seq {args.seq_len or 'from the config'}, "
      f"batch {args.batch_size or 'from the config'}, seeds {','.join(map(str, args.seeds))}; "
      "MLM perplexity and pair accuracy on the held-out split after the last step, mean ± "
      "std over seeds; task columns: dev metrics after fine-tuning (`_mean`: the mean over "
      "the fine-tuning seeds of each pretrained model, then mean ± std over its seeds)."
  )
  lines = [
      f"# Ablation `{args.sweep}` at scale `{args.scale}`",
      "",
      intro,
      "",
      f"Command: `{command}`",
      "",
      "| " + " | ".join(head) + " |",
      "|" + "---|" * len(head),
  ]
  for v, rs in by_variant(rows, v_list):
    cells = (
        [_fmt(rs[0].get(s)) for s in settings]
        + [str(len(rs))]
        + ([str(rs[0]["steps"])] if objective else [])
        + [_fmt_spread(spread(rs, k)) for k in metrics + tasks]
    )
    if modern:
      cells.append(f"{sum(r.get('target_step') not in (None, '') for r in rs)}/{len(rs)}")
    lines.append("| " + " | ".join(cells) + " |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def _dots(ax, groups, key, dx, label):
  """Mean ± std over seeds at x + dx, every seed a dot; the top of the highest bar."""
  sps = [(i, spread(rs, key)) for i, (_, rs) in enumerate(groups)]
  sps = [(i, sp) for i, sp in sps if sp]
  if not sps:
    return 0.0
  bars = ax.errorbar(
      [i + dx for i, _ in sps],
      [sp[0] for _, sp in sps],
      yerr=[sp[1] for _, sp in sps],
      marker="o",
      linestyle="none",
      capsize=3,
      label=label,
  )
  for i, (_, rs) in enumerate(groups):
    vals = [float(r[key]) for r in rs if r.get(key) not in (None, "")]
    ax.plot([i + dx] * len(vals), vals, ".", color=bars[0].get_color(), alpha=0.6)
  return max(
      max(sp[0] + sp[1] for _, sp in sps),
      *(float(r[key]) for _, rs in groups for r in rs if r.get(key) not in (None, "")),
  )


def plot_modern(path: str, rows: list[dict], v_list: list[Variant], args) -> None:
  """Held-out MLM accuracy per rung at matched steps, real tokens and wall time (left) and the
  wall time to the target (right): mean ± std over seeds, every seed a dot, y axes from 0."""
  import matplotlib

  matplotlib.use("Agg")  # files only; no display on servers
  import matplotlib.pyplot as plt

  groups = by_variant(rows, v_list)
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
  top = 0.0
  for key, dx, label in (
      ("mlm_accuracy", -0.2, "matched steps (last step)"),
      ("acc_at_tokens", 0.0, "matched real tokens"),
      ("acc_at_wall", 0.2, "matched wall time"),
  ):
    top = max(top, _dots(ax1, groups, key, dx, label))
  ax1.set_ylim(0, top * 1.15 if top else 1)
  ax1.set_ylabel("held-out MLM accuracy at 15% masking")
  ax1.legend(fontsize=8)
  top = _dots(ax2, groups, "target_wall_s", 0.0, None)
  ax2.set_ylim(0, top * 1.15 if top else 1)
  ax2.set_ylabel(f"wall s to held-out MLM acc >= {args.target} (seeds that reached it)")
  for ax in (ax1, ax2):
    ax.set_xticks(range(len(groups)), [v.label for v, _ in groups], rotation=35, ha="right")
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.grid(alpha=0.3)
  seeds = ",".join(map(str, args.seeds))
  fig.suptitle(
      f"BERT -> ModernBERT, one change at a time (cumulative), {args.scale} scale, "
      f"{args.steps} steps, seeds {seeds} (mean ± std)"
  )
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot(path: str, rows: list[dict], v_list: list[Variant], args) -> None:
  """MLM perplexity (left) and task scores (right; the held-out pair-task accuracy when no
  task was fine-tuned) against the swept setting: mean ± std over seeds, every seed as a dot;
  both y axes start at 0, so a gap reads at its true size."""
  import matplotlib

  matplotlib.use("Agg")  # files only; no display on servers
  import matplotlib.pyplot as plt

  _, _, tasks = columns(rows, v_list)
  tasks = shown_tasks(tasks)
  groups = by_variant(rows, v_list)
  x = list(range(len(groups)))
  xlabel = {
      "nsp": "pretraining tasks",
      "layers": "layers L",
      "size": "L / H / A",
      "wwm": "training masking (held out: characters for both)",
      "objective": "pretraining objective, block",
  }[args.sweep]
  # no line between unordered settings
  line = "none" if args.sweep in ("nsp", "wwm", "objective") else "-"
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))

  def draw(ax, key, label=None):
    sps = [spread(rs, key) for _, rs in groups]
    xs = [i for i, sp in zip(x, sps) if sp]
    if not xs:
      return 0.0
    means = [sp[0] for sp in sps if sp]
    errs = [sp[1] for sp in sps if sp]
    bars = ax.errorbar(xs, means, yerr=errs, marker="o", linestyle=line, capsize=4, label=label)
    for i, (_, rs) in zip(x, groups):
      vals = [float(r[key]) for r in rs if r.get(key) not in (None, "")]
      ax.plot([i] * len(vals), vals, ".", color=bars[0].get_color(), alpha=0.5)
    return max(m + e for m, e in zip(means, errs))

  if args.sweep == "wwm":  # both arms scored on the same masked characters
    draw(ax1, "mlm_accuracy")
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("held-out MLM accuracy (characters masked)")
  elif args.sweep == "objective":  # an ELECTRA arm's MLM is its generator's; random: none
    draw(ax1, "mlm_accuracy")
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("held-out MLM accuracy (ELECTRA: its generator)")
  else:
    top = draw(ax1, "mlm_perplexity")
    ax1.set_ylim(0, top * 1.1 if top else 1)
    ax1.set_ylabel("held-out MLM perplexity (lower is better)")
  if tasks:
    for t in tasks:
      draw(ax2, t, t)
    ax2.set_ylabel("dev score")
    ax2.legend(fontsize=8)
  else:  # no fine-tuning: the pretraining pair task (NSP or SOP) on the held-out split
    draw(ax2, "nsp_accuracy")
    ax2.axhline(0.5, color="gray", linestyle="--", linewidth=1)
    ax2.set_ylabel("held-out pair-task accuracy (chance 0.5)")
  ax2.set_ylim(0, 1)
  for ax in (ax1, ax2):
    ax.set_xticks(x, [v.label for v, _ in groups], rotation=20)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
  seeds = ",".join(map(str, args.seeds))
  fig.suptitle(
      f"{args.sweep} ablation, {args.scale} scale, {args.steps} steps, seeds {seeds} "
      "(mean ± std)"
  )
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


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
