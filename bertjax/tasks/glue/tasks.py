"""The GLUE and CLUE task registries: files, columns, label lists, metrics and submission names.

Class ids follow TFDS `glue/<task>` (`ClassLabel` order), so a model trained on TSV data and one
trained on TFDS data agree. `labels[i]` is how class i is written in the GLUE TSVs, and also how
the leaderboard wants it in a submission file (0/1 for CoLA, SST-2, MRPC, QQP and WNLI; words
for the NLI tasks; a float for STS-B).

CLUE's classification tasks (`CLUE`) are JSON lines (`train.json`, `dev.json`, `test.json`, one
object a line, as CLUE distributes them) read by `jsonl`; their class ids follow the label
lists of CLUE's baselines (`get_labels` in baselines/models/classifier_utils.py), which are
also the label strings the leaderboard takes. Every CLUE task is scored by accuracy.
"""

from __future__ import annotations

import dataclasses

from bertjax import errors


class GlueDataError(errors.UserError, ValueError):
  """A GLUE file that is missing or unusable as a whole; the message names it."""


@dataclasses.dataclass(frozen=True)
class Split:
  """One evaluation or test file of a task."""

  name: str  # key in Examples dicts: "dev", "dev_matched", "test", "ax", ...
  tsv: str  # path under the data directory (GLUE_DIR/SST-2/train.tsv; CLUE: train.json)
  tfds: tuple[str, str]  # (TFDS dataset name, split name)
  metric_prefix: str = ""  # MNLI: "matched_" / "mismatched_" in results.json
  # test splits: leaderboard file stem ("MNLI-m", "AX", ...; CLUE: "tnews11_predict", ...)
  submission: str | None = None


@dataclasses.dataclass(frozen=True)
class Task:
  """Everything that differs between tasks; the fine-tuning code reads nothing else."""

  name: str  # command-line name and results.json key
  text_columns: tuple[str, ...]  # TSV header names of segment A (and B)
  tfds_features: tuple[str, ...]  # the same texts in TFDS glue/<task>
  label_column: str | None  # TSV header name of the gold label
  labels: tuple[str, ...] | None  # class id -> label string; None means regression
  metrics: tuple[str, ...]  # metric names, computed by metrics.compute
  main_metric: str  # picks the best epoch and the best run of a sweep
  train: Split
  dev: tuple[Split, ...]
  test: tuple[Split, ...]
  index_column: str | None = "index"  # test-file column with the leaderboard's row ids
  # CoLA's train/dev files have no header: (label position, sentence position).
  headerless_positions: tuple[int, int] | None = None
  format: str = "tsv"  # "tsv" (GLUE's files) or "jsonl" (CLUE's: one JSON object a line)
  # How a JSON record becomes its text: None reads `text_columns`; "wsc" marks CLUEWSC2020's
  # two spans in its "text" (`jsonl.wsc_text`).
  text_builder: str | None = None

  @property
  def num_labels(self) -> int:
    return 1 if self.labels is None else len(self.labels)

  @property
  def is_regression(self) -> bool:
    return self.labels is None

  @property
  def is_pair(self) -> bool:
    return len(self.text_columns) == 2


def _splits(glue_dir: str, tfds_name: str, submission: str) -> tuple[Split, tuple, tuple]:
  return (
      Split("train", f"{glue_dir}/train.tsv", (tfds_name, "train")),
      (Split("dev", f"{glue_dir}/dev.tsv", (tfds_name, "validation")),),
      (Split("test", f"{glue_dir}/test.tsv", (tfds_name, "test"), submission=submission),),
  )


_BINARY = ("0", "1")
_NLI3 = ("entailment", "neutral", "contradiction")
_NLI2 = ("entailment", "not_entailment")


