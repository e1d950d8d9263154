"""What `bertjax glue` writes: leaderboard submission files, results.json and a Markdown table.

Submission files are what gluebenchmark.com accepts in its zip: one `<Name>.tsv` per test set
(`CoLA.tsv`, `SST-2.tsv`, `MRPC.tsv`, `STS-B.tsv`, `QQP.tsv`, `MNLI-m.tsv`, `MNLI-mm.tsv`,
`QNLI.tsv`, `RTE.tsv`, `WNLI.tsv`, `AX.tsv`), header `index<TAB>prediction`, one row per test
example in file order. Labels are written as the leaderboard expects them: 0/1 for CoLA,
SST-2, MRPC, QQP and WNLI; entailment/neutral/contradiction for MNLI and AX;
entailment/not_entailment for QNLI and RTE; a score in [0, 5] with 3 decimals for STS-B.

CLUE's leaderboard takes one JSON-lines file per test set, one line {"id": ID, "label": LABEL}
per test example in file order, ID as the test file has it and LABEL a string of the task's
label list: `afqmc_predict.json`, `tnews11_predict.json` (and `tnews10_predict.json` for the 1.0
test set), `iflytek_predict.json`, `cmnli_predict.json`, `ocnli_50k_predict.json`,
`csl_predict.json`, `cluewsc11_predict.json` (and `cluewsc10_predict.json`); a custom JSON-lines
task writes `<name>_predict.json` alike.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from bertjax.runtime import fs
from bertjax.tasks import files
from bertjax.tasks.glue import tasks

SUBMISSION_HEADER = "index\tprediction"


def format_label(task: tasks.Task, pred) -> str:
  if task.is_regression:
    # The GLUE STS-B scale is 0-5; a regression head can overshoot it.
    value = float(np.clip(pred, 0.0, 5.0)) if task.name == "stsb" else float(pred)
    return f"{value:.3f}"
  return task.labels[int(pred)]


def file_name(task: tasks.Task, split: tasks.Split) -> str:
  """The submission file of a test split: `MNLI-m.tsv`, `tnews11_predict.json`."""
  return f"{split.submission}.json" if task.format == "jsonl" else f"{split.submission}.tsv"


def check_jsonl_submission(
    task: tasks.Task, split: tasks.Split, index: Sequence, lines: Sequence[str]
) -> None:
  """Raise ValueError unless `lines` are one JSON object {"id", "label"} per test example, in
  the test file's order, each label one the leaderboard takes."""
  name = file_name(task, split)
  if not index:
    raise ValueError(f"{name}: no test rows; refusing to write an empty submission")
  if len(lines) != len(index):
    raise ValueError(f"{name}: {len(index)} test rows but {len(lines)} predictions")
  for k, (want, line) in enumerate(zip(index, lines)):
    got = json.loads(line)
    if set(got) != {"id", "label"} or got["id"] != want or isinstance(got["id"], bool):
      raise ValueError(f"{name}: line {k + 1} is {line!r}, expected the test id {want!r}")
    ok = np.isfinite(float(got["label"])) if task.is_regression else got["label"] in task.labels
    if not ok:
      raise ValueError(
          f"{name}: line {k + 1} (id {want}): label {got['label']!r} is not one the "
          "leaderboard takes"
      )


def check_submission(
    task: tasks.Task, split: tasks.Split, index: Sequence[str], lines: Sequence[str]
) -> None:
  """Raise ValueError unless `lines` are the leaderboard's header and then one row
  `id<TAB>label` per test row, in the test file's order, with a label the leaderboard takes."""
  name = split.submission
  if not index:
    raise ValueError(f"{name}: no test rows; refusing to write an empty submission")
  if not lines or lines[0] != SUBMISSION_HEADER:
    raise ValueError(f"{name}: the header must be {SUBMISSION_HEADER!r}")
  if len(lines) - 1 != len(index):
    raise ValueError(f"{name}: {len(index)} test rows but {len(lines) - 1} predictions")
  for k, (want, line) in enumerate(zip(index, lines[1:])):
    fields = line.split("\t")
    if len(fields) != 2 or fields[0] != want:
      raise ValueError(f"{name}: row {k + 1} is {line!r}, expected test row id {want!r} first")
    ok = np.isfinite(float(fields[1])) if task.is_regression else fields[1] in task.labels
    if not ok:
      raise ValueError(
          f"{name}: row {k + 1} (id {want}): prediction {fields[1]!r} is not a "
          "label the leaderboard takes"
      )


