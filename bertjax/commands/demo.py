"""`bertjax demo --workdir runs/demo`: the README's main job, end to end on 2 CPU cores.

1. tokenizer: the committed data/tokenizer.model (or `--train-tokenizer`: a new 8k SentencePiece
   model trained on the bundled corpus into WORKDIR/tokenizer/),
2. data: the bundled corpus (data/austen.txt) prepared into WORKDIR/data/austen with the
   `bertjax prepare` machinery (98% train / 2% held out),
3. pretraining: a tiny BERT (experiments/pretrain.py:demo) for a few minutes, printing the
   MLM loss as it falls and the NSP accuracy, with checkpoints, TensorBoard logs and
   metrics.jsonl in WORKDIR. Rerunning continues from the last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import pathlib


def _summary(workdir: pathlib.Path) -> str:
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines() if l]
  train = [r for r in rows if "mlm_loss" in r]
  evals = [r for r in rows if "eval_mlm_loss" in r]
  lines = []
  if train:
    a, b = train[0], train[-1]
    lines.append(f"MLM loss {a['mlm_loss']:.3f} (step {a['step']}) -> {b['mlm_loss']:.3f} "
                 f"(step {b['step']}); NSP accuracy {b['nsp_accuracy']:.3f} (chance 0.5)")
  if evals:
    e = evals[-1]
    lines.append(f"held-out at step {e['step']}: MLM accuracy {e['eval_mlm_accuracy']:.3f}, "
                 f"MLM perplexity {e['eval_mlm_perplexity']:.1f}, NSP accuracy "
                 f"{e['eval_nsp_accuracy']:.3f}")
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="bertjax demo", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", default="runs/demo", help="output directory (default runs/demo)")
  p.add_argument("--steps", type=int, default=None, help="training steps (default: the demo "
                 "config's)")
  p.add_argument("--train-tokenizer", action="store_true",
                 help="train a new tokenizer on the corpus instead of data/tokenizer.model")
  args = p.parse_args(argv)

  from bertjax import loop

  workdir = pathlib.Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  corpus = loop.REPO_DATA / "austen.txt"
  tokenizer = loop.REPO_DATA / "tokenizer.model"
  if args.train_tokenizer:
    from bertjax import tokenizer as tokenizer_lib

    prefix = workdir / "tokenizer" / "austen"
    if not prefix.with_suffix(".model").exists():
      print(f"demo: training a tokenizer on {corpus.name} -> {prefix}.model", flush=True)
      tokenizer_lib.train_tokenizer([str(corpus)], str(prefix))
    tokenizer = prefix.with_suffix(".model")
  data_dir = workdir / "data" / "austen"
  if not (data_dir / "metadata.json").exists():
    from bertjax.data import prepare

    print(f"demo: preparing {corpus.name} with {tokenizer} -> {data_dir}", flush=True)
    prepare.prepare(prepare.PrepareConfig(output=str(data_dir), tokenizer=str(tokenizer),
                                          inputs=(str(corpus),), num_shards=8,
                                          eval_fraction=0.02, processes=2, progress=False))

  from bertjax.commands import pretrain

  # The same flag parsing as `bertjax pretrain`, so the demo is exactly that command.
  config_file = loop.REPO_DATA.parent / "experiments" / "pretrain.py"
  overrides = [f"--config.data.path={data_dir}"]
  overrides += [f"--config.train.steps={args.steps}"] if args.steps else []
  config = pretrain.parse(["--config", f"{config_file}:demo", *overrides], "bertjax demo").config
  print(f"demo: pretraining a tiny BERT for {config.train.steps} steps "
        f"(`bertjax pretrain --config experiments/pretrain.py:demo --workdir {workdir} "
        f"--config.data.path={data_dir}` is the same run)", flush=True)
  rc = loop.train_and_evaluate(config, str(workdir))
  if (workdir / "metrics.jsonl").exists():
    print(_summary(workdir))
  print(f"checkpoints: {workdir / 'checkpoints'}\n"
        f"TensorBoard: tensorboard --logdir {workdir / 'tensorboard'}\n"
        f"metrics:     {workdir / 'metrics.jsonl'}", flush=True)
  return rc
