"""metrics.jsonl on an object store: GCS objects cannot be appended to, so the writer rewrites
the whole object (the first record at once, then at most every REMOTE_FLUSH_S seconds, on
`flush()` and at `close()`), and a resume's truncation keeps the records up to its step.

`etils.epath.testing.mock_epath` serves `gs://` paths from the working directory (tmp_path) and
here refuses any append to them, as GCS would."""

import json

from etils.epath import gpath
from etils.epath import testing as epath_testing
import pytest

from bertjax.training import metrics_writer


@pytest.fixture
def no_append_gs(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # gs://b/run is tmp_path/gs:/b/run
  # With TensorFlow installed epath picks its gfile backend past the mock's table.
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)

  def open_(real_open, path, mode):
    assert "a" not in mode, f"append to {path}"
    return real_open(path, mode)

  with epath_testing.mock_epath(open=open_):
    yield tmp_path / "gs:" / "b" / "run" / "metrics.jsonl"


def _steps(path) -> list[int]:
  return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_object_store_metrics_are_rewritten_whole(no_append_gs, monkeypatch):
  w = metrics_writer.MetricsWriter("gs://b/run", tensorboard=False)
  w.write(1, {"loss": 3.0})
  assert _steps(no_append_gs) == [1]  # the first record is stored at once
  w.write(2, {"loss": 2.0})
  assert _steps(no_append_gs) == [1]  # then batched
  w.flush()
  assert _steps(no_append_gs) == [1, 2]
  monkeypatch.setattr(metrics_writer, "REMOTE_FLUSH_S", 0.0)
  w.write(3, {"loss": 1.5})
  assert _steps(no_append_gs) == [1, 2, 3]
  monkeypatch.setattr(metrics_writer, "REMOTE_FLUSH_S", 3600.0)
  w.write(4, {"loss": 1.0})
  w.close()
  assert _steps(no_append_gs) == [1, 2, 3, 4]
  # A resume from step 2's checkpoint: later records dropped, new ones after the kept ones.
  w = metrics_writer.MetricsWriter("gs://b/run", tensorboard=False, keep_through=2)
  assert _steps(no_append_gs) == [1, 2]
  w.write(3, {"loss": 1.4})
  w.close()
  assert _steps(no_append_gs) == [1, 2, 3]


def test_local_metrics_are_appended_line_by_line(tmp_path):
  w = metrics_writer.MetricsWriter(str(tmp_path), tensorboard=False)
  for step in (1, 2, 3):
    w.write(step, {"loss": 1.0})
    assert _steps(tmp_path / "metrics.jsonl") == list(range(1, step + 1))  # no batching
  w.close()
