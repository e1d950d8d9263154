r"""Does pretraining help retrieval? Encoders before and after contrastive training on the
bundled retrieval task's training pairs, scored on its test queries.

Purpose: the evidence behind "MLM (or replaced-token detection) pretraining gives a better
start for an embedding model". Each arm is an encoder: a pretrained checkpoint, or random
init of a preset's shape. Its mean-pooled embeddings are scored before any retrieval training
(`bertjax retrieval`), then it is trained contrastively (`bertjax pretrain --config
contrastive`: InfoNCE over the batch, one hard negative, scale 20) on
`data/austen_retrieval/train_pairs.jsonl` (pairs from the chapters the corpus leaves out) once
per seed, and each trained encoder is scored again. The seed sets the data order (and, for
random init, the weights). Every arm gets the same steps, batch, learning rate and schedule.

Command (after the checkpoints exist; docs/experiments.md gives the commands that made them):
  python -m experiments.retrieval_transfer --arm demo=runs/demo --arm random=random:tiny \
      --seeds 0,1,2 --out runs/retrieval_transfer

Writes OUT/results.json, OUT/results.md and OUT/retrieval_transfer.png (a dot per seed);
each run under OUT/ARM/seedS/ (`run/`, the contrastive workdir, and `retrieval/`) and the
scores before training under OUT/ARM/before/ (the first arm's with BM25 beside, for framing:
`pip install 'bertjax[retrieval]'`). A rerun keeps every finished run and scoring.
Hardware: 2 CPU cores, about 3-4 minutes per tiny-model run at the defaults (126 steps of 64
pairs at 128 tokens) and 15-30 s per scoring.

Expected result: at scale, contrastive training starts from a pretrained encoder (Contriever,
E5, Nomic and ModernBERT's retrieval recipe all do; Izacard et al. 2022 report random init far
behind), so every pretrained arm should end above random init. At the demo's budget the
pretrained encoders did not transfer to classification (docs/experiments.md, "Does
pretraining transfer?"), so here too they may not.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import subprocess
import sys

from bertjax import locations

_TASK = locations.DATA_DIR / "austen_retrieval"
_MEASURES = ("ndcg_at_10", "mrr_at_10", "recall_at_100", "map_at_100")


def _bertjax(*argv: str, log: pathlib.Path) -> None:
  """One `bertjax` command in a child process (a fresh JAX, as a user's), its output in log."""
  log.parent.mkdir(parents=True, exist_ok=True)
  with open(log, "w") as f:
    code = subprocess.call([sys.executable, "-m", "bertjax.cli", *argv], stdout=f, stderr=f)
  if code:
    raise SystemExit(f"retrieval_transfer: `bertjax {' '.join(argv)}` failed: see {log}")


def _score(init_args: list[str], args, out: pathlib.Path) -> dict:
  """`bertjax retrieval` of one encoder (kept if already scored); its four measures, and
  BM25's under "bm25" where it was scored beside (`init_args` with --bm25)."""
  results = out / "results.json"
  if not results.exists():
    _bertjax(
        "retrieval",
        *init_args,
        "--data",
        str(args.task),
        "--workdir",
        str(out),
        "--max-seq-len",
        str(args.seq_len),
        log=out.parent / f"{out.name}.log",
    )
  r = json.loads(results.read_text())
  scores = {k: r[k] for k in _MEASURES}
  if "bm25" in r:
    scores["bm25"] = {k: r["bm25"][k] for k in _MEASURES}
  return scores


def _arm_flags(init: str) -> tuple[list[str], list[str]]:
  """(pretrain flags, retrieval flags) of an arm's encoder before training."""
  if init.startswith("random:"):
    preset = init[len("random:") :]
    # the checkpoints this is compared with train without dropout at this scale
    pretrain = [
        f"--config.model.preset={preset}",
        "--config.model.hidden_dropout_rate=0.0",
        "--config.model.attention_dropout_rate=0.0",
    ]
    return pretrain, ["--init", "random", "--preset", preset]
  return ["--init", init], ["--init", init]


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument(
      "--arm",
      action="append",
      required=True,
      metavar="NAME=INIT",
      help="an encoder: a checkpoint (any --init) or random:PRESET; repeat for each arm",
  )
  p.add_argument("--task", type=pathlib.Path, default=_TASK, help="BEIR-layout task directory")
  p.add_argument("--pairs", type=pathlib.Path, default=None, help="default: TASK/train_pairs.jsonl")
  p.add_argument("--tokenizer", default=str(locations.DATA_DIR / "tokenizer.model"))
  p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/retrieval_transfer"))
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--batch-size", type=int, default=64)
  p.add_argument("--epochs", type=float, default=2.0)
  p.add_argument("--learning-rate", type=float, default=5e-4)
  p.add_argument("--seq-len", type=int, default=128, help="training and scoring length")
  args = p.parse_args(argv)
  arms = {}
  for spec in args.arm:
    name, sep, init = spec.partition("=")
    if not sep or not name or not init:
      p.error(f"--arm {spec!r}: expected NAME=INIT, e.g. demo=runs/demo or random=random:tiny")
    arms[name] = init
  seeds = [int(s) for s in args.seeds.split(",")]
  pairs_file = args.pairs or args.task / "train_pairs.jsonl"

  pairs = args.out / "pairs"
  if not (pairs / "metadata.json").exists():
    _bertjax(
        "prepare",
        "--kind",
        "pairs",
        "--input",
        str(pairs_file),
        "--tokenizer",
        args.tokenizer,
        "--output",
        str(pairs),
        log=args.out / "prepare.log",
    )
  rows = json.loads((pairs / "metadata.json").read_text())["shards"]
  train_rows = sum(s["documents"] for s in rows if s["split"] == "train")
  steps = int(args.epochs * train_rows // args.batch_size)
  warmup = max(1, steps // 10)

  results = dict(
      task=str(args.task),
      pairs=str(pairs_file),
      train_rows=train_rows,
      steps=steps,
      batch_size=args.batch_size,
      learning_rate=args.learning_rate,
      warmup_steps=warmup,
      seq_len=args.seq_len,
      arms={},
  )
  for name, init in arms.items():
    pretrain_flags, score_flags = _arm_flags(init)
    if init.startswith("random:"):
      score_flags += ["--tokenizer", args.tokenizer]
    if "bm25" not in results:  # BM25 on the same queries, for framing: beside the first arm
      score_flags += ["--bm25"]
    arm = {"init": init, "before": _score(score_flags, args, args.out / name / "before")}
    if "bm25" in arm["before"]:
      results["bm25"] = arm["before"].pop("bm25")
    arm["after"] = {}
    for seed in seeds:
      run = args.out / name / f"seed{seed}" / "run"
      if not (run / "checkpoints").exists() or not _finished(run, steps):
        print(f"retrieval_transfer: {name}, seed {seed}: {steps} contrastive steps", flush=True)
        _bertjax(
            "pretrain",
            "--config",
            "contrastive",
            *pretrain_flags,
            f"--config.data.path={pairs}",
            f"--workdir={run}",
            f"--config.seed={seed}",
            f"--config.data.seq_len={args.seq_len}",
            f"--config.train.batch_size={args.batch_size}",
            f"--config.train.steps={steps}",
            f"--config.train.warmup_steps={warmup}",
            f"--config.train.learning_rate={args.learning_rate}",
            log=run.parent / "run.log",
        )
      arm["after"][seed] = _score(["--init", str(run)], args, run.parent / "retrieval")
      print(f"retrieval_transfer: {name}, seed {seed}: {arm['after'][seed]}", flush=True)
    results["arms"][name] = arm

  (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
  md = _table(results)
  (args.out / "results.md").write_text(md)
  _plot(results, args.out / "retrieval_transfer.png")
  print(md, end="")
  print(
      f"retrieval_transfer: wrote {args.out / 'results.json'}, results.md, retrieval_transfer.png"
  )
  return 0


def _finished(run: pathlib.Path, steps: int) -> bool:
  done = [int(d.name) for d in (run / "checkpoints").iterdir() if d.name.isdigit()]
  return bool(done) and max(done) >= steps


def _mean_std(values: list[float]) -> str:
  std = statistics.stdev(values) if len(values) > 1 else math.nan
  return f"{statistics.mean(values):.4f} ± {std:.4f}"


def _table(results: dict) -> str:
  md = [
      "| arm | nDCG@10 before | nDCG@10 after (mean ± sd) | each seed | Recall@100 before → after |",
      "|---|---:|---:|---|---|",
  ]
  for name, arm in results["arms"].items():
    after = [r["ndcg_at_10"] for r in arm["after"].values()]
    recall = [r["recall_at_100"] for r in arm["after"].values()]
    md.append(
        f"| {name} (`{arm['init']}`) | {arm['before']['ndcg_at_10']:.4f} | {_mean_std(after)} | "
        f"{', '.join(f'{v:.4f}' for v in after)} | {arm['before']['recall_at_100']:.4f} → "
        f"{statistics.mean(recall):.4f} |"
    )
  if "bm25" in results:
    bm25 = results["bm25"]
    md.append(
        f"| BM25 (bm25s defaults), for framing | {bm25['ndcg_at_10']:.4f} | – | – | "
        f"{bm25['recall_at_100']:.4f} |"
    )
  return "\n".join(md) + "\n"


def _plot(results: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")  # files only; no display on servers
  import matplotlib.pyplot as plt

  names = list(results["arms"])
  fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 3.6))
  for i, name in enumerate(names):
    arm = results["arms"][name]
    after = [r["ndcg_at_10"] for r in arm["after"].values()]
    ax.scatter([i + 0.1] * len(after), after, color="C0", label="after" if i == 0 else None)
    ax.scatter(
        [i - 0.1],
        [arm["before"]["ndcg_at_10"]],
        color="C1",
        marker="x",
        label="before" if i == 0 else None,
    )
  if "bm25" in results:
    ax.axhline(results["bm25"]["ndcg_at_10"], color="gray", linestyle="--", label="BM25")
  ax.set_xticks(range(len(names)), names)
  ax.set_ylabel("nDCG@10, bundled task")
  ax.set_title(
      f"contrastive training: {results['steps']} steps x {results['batch_size']} pairs "
      f"(a dot per seed)",
      fontsize=9,
  )
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  sys.exit(main())