def _mnli() -> Task:
  m = "glue/mnli"
  return Task(
      name="mnli",
      text_columns=("sentence1", "sentence2"),
      tfds_features=("premise", "hypothesis"),
      label_column="gold_label",
      labels=_NLI3,
      metrics=("matched_accuracy", "mismatched_accuracy"),
      main_metric="matched_accuracy",
      train=Split("train", "MNLI/train.tsv", (m, "train")),
      dev=(
          Split("dev_matched", "MNLI/dev_matched.tsv", (m, "validation_matched"), "matched_"),
          Split(
              "dev_mismatched",
              "MNLI/dev_mismatched.tsv",
              (m, "validation_mismatched"),
              "mismatched_",
          ),
      ),
      # The AX diagnostic has no training data: the MNLI model predicts it.
      test=(
          Split("test_matched", "MNLI/test_matched.tsv", (m, "test_matched"), submission="MNLI-m"),
          Split(
              "test_mismatched",
              "MNLI/test_mismatched.tsv",
              (m, "test_mismatched"),
              submission="MNLI-mm",
          ),
          Split("ax", "diagnostic/diagnostic.tsv", ("glue/ax", "test"), submission="AX"),
      ),
  )


def _simple(
    name: str,
    glue_dir: str,
    submission: str,
    text_columns,
    tfds_features,
    label_column,
    labels,
    metrics,
    main_metric,
    **kw,
) -> Task:
  train, dev, test = _splits(glue_dir, f"glue/{name}", submission)
  return Task(
      name=name,
      text_columns=text_columns,
      tfds_features=tfds_features,
      label_column=label_column,
      labels=labels,
      metrics=metrics,
      main_metric=main_metric,
      train=train,
      dev=dev,
      test=test,
      **kw,
  )


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        _simple(
            "cola",
            "CoLA",
            "CoLA",
            ("sentence",),
            ("sentence",),
            None,
            _BINARY,
            ("mcc", "accuracy"),
            "mcc",
            headerless_positions=(1, 3),
        ),
        _simple(
            "sst2",
            "SST-2",
            "SST-2",
            ("sentence",),
            ("sentence",),
            "label",
            _BINARY,
            ("accuracy",),
            "accuracy",
        ),
        _simple(
            "mrpc",
            "MRPC",
            "MRPC",
            ("#1 String", "#2 String"),
            ("sentence1", "sentence2"),
            "Quality",
            _BINARY,
            ("f1", "accuracy"),
            "f1",
        ),
        _simple(
            "stsb",
            "STS-B",
            "STS-B",
            ("sentence1", "sentence2"),
            ("sentence1", "sentence2"),
            "score",
            None,
            ("pearson", "spearman"),
            "spearman",
        ),
        _simple(
            "qqp",
            "QQP",
            "QQP",
            ("question1", "question2"),
            ("question1", "question2"),
            "is_duplicate",
            _BINARY,
            ("f1", "accuracy"),
            "f1",
            index_column="id",
        ),
        _mnli(),
        _simple(
            "qnli",
            "QNLI",
            "QNLI",
            ("question", "sentence"),
            ("question", "sentence"),
            "label",
            _NLI2,
            ("accuracy",),
            "accuracy",
        ),
        _simple(
            "rte",
            "RTE",
            "RTE",
            ("sentence1", "sentence2"),
            ("sentence1", "sentence2"),
            "label",
            _NLI2,
            ("accuracy",),
            "accuracy",
        ),
        _simple(
            "wnli",
            "WNLI",
            "WNLI",
            ("sentence1", "sentence2"),
            ("sentence1", "sentence2"),
            "label",
            _BINARY,
            ("accuracy",),
            "accuracy",
        ),
    )
}

# `--task all`: every GLUE task; AX comes with MNLI.
ALL = tuple(TASKS)


# ------------------------------------------------------------------------------------- CLUE


def _clue(
    name: str,
    text_columns: tuple[str, ...],
    labels: tuple[str, ...],
    submission: str,
    test_10: str | None = None,
    **kw,
) -> Task:
  """A CLUE classification task over DIR/train.json, dev.json and test.json (and, for the
  tasks CLUE 1.1 revised, the 1.0 test set test1.0.json with its own submission file)."""
  tests = [Split("test", "test.json", ("", ""), submission=submission)]
  if test_10:
    tests.append(Split("test1.0", "test1.0.json", ("", ""), submission=test_10))
  return Task(
      name=name,
      text_columns=text_columns,
      tfds_features=text_columns,
      label_column="label",
      labels=labels,
      metrics=("accuracy",),
      main_metric="accuracy",
      train=Split("train", "train.json", ("", "")),
      dev=(Split("dev", "dev.json", ("", "")),),
      test=tuple(tests),
      index_column="id",
      format="jsonl",
      **kw,
  )