def write_submission(
    task: tasks.Task, split: tasks.Split, index: Sequence[str], preds: np.ndarray, out_dir: str
) -> str:
  """OUT/submission/<Name>.tsv (CLUE: <name>_predict.json) for one test split; returns its path.

  `index` is the id of every test row, in file order. The file is written only once
  `check_submission` passes (the leaderboard rejects an incomplete file), and atomically: a
  refused or interrupted write leaves no partial file.
  """
  if len(index) != len(preds):
    raise ValueError(f"{split.submission}: {len(index)} test rows but {len(preds)} predictions")
  if task.format == "jsonl":
    lines = [
        json.dumps({"id": i, "label": format_label(task, p)}, ensure_ascii=False)
        for i, p in zip(index, preds)
    ]
    check_jsonl_submission(task, split, index, lines)
  else:
    lines = [SUBMISSION_HEADER] + [f"{i}\t{format_label(task, p)}" for i, p in zip(index, preds)]
    check_submission(task, split, index, lines)
  sub_dir = files.join(out_dir, "submission")
  fs.path(sub_dir).mkdir(parents=True, exist_ok=True)
  path = files.join(sub_dir, file_name(task, split))
  fs.write_atomic(path, ("\n".join(lines) + "\n").encode("utf-8"))
  return path


def read_results(out_dir: str) -> dict:
  path = fs.path(out_dir) / "results.json"
  if not path.is_file():
    return {}
  return json.loads(path.read_text())


def write_results(
    out_dir: str, results: dict[str, dict[str, float]], sweep: dict[str, dict] | None = None
) -> tuple[str, str]:
  """Merge `results` (task -> metric -> value) into OUT/results.json and rewrite
  OUT/results.md from everything there, so tasks run one at a time add up."""
  merged = read_results(out_dir)
  merged.update(results)
  fs.path(out_dir).mkdir(parents=True, exist_ok=True)
  json_path = files.join(out_dir, "results.json")
  fs.path(json_path).write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
  md_path = files.join(out_dir, "results.md")
  fs.path(md_path).write_text(markdown_table(merged) + "\n")
  return json_path, md_path


def _order(task: str) -> tuple[int, str]:
  names = list(tasks.ALL) + list(tasks.CLUE_ALL)
  return (names.index(task) if task in names else len(names), task)


def markdown_table(results: dict[str, dict[str, float]]) -> str:
  """One row per task and metric: the best run on dev (marked so: picking it on dev flatters
  it) and, with a sweep (`<m>_median`/`_mean`/`_std`/`_runs` beside `<m>`), the median and
  mean ± std over the seeds."""
  lines = [
      "| Task | Metric | Best on dev | Median over seeds | Mean ± std over seeds |",
      "|---|---|---:|---:|---:|",
  ]
  for task in sorted(results, key=_order):
    row = results[task]
    known = tasks.ALL_TASKS[task].metrics if task in tasks.ALL_TASKS else ()
    names = [k for k in row if not k.endswith(_SPREAD)]
    for m in sorted(names, key=lambda k: (known.index(k) if k in known else len(known), k)):
      median = f"{100 * row[m + '_median']:.1f}" if f"{m}_median" in row else ""
      spread = ""
      if f"{m}_mean" in row:
        spread = (
            f"{100 * row[m + '_mean']:.1f} ± {100 * row[m + '_std']:.1f} "
            f"(n={int(row.get(m + '_runs', 0))})"
        )
      lines.append(f"| {task} | {m} | {100 * row[m]:.1f} | {median} | {spread} |")
  return "\n".join(lines)


_SPREAD = ("_median", "_mean", "_std", "_runs")  # suffixes of the over-seeds summaries
