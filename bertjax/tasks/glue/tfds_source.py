"""GLUE splits from TensorFlow Datasets `glue/<task>` (and `glue/ax`), prepared in the user's
data dir. Nothing is downloaded here: prepare the data once with
`tfds build glue --config sst2 --data_dir DIR`, or
`tfds.builder("glue/sst2", data_dir=DIR).download_and_prepare()`.

TFDS already uses the class ids of tasks.py (they were taken from its `ClassLabel`s); test
splits carry label -1 and the leaderboard's row id in `idx`.
"""

from __future__ import annotations

import numpy as np

from bertjax.tasks.glue import features, tasks
from bertjax.tasks.glue.tasks import GlueDataError


def _text(x) -> str:
  return x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x)


def _open(split: tasks.Split, data_dir: str | None):
  """The prepared TFDS split as a tf.data.Dataset (nothing read yet)."""
  import tensorflow_datasets as tfds  # TF stays out of the import path of the model code

  name, tfds_split = split.tfds
  try:
    return tfds.load(name, split=tfds_split, data_dir=data_dir, download=False, shuffle_files=False)
  except Exception as e:  # DatasetNotFoundError, AssertionError, ... depending on version
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise GlueDataError(
        f"TFDS {name} split {tfds_split!r} is not available in "
        f"data_dir={data_dir or '~/tensorflow_datasets'} ({first}) — prepare it where there is "
        f"network access: `tfds build glue --config {name.split('/')[1]} --data_dir DIR`, then "
        "pass data_dir=DIR; or read the GLUE download's TSV files instead"
    ) from None


def check_task(task: tasks.Task, data_dir: str | None) -> None:
  """Raise GlueDataError unless the train and dev splits of `task` are prepared (a cheap
  check before anything is written: the splits are opened, not read)."""
  for split in (task.train, *task.dev):
    _open(split, data_dir)


def load_split(
    task: tasks.Task, split: tasks.Split, data_dir: str | None, labelled: bool
) -> features.Examples:
  import tensorflow_datasets as tfds  # TF stays out of the import path of the model code

  name, tfds_split = split.tfds
  ds = _open(split, data_dir)
  text_a, text_b, ys, index = [], [], [], []
  col_a = task.tfds_features[0]
  col_b = task.tfds_features[1] if task.is_pair else None
  for b in tfds.as_numpy(ds.batch(4096)):  # batched: MNLI's 393k rows one by one are slow
    text_a.extend(_text(t) for t in b[col_a])
    if col_b:
      text_b.extend(_text(t) for t in b[col_b])
    index.extend(str(int(i)) if not labelled else f"{name}/{tfds_split}:{int(i)}" for i in b["idx"])
    ys.extend(b["label"].tolist())
  labels = None
  if labelled:
    labels = np.asarray(ys, np.float32 if task.is_regression else np.int32)
  return features.Examples(text_a, text_b if col_b else None, labels, index)


def load_task(
    task: tasks.Task, data_dir: str | None, with_test: bool = True
) -> dict[str, features.Examples]:
  """train, dev and test splits of a task; a test split that is not prepared (e.g. glue/ax)
  is left out with a note rather than failing the run."""
  out = {"train": load_split(task, task.train, data_dir, labelled=True)}
  for split in task.dev:
    out[split.name] = load_split(task, split, data_dir, labelled=True)
  for split in task.test if with_test else ():
    try:
      out[split.name] = load_split(task, split, data_dir, labelled=False)
    except GlueDataError as e:
      print(f"glue: no {split.submission} submission: {e}")
  return out
