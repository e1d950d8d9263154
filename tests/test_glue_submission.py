"""Submissions are complete or refused: an unreadable test row stops `bertjax glue` before
training, the writer checks every row before it writes, bad train/dev rows are counted."""

import os

import numpy as np
import pytest

from bertjax import cli
from bertjax.tasks.glue import submission, tasks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER = os.path.join(REPO, "data", "tokenizer.model")
MRPC_HEADER = "#1 ID\t#2 ID\t#1 String\t#2 String"


def _mrpc_dir(root, test_rows=23, broken=(), bad_train_lines=()):
  """GLUE_DIR/MRPC: train (rows in `bad_train_lines` get a tab inside a sentence), dev, and a
  test file whose rows in `broken` lose their second sentence."""
  d = root / "MRPC"
  d.mkdir(parents=True)
  pair = lambda i: f"{i}\t{i + 1}\tthe cat sat {i} .\tthe cat sat {i} too ."
  train = [f"{i % 2}\t{pair(i)}" for i in range(16)]
  for line in bad_train_lines:
    train[line - 2] = f"1\t{line}\t{line}\ta sentence\twith a tab\tinside ."
  (d / "train.tsv").write_text("\ufeffQuality\t" + MRPC_HEADER + "\n" + "\n".join(train) + "\n")
  (d / "dev.tsv").write_text(
      "\ufeffQuality\t"
      + MRPC_HEADER
      + "\n"
      + "\n".join(f"{i % 2}\t{pair(i)}" for i in range(8))
      + "\n"
  )
  test = [
      f"{i}\t{i}\t{i + 1}\tthe cat sat {i} ." if i in broken else f"{i}\t{pair(i)}"
      for i in range(test_rows)
  ]
  (d / "test.tsv").write_text("index\t" + MRPC_HEADER + "\n" + "\n".join(test) + "\n")
  return d


def _glue(root, out, *extra):
  return cli.main(
      [
          "glue",
          "--task",
          "mrpc",
          "--init",
          "random",
          "--tokenizer",
          TOKENIZER,
          "--data",
          str(root),
          "--workdir",
          str(out),
          "--max-seq-len",
          "16",
          "--epochs",
          "1",
          "--no-progress",
          *extra,
      ]
  )


def test_malformed_test_rows_stop_the_command_before_training(tmp_path, capsys, monkeypatch):
  from bertjax.tasks import encoder as encoder_lib
  from bertjax.tasks.glue import finetune

  def no_training(*args, **kw):
    raise AssertionError("trained despite an unreadable test file")

  monkeypatch.setattr(finetune, "train_and_evaluate", no_training)
  monkeypatch.setattr(encoder_lib, "load_encoder", no_training)
  d = _mrpc_dir(tmp_path / "glue", test_rows=23, broken=(5, 17))
  assert _glue(tmp_path / "glue", tmp_path / "out") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
      f"bertjax glue: {d / 'test.tsv'}:7: 4 fields, expected 5 — every test row needs a "
      "prediction, so the submission would be incomplete: fix this row"
  ]
  assert not (tmp_path / "out").exists()  # nothing written: not even the output directory


def test_writer_refuses_an_incomplete_or_invalid_submission(tmp_path):
  mrpc, stsb = tasks.TASKS["mrpc"], tasks.TASKS["stsb"]
  index = [str(i) for i in range(23)]
  with pytest.raises(ValueError, match="MRPC: 23 test rows but 21 predictions"):
    submission.write_submission(mrpc, mrpc.test[0], index, np.zeros(21, int), str(tmp_path))
  with pytest.raises(ValueError, match="MRPC: no test rows"):
    submission.write_submission(mrpc, mrpc.test[0], [], np.zeros(0, int), str(tmp_path))
  scores = np.full(23, 2.5)
  scores[4] = np.nan  # a diverged regression head
  with pytest.raises(ValueError, match=r"STS-B: row 5 \(id 4\): prediction 'nan' is not a label"):
    submission.write_submission(stsb, stsb.test[0], index, scores, str(tmp_path))
  assert not (tmp_path / "submission").exists() or not os.listdir(tmp_path / "submission")
  lines = ["index\tprediction", "0\t1", "2\t0", "1\t1"]
  with pytest.raises(ValueError, match=r"row 2 is '2\\t0', expected test row id '1' first"):
    submission.check_submission(mrpc, mrpc.test[0], ["0", "1", "2"], lines)
  with pytest.raises(ValueError, match="the header must be 'index\\\\tprediction'"):
    submission.check_submission(mrpc, mrpc.test[0], ["0"], ["id\tlabel", "0\t1"])
  with pytest.raises(ValueError, match="prediction 'yes' is not a label"):
    submission.check_submission(mrpc, mrpc.test[0], ["0"], ["index\tprediction", "0\tyes"])
  path = submission.write_submission(mrpc, mrpc.test[0], index, np.arange(23) % 2, str(tmp_path))
  assert open(path).read().splitlines() == (
      ["index\tprediction"] + [f"{i}\t{i % 2}" for i in range(23)]
  )
  assert os.listdir(tmp_path / "submission") == ["MRPC.tsv"]


def test_skipped_train_rows_are_counted_per_file(tmp_path, capsys):
  from bertjax.tasks.glue import sweep
  from bertjax.tasks.glue import tsv

  _mrpc_dir(tmp_path / "glue", bad_train_lines=(5, 9))
  examples = tsv.load_task(tasks.TASKS["mrpc"], str(tmp_path / "glue"))
  assert len(examples["train"]) == 14 and len(examples["test"]) == 23
  sweep.report_skipped(tasks.TASKS["mrpc"], examples, str(tmp_path / "out"))
  listed = tmp_path / "out" / "mrpc" / "skipped_rows.txt"
  assert capsys.readouterr().out.splitlines() == [
      f"glue: mrpc: MRPC/train.tsv: skipped 2 malformed rows (first: line 5: 6 fields, "
      f"expected 5); all listed in {listed}"
  ]
  assert listed.read_text().splitlines() == [
      "MRPC/train.tsv:5: 6 fields, expected 5",
      "MRPC/train.tsv:9: 6 fields, expected 5",
  ]


@pytest.mark.slow
def test_bad_train_rows_skipped_and_every_test_row_submitted(tmp_path, capsys):
  _mrpc_dir(tmp_path / "glue", bad_train_lines=(3,))
  assert _glue(tmp_path / "glue", tmp_path / "out") == 0
  out = capsys.readouterr().out
  assert "glue: mrpc: MRPC/train.tsv: skipped 1 malformed rows (first: line 3: 6 fields" in out
  assert "glue: mrpc: train 15, dev 8, test 23" in out
  assert f"glue: results in {tmp_path / 'out' / 'results.json'} and results.md" in out
  lines = (tmp_path / "out" / "submission" / "MRPC.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and [l.split("\t")[0] for l in lines[1:]] == [
      str(i) for i in range(23)
  ]
