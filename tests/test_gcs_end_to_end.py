"""A gs:// run has every feature a local one has: prepare -> pretrain -> resume -> glue, every
path a user passes (corpus, tokenizer, shards, workdir, checkpoints, --init, task TSVs, the
fine-tuning workdir) on a fake bucket (tests/gcs_fake.py), the commands run as a user runs them
(subprocesses, from an empty working directory that must stay empty).

The gs:// run trains 6 steps; with its last checkpoint removed from the bucket, the same
command resumes from step 4 and logs the same losses for steps 5 and 6, bit for bit."""

import csv
import json
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from conftest import REPO, tiny_pretrain_argv

pytestmark = pytest.mark.slow

UPLOAD = r"""
import sys
from etils import epath
for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
  epath.Path(dst).write_bytes(open(src, "rb").read())
"""


def _run(argv, gcs, cwd, timeout=600):
  r = subprocess.run(
      argv, cwd=cwd, env=gcs.environ(), capture_output=True, text=True, timeout=timeout
  )
  assert (
      r.returncode == 0
  ), f"{argv[3:5]} exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  return r.stdout + r.stderr


def _bertjax(*args):
  return [sys.executable, "-m", "bertjax.cli", *args]


def _pretrain(workdir, data, steps):
  return tiny_pretrain_argv(workdir) + [
      f"--config.data.path={data}",
      "--config.data.seq_len=32",
      "--config.data.max_predictions_per_seq=5",
      "--config.data.workers=1",
      "--config.phase2.fraction=0",
      "--config.train.batch_size=16",
      f"--config.train.steps={steps}",
      "--config.train.warmup_steps=2",
      "--config.log_every_steps=1",
      "--config.checkpoint.every_steps=2",
      "--config.eval.every_steps=2",
      "--config.eval.steps=1",
      "--config.eval.batch_size=8",
  ]


def _delete(gcs, name: str) -> None:
  """Delete one object from the fake bucket, as another process (or a lost write) would."""
  quoted = urllib.parse.quote(name, safe="")
  req = urllib.request.Request(
      f"{gcs.emulator_url}/storage/v1/b/{gcs.bucket}/o/{quoted}", method="DELETE"
  )
  urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30).close()
  assert name not in gcs.objects(name)


def _losses(jsonl: str) -> dict:
  rows = [json.loads(l) for l in jsonl.splitlines()]
  steps = [r["step"] for r in rows if "loss" in r]
  assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.long
def test_prepare_pretrain_resume_glue_on_gs(gcs, tmp_path):
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  local = tmp_path / "local"
  local.mkdir()
  # inputs of the user's: a corpus (whole chapters of the bundled text), a tokenizer, a task
  docs = (REPO / "data" / "austen.txt").read_text().split("\n\n")
  (local / "corpus.txt").write_text("\n\n".join(docs[:120]) + "\n")
  rows = list(
      csv.DictReader(
          (REPO / "data" / "movie_snippets" / "train.tsv").open(encoding="utf-8"), delimiter="\t"
      )
  )
  for name, part in (("train.tsv", rows[:96]), ("dev.tsv", rows[96:128])):
    with (local / name).open("w", encoding="utf-8", newline="") as f:
      w = csv.DictWriter(f, ["sentence", "label"], delimiter="\t", extrasaction="ignore")
      w.writeheader()
      w.writerows(part)
  b = gcs.url
  pairs = [
      (local / "corpus.txt", f"{b}/in/corpus.txt"),
      (REPO / "data" / "tokenizer.model", f"{b}/in/tok.model"),
      (local / "train.tsv", f"{b}/task/train.tsv"),
      (local / "dev.tsv", f"{b}/task/dev.tsv"),
  ]
  _run([sys.executable, "-c", UPLOAD, *[str(x) for p in pairs for x in p]], gcs, cwd)

  out = _run(
      _bertjax(
          "prepare",
          "--input",
          f"{b}/in/corpus.txt",
          "--tokenizer",
          f"{b}/in/tok.model",
          "--output",
          f"{b}/shards",
          "--num-shards",
          "2",
          "--eval-fraction",
          "0.1",
          "--processes",
          "1",
          "--no-progress",
      ),
      gcs,
      cwd,
  )
  shards = gcs.objects("shards/")
  assert any(n.endswith(".tfrecord") or "train" in n for n in shards), (shards, out)

  run = f"{b}/run"
  _run(_pretrain(run, f"{b}/shards", 6), gcs, cwd)
  ckpts = {n.split("/")[2] for n in gcs.objects("run/checkpoints/")}
  assert {"2", "4", "6"} <= ckpts, ckpts
  first = _losses(gcs.read("run/metrics.jsonl").decode())
  assert sorted(first) == [1, 2, 3, 4, 5, 6]
  assert any(n.startswith("run/tensorboard/") for n in gcs.objects("run/")), "no TensorBoard events"
  assert json.loads(gcs.read("run/config.json"))["data"]["path"] == f"{b}/shards"
  # killed after step 6 but before its checkpoint landed: the rerun resumes from step 4 on the
  # bucket, drops the logged steps 5-6 and trains them again, to the same losses
  for name in gcs.objects("run/checkpoints/6/"):
    _delete(gcs, name)
  out = _run(_pretrain(run, f"{b}/shards", 6), gcs, cwd)
  assert "resumed from" in out and "checkpoints/4" in out, out[-2000:]
  assert _losses(gcs.read("run/metrics.jsonl").decode()) == first
  assert any(n.startswith("run/checkpoints/6/") for n in gcs.objects("run/checkpoints/"))

  _run(
      _bertjax(
          "glue",
          "--task",
          "custom",
          "--name",
          "snippets",
          "--train",
          f"{b}/task/train.tsv",
          "--dev",
          f"{b}/task/dev.tsv",
          "--text-columns",
          "sentence",
          "--label-column",
          "label",
          "--init",
          run,
          "--workdir",
          f"{b}/ft",
          "--epochs",
          "1",
          "--max-seq-len",
          "64",
          "--no-progress",
      ),
      gcs,
      cwd,
  )
  assert "ft/results.json" in gcs.objects("ft/"), gcs.objects("ft/")
  acc = json.loads(gcs.read("ft/results.json"))["snippets"]["accuracy"]
  assert 0.0 <= acc <= 1.0
  assert list(cwd.iterdir()) == [], "a command wrote into the working directory"
  refused = [l for l in gcs.requests() if l.startswith("refused")]
  assert not refused, refused
