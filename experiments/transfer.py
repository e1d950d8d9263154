r"""Does pretraining transfer? A bag-of-words baseline, random init and a pretrained checkpoint
on one labelled single-sentence task, each at its best learning rate over a small grid.

Purpose: the evidence behind "a bertjax checkpoint helps a downstream task". For the encoder
rows, `bertjax glue --task custom --sweep` runs every learning rate of the grid with every seed;
the row reports the learning rate whose seeds average best on dev, with the mean and standard
deviation over those seeds. Random init uses the checkpoint's own architecture (its whole model
config, BERT's or a modern one: `--init random --preset CHECKPOINT`) and tokenizer, so the only
difference between the two encoder rows is the pretrained weights. The
bag-of-words row (`experiments.bow_baseline`, naive Bayes and logistic regression on unigram
and bigram counts, each tuned on a slice of train) is deterministic: one figure.

Command (after `make demo`, on the bundled task data/movie_snippets):
  python -m experiments.transfer --init runs/demo --out runs/transfer

Writes OUT/results.json and OUT/results.md, and each sweep under OUT/random and OUT/pretrained.
Hardware: 2 CPU cores, about 3 minutes per fine-tuning run of the tiny model (18 runs at the
defaults); `--seeds`, `--learning-rates` and `--epochs` trade time for error bars.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from bertjax import locations
from experiments import bow_baseline

_TASK = locations.DATA_DIR / "movie_snippets"


def _glue(init_args: list[str], args, workdir: pathlib.Path) -> dict:
  """One `bertjax glue --sweep` run; its results entry."""
  from bertjax.commands import glue

  argv = [
      "--task",
      "custom",
      "--name",
      "task",
      "--train",
      str(args.task / "train.tsv"),
      "--dev",
      str(args.task / "dev.tsv"),
      "--text-columns",
      args.text_column,
      "--label-column",
      args.label_column,
      *init_args,
      "--workdir",
      str(workdir),
      "--sweep",
      "--seeds",
      str(args.seeds),
      "--learning-rates",
      args.learning_rates,
      "--epochs",
      str(args.epochs),
      "--no-progress",
      "--pooling",
      args.pooling,
      "--length-bucket",
      str(args.length_bucket),
  ]
  print("transfer: bertjax glue " + " ".join(argv), flush=True)
  t0 = time.perf_counter()
  if glue.main(argv) != 0:
    raise SystemExit(f"transfer: bertjax glue failed for {init_args}")
  entry = json.loads((workdir / "results.json").read_text())["task"]
  sweep = json.loads((workdir / "task" / "sweep.json").read_text())
  by_lr: dict[float, list[float]] = {}
  for row in sweep:
    by_lr.setdefault(row["learning_rate"], []).append(row["accuracy"])
  best_lr = max(by_lr, key=lambda lr: sum(by_lr[lr]) / len(by_lr[lr]))
  return dict(
      accuracy_mean=entry["accuracy_mean"],
      accuracy_std=entry["accuracy_std"],
      seeds=int(entry["accuracy_runs"]),
      learning_rate=best_lr,
      per_learning_rate={f"{lr:g}": v for lr, v in sorted(by_lr.items())},
      minutes=round((time.perf_counter() - t0) / 60, 1),
  )


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument("--init", required=True, help="the pretrained checkpoint (a pretrain workdir)")
  p.add_argument(
      "--task",
      type=pathlib.Path,
      default=_TASK,
      help="directory with train.tsv and dev.tsv (GLUE layout, header row)",
  )
  p.add_argument("--text-column", default="sentence")
  p.add_argument("--label-column", default="label")
  p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/transfer"))
  p.add_argument("--learning-rates", default="3e-3,1e-3,3e-4", help="grid for both encoders")
  p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 at every learning rate")
  p.add_argument("--epochs", type=int, default=3)
  p.add_argument("--pooling", choices=("cls", "mean"), default="cls", help="bertjax glue --pooling")
  p.add_argument("--length-bucket", type=int, default=8, help="bertjax glue --length-bucket")
  args = p.parse_args(argv)

  from bertjax.training import pretrained

  pre = pretrained.load_pretrained(args.init)
  layers, hidden = pre.config.num_layers, pre.config.hidden_size
  # a name for the rows; the random-init row takes the checkpoint's whole config, whatever it is
  preset = next((n for n, shape in _presets().items() if shape == (layers, hidden)), None)
  preset = preset or f"{layers} layers x {hidden}"
  args.out.mkdir(parents=True, exist_ok=True)
  bow = bow_baseline.main(
      [
          "--train",
          str(args.task / "train.tsv"),
          "--dev",
          str(args.task / "dev.tsv"),
          "--text-column",
          args.text_column,
          "--label-column",
          args.label_column,
          "--json",
          str(args.out / "bow.json"),
      ]
  )
  rows = {
      "random": _glue(
          ["--init", "random", "--preset", args.init, "--tokenizer", pre.tokenizer_path],
          args,
          args.out / "random",
      ),
      "pretrained": _glue(["--init", args.init], args, args.out / "pretrained"),
  }
  results = dict(task=str(args.task), init=args.init, preset=preset, bag_of_words=bow, **rows)
  (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
  md = ["| model | dev accuracy | learning rate (best of grid) |", "|---|---|---|"]
  nb, lr = (bow["models"][k]["dev_accuracy"] for k in ("naive_bayes", "logistic_regression"))
  md.append(
      f"| bag of words: naive Bayes {nb:.4f}, logistic regression {lr:.4f} | "
      f"{max(nb, lr):.4f} (the better one) | – |"
  )
  md.append(f"| majority class | {bow['majority_dev_accuracy']:.4f} | – |")
  for name, r in rows.items():
    md.append(
        f"| {preset}, {name} init | {r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} "
        f"({r['seeds']} seeds) | {r['learning_rate']:g} |"
    )
  (args.out / "results.md").write_text("\n".join(md) + "\n")
  print("\n".join(md))
  print(f"transfer: wrote {args.out / 'results.json'} and results.md")
  return 0


def _presets() -> dict[str, tuple[int, int]]:
  from bertjax import model

  return {name: (layers, hidden) for name, (layers, hidden, _) in model.PRESETS.items()}


if __name__ == "__main__":
  sys.exit(main())
