"""The ablation sweeps' results (`experiments/ablate.py`): what each run left, read back, and
the table, CSV and plots written from them.
"""

from __future__ import annotations

import csv
import json
import math
import os

from experiments import modern as modern_exp
from experiments.ablate_variants import Variant


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
