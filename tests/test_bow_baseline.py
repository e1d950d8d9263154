"""The bag-of-words baseline (experiments/bow_baseline.py) and the bundled downstream task
(data/movie_snippets, made by data/make_movie_snippets.py): the baseline learns a separable
task and stays at chance on random labels; the task files are what `bertjax glue --task custom`
reads, without skipped rows, overlap between splits or a missing class."""

import json
import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "data"))

from experiments import bow_baseline  # noqa: E402
from bertjax.tasks.glue import tasks, tsv  # noqa: E402
import make_movie_snippets  # noqa: E402

TASK_DIR = REPO / "data" / "movie_snippets"
SPLITS = ("train", "dev", "test")
FILLER = [f"w{i}" for i in range(200)]


def _texts(rng, n, cue_words=None, cues=None):
  out = []
  for i in range(n):
    words = list(rng.choice(FILLER, size=rng.integers(8, 20)))
    if cue_words is not None:
      words.insert(int(rng.integers(len(words))), str(rng.choice(cue_words[cues[i]])))
    out.append(" ".join(words))
  return out


def test_separable_task_is_learned():
  rng = np.random.default_rng(0)
  cue_words = {0: ["awful", "dull", "tedious", "bad"], 1: ["superb", "moving", "witty", "good"]}
  y_train, y_dev = rng.integers(0, 2, 400), rng.integers(0, 2, 200)
  res = bow_baseline.run(
      _texts(rng, 400, cue_words, y_train),
      y_train,
      _texts(rng, 200, cue_words, y_dev),
      y_dev,
      num_labels=2,
  )
  for name, m in res["models"].items():
    assert m["dev_accuracy"] >= 0.95, (name, m)
  assert res["majority_dev_accuracy"] < 0.6


def test_random_labels_stay_near_chance():
  rng = np.random.default_rng(1)
  y_train, y_dev = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
  res = bow_baseline.run(_texts(rng, 400), y_train, _texts(rng, 400), y_dev, num_labels=2)
  for name, m in res["models"].items():
    assert abs(m["dev_accuracy"] - 0.5) < 0.1, (name, m)


def test_cli_reads_tsv_and_writes_json(tmp_path):
  rng = np.random.default_rng(2)
  cue_words = {0: ["dull"], 1: ["witty"]}
  for split, n in (("train", 200), ("dev", 60)):
    y = rng.integers(0, 2, n)
    rows = [f"{t}\t{'pos' if l else 'neg'}\n" for t, l in zip(_texts(rng, n, cue_words, y), y)]
    (tmp_path / f"{split}.tsv").write_text("text\tstars\n" + "".join(rows))
  out = tmp_path / "res" / "bow.json"
  res = bow_baseline.main(
      [
          "--train",
          str(tmp_path / "train.tsv"),
          "--dev",
          str(tmp_path / "dev.tsv"),
          "--text-column",
          "text",
          "--label-column",
          "stars",
          "--json",
          str(out),
      ]
  )
  saved = json.loads(out.read_text())
  assert saved["labels"] == ["neg", "pos"] and saved["dev_examples"] == 60
  assert saved["mean_dev_accuracy"] == pytest.approx(res["mean_dev_accuracy"])
  assert set(saved["models"]) == {"naive_bayes", "logistic_regression"}
  assert saved["mean_dev_accuracy"] > 0.9


def test_ngrams_are_unigrams_and_bigrams():
  assert bow_baseline.ngrams("Don't go!") == [
      "don't",
      "go",
      "!",
      "<s> don't",
      "don't go",
      "go !",
      "! </s>",
  ]


# --- the bundled task -------------------------------------------------------------------------


def _custom_task():
  p = {s: str(TASK_DIR / f"{s}.tsv") for s in SPLITS}
  labels = tsv.custom_labels(p["train"], ("sentence",), "label")
  return tasks.custom(
      "movie_snippets", p["train"], p["dev"], p["test"], ("sentence",), "label", labels
  )


def test_bundled_task_header_and_rows_parse():
  for s in SPLITS:
    with open(TASK_DIR / f"{s}.tsv", encoding="utf-8", newline="") as f:
      lines = f.read().split("\n")
    assert lines[0] == "sentence\tlabel" and lines[-1] == ""  # header; ends with one newline
    assert all(l.count("\t") == 1 and "\r" not in l for l in lines[:-1])
  task = _custom_task()
  assert task.labels == ("0", "1") and task.metrics == ("accuracy", "f1", "mcc")
  data = tsv.load_task(task, "")
  assert {k: len(v) for k, v in data.items()} == {"train": 4800, "dev": 600, "test": 600}
  for name, ex in data.items():
    assert ex.skipped == [], (name, ex.skipped[:3])
    assert all(t.strip() for t in ex.text_a)
  for name in ("train", "dev"):
    counts = np.bincount(data[name].labels, minlength=2)
    assert counts.min() > 0 and counts[0] == counts[1], (name, counts)  # stratified, balanced
  # The test file keeps its labels too: read as a labelled split, both classes are there.
  test = tsv.load_split(task, tasks.Split("test", task.test[0].tsv, ("", "")), "", True)
  assert test.skipped == [] and set(test.labels.tolist()) == {0, 1}


def test_bundled_task_splits_share_no_text():
  seen = {}
  for s in SPLITS:
    rows, skipped = tsv.read_rows(str(TASK_DIR / f"{s}.tsv"), tsv.Columns(("sentence",), "label"))
    assert not skipped
    keys = [" ".join(r[1][0].lower().split()) for r in rows]
    assert len(set(keys)) == len(keys), f"{s}: duplicate texts"
    for other, other_keys in seen.items():
      assert not set(keys) & other_keys, f"{s} and {other} share texts"
    seen[s] = set(keys)


def test_make_script_band_dedup_and_split(monkeypatch):
  lines = [
      "1\t2.5\tA fine film.",
      "2\t-0.5\tMeh, neutral.",
      "3\t-1.0\tA dull film.",
      "4\t1.2\ta FINE   film.",
      "5\t3.0\tBoth ways.",
      "6\t-3.0\tboth ways.",
  ]
  rows = make_movie_snippets.labelled("\r\n".join(lines).encode("utf-8"))
  # neutral band dropped; case/space duplicates kept once; a text seen with both labels dropped
  assert rows == [("A fine film.", "1"), ("A dull film.", "0")]
  monkeypatch.setattr(make_movie_snippets, "PER_CLASS", 10)
  many = [(f"good {i}", "1") for i in range(12)] + [(f"bad {i}", "0") for i in range(12)]
  out = make_movie_snippets.split(many)
  assert [len(out[s]) for s in SPLITS] == [16, 2, 2]
  assert out == make_movie_snippets.split(list(reversed(many)))  # order-independent
  for s in SPLITS:
    assert {l for _, l in out[s]} == {"0", "1"}
