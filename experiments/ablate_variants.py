"""The ablation sweeps' variants and the commands that run them (`experiments/ablate.py`).

`variants(sweep, scale)` lists a sweep's variants; `pretrain_argv` and `glue_argv` are the
`bertjax pretrain` and `bertjax glue` command lines of one variant.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex

from experiments import layers as layers_exp
from experiments import modern as modern_exp
from experiments import size as size_exp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


MODERN_EVALS = 10  # held-out evaluations per run of the modern sweep


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
