"""What a new user runs: their own corpus and task, the README's commands, the defaults.

The corpus (Tang poems, tests/fixtures/data/tang300.txt) and the task (does a verse have
five or seven characters per clause?) are used by no other test. Every command runs as a
subprocess from a working directory outside the repository with relative paths only, with
no flag beyond the required ones except those that keep the runs short (steps, epochs).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
POEMS = REPO / "tests" / "fixtures" / "data" / "tang300.txt"


def _bertjax(cwd: pathlib.Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one CPU device, as on a user's machine
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.cli", *args],
      cwd=cwd,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert (
      proc.returncode == 0
  ), f"bertjax {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
  return proc


def _verse_task(out: pathlib.Path) -> None:
  """A GLUE-layout single-sentence task: label 1 for seven-character clauses, 0 for five."""
  rows = []
  for line in POEMS.read_text(encoding="utf-8").splitlines():
    clauses = [c for c in re.split(r"[，。？！；]", line) if c]
    if clauses and all(len(c) == len(clauses[0]) for c in clauses) and len(clauses[0]) in (5, 7):
      rows.append((line, int(len(clauses[0]) == 7)))
  random.Random(0).shuffle(rows)
  out.mkdir(parents=True)
  for name, part in (("train", rows[:400]), ("dev", rows[400:500])):
    with open(out / f"{name}.tsv", "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in part))


@pytest.mark.long
@pytest.mark.slow
def test_corpus_to_task_with_relative_paths_from_another_directory(tmp_path):
  user = tmp_path / "user"
  (user / "corpus").mkdir(parents=True)
  (user / "corpus" / "poems.txt").write_text(POEMS.read_text(encoding="utf-8"), encoding="utf-8")
  _verse_task(user / "verses")
  config = os.path.relpath(REPO / "experiments" / "pretrain.py", user)

  tok = _bertjax(user, "tokenizer", "train", "--input", "corpus/*.txt", "--output", "tok/zh")
  assert (user / "tok" / "zh.model").is_file(), tok.stdout

  _bertjax(
      user,
      "prepare",
      "--input",
      "corpus/*.txt",
      "--tokenizer",
      "tok/zh.model",
      "--output",
      "shards",
      "--no-progress",
  )
  meta = json.loads((user / "shards" / "metadata.json").read_text())
  splits = {s["split"] for s in meta["shards"]}
  assert splits == {"train", "eval"}, meta["shards"]  # a held-out split by default
  assert all(s["documents"] > 0 for s in meta["shards"])  # and no empty shard
  assert all((user / "shards" / s["file"]).is_file() for s in meta["shards"])

  preview = _bertjax(user, "data", "preview", "--data", "shards", "-n", "2")
  assert "[MASK]" in preview.stdout
  stats = _bertjax(user, "data", "stats", "--data", "shards", "--n", "64")
  assert 0.1 < json.loads(stats.stdout.strip().splitlines()[-1])["masked_fraction"] < 0.2

  pre = _bertjax(
      user,
      "pretrain",
      "--config",
      f"{config}:tiny",
      "--workdir",
      "run",
      "--config.data.path=shards",
      "--config.train.steps=30",
      "--config.eval.every_steps=30",
      "--config.eval.steps=2",
  )
  rows = [json.loads(l) for l in (user / "run" / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in rows if "eval_mask_accuracy" in r]
  assert evals and evals[-1]["step"] == 30, rows[-3:]
  assert 0 < evals[-1]["eval_mask_constant_accuracy"] < 1
  assert "Traceback" not in pre.stderr and "cuda drivers" not in pre.stderr

  ft = _bertjax(
      user,
      "glue",
      "--task",
      "custom",
      "--name",
      "verses",
      "--train",
      "verses/train.tsv",
      "--dev",
      "verses/dev.tsv",
      "--text-columns",
      "sentence",
      "--label-column",
      "label",
      "--init",
      "run",
      "--workdir",
      "ft",
      "--epochs",
      "1",
  )
  assert re.search(r"learning rate 0\.001 \(for hidden size 128", ft.stdout), ft.stdout
  results = json.loads((user / "ft" / "results.json").read_text())
  assert 0.0 <= results["verses"]["accuracy"] <= 1.0, results

  _bertjax(user, "convert", "--from", "bertjax", "run", "--to", "hf", "hf")
  assert (user / "hf" / "config.json").is_file()
  assert (user / "hf" / "tokenizer.model").is_file()

  (user / "lines.txt").write_text("床前明月光\n举头望明月 ||| 低头思故乡\n", encoding="utf-8")
  _bertjax(user, "extract", "--init", "run", "--input", "lines.txt", "--output", "feats.jsonl")
  feats = [json.loads(l) for l in (user / "feats.jsonl").read_text().splitlines()]
  assert len(feats) == 2 and feats[0]["features"][0]["token"] == "[CLS]"
  fixtures = REPO / "tests" / "fixtures"
  (user / "ner").mkdir()
  (user / "ner" / "train.txt").write_text((fixtures / "ner" / "train.txt").read_text())
  _bertjax(
      user,
      "ner",
      "--init",
      "run",
      "--train",
      "ner/train.txt",
      "--dev",
      "ner/train.txt",
      "--workdir",
      "ner_out",
      "--epochs",
      "1",
      "--no-progress",
  )
  assert (user / "ner_out" / "results.json").is_file()
  (user / "squad").mkdir()
  (user / "squad" / "train.json").write_text((fixtures / "squad" / "train-v1.1.json").read_text())
  _bertjax(
      user,
      "squad",
      "--init",
      "run",
      "--train",
      "squad/train.json",
      "--dev",
      "squad/train.json",
      "--version",
      "1.1",
      "--workdir",
      "squad_out",
      "--epochs",
      "1",
      "--no-progress",
  )
  assert (user / "squad_out" / "predictions.json").is_file()

  # The converted model restores too (relative path, Hugging Face layout).
  _bertjax(user, "extract", "--init", "hf", "--input", "lines.txt", "--output", "hf.jsonl")
  hf = [json.loads(l) for l in (user / "hf.jsonl").read_text().splitlines()]
  a = hf[0]["features"][1]["layers"][0]["values"]
  b = feats[0]["features"][1]["layers"][0]["values"]
  assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