# TNEWS: the 15 news categories 100..116 without 105 and 111 (CLUE's numbering).
_TNEWS = tuple(str(100 + i) for i in range(17) if i not in (5, 11))
_CLUE_NLI = ("contradiction", "entailment", "neutral")  # CLUE's CMNLI/OCNLI label order

# Submission file stems are those of the CLUE 1.1 leaderboard's submission zip (CLUE's
# baselines/paddlenlp/classification/run_clue_classifier.py, do_predict): TNEWS and
# CLUEWSC2020 were revised for 1.1 ("tnews11", "cluewsc11"; the 1.0 test sets "tnews10",
# "cluewsc10"), OCNLI is "ocnli_50k" (its 50k training set); the others are the task name.
CLUE: dict[str, Task] = {
    t.name: t
    for t in (
        _clue("afqmc", ("sentence1", "sentence2"), _BINARY, "afqmc_predict"),
        _clue("tnews", ("sentence",), _TNEWS, "tnews11_predict", test_10="tnews10_predict"),
        _clue("iflytek", ("sentence",), tuple(str(i) for i in range(119)), "iflytek_predict"),
        _clue("cmnli", ("sentence1", "sentence2"), _CLUE_NLI, "cmnli_predict"),
        _clue("ocnli", ("sentence1", "sentence2"), _CLUE_NLI, "ocnli_50k_predict"),
        # CSL: the keywords (a list, joined by spaces as CLUE's baseline does) and the abstract.
        _clue("csl", ("keyword", "abst"), _BINARY, "csl_predict"),
        # CLUEWSC2020: the text with its noun marked _so_ and its pronoun [so] (`jsonl.wsc_text`).
        _clue(
            "cluewsc2020",
            ("text",),
            ("true", "false"),
            "cluewsc11_predict",
            test_10="cluewsc10_predict",
            text_builder="wsc",
        ),
    )
}
CLUE_ALL = tuple(CLUE)
ALL_TASKS: dict[str, Task] = {**TASKS, **CLUE}


def get(name: str) -> Task:
  """The task called `name`; "ax" is MNLI (whose model predicts the AX diagnostic)."""
  if name == "ax":
    return TASKS["mnli"]
  if name not in ALL_TASKS:
    raise errors.ConfigError(
        f"task {name!r} is not a GLUE or CLUE task — valid: {', '.join(ALL)}, ax, "
        f"{', '.join(CLUE_ALL)}"
    )
  return ALL_TASKS[name]


def custom(
    name: str,
    train: str,
    dev: str,
    test: str | None,
    text_columns: tuple[str, ...],
    label_column: str,
    labels: tuple[str, ...] | None,
    format: str = "tsv",
) -> Task:
  """A task over the user's own TSV files (header row, columns by name) or, `format` "jsonl",
  JSON-lines files (one object a line, fields by name; a test record's "id" names its
  submission line, else its position).

  `labels` are the distinct training labels (sorted) or None for regression; binary tasks
  also report F1 with the second label as the positive class.
  """
  if labels is None:
    metrics, main = ("pearson", "spearman"), "spearman"
  elif len(labels) == 2:
    metrics, main = ("accuracy", "f1", "mcc"), "accuracy"
  else:
    metrics, main = ("accuracy",), "accuracy"
  stem = f"{name}_predict" if format == "jsonl" else name
  tests = (Split("test", test, ("", ""), submission=stem),) if test else ()
  return Task(
      name=name,
      text_columns=text_columns,
      tfds_features=text_columns,
      label_column=label_column,
      labels=labels,
      metrics=metrics,
      main_metric=main,
      train=Split("train", train, ("", "")),
      dev=(Split("dev", dev, ("", "")),),
      test=tests,
      index_column="id" if format == "jsonl" else None,
      format=format,
  )
