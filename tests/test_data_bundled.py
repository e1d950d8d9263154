"""bertjax.data.bundled: the bundled corpus is found in the repository, a missing one is one
error with the fix, and it is prepared once per workdir."""

import pathlib

import pytest

from bertjax import errors
from bertjax.data import bundled

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_the_corpus_is_the_repositorys_data_dir():
  corpus = bundled.find()
  assert corpus.text == REPO / "data" / "austen.txt"
  assert corpus.tokenizer == REPO / "data" / "tokenizer.model"


def test_a_missing_corpus_says_where_it_looked_and_the_fix(tmp_path, monkeypatch):
  """As after a plain `pip install`: the package without the repository's data/."""
  monkeypatch.setattr(bundled, "CORPUS_PATH", tmp_path / "data" / "austen.txt")
  with pytest.raises(errors.InputNotFoundError) as e:
    bundled.find()
  assert str(tmp_path / "data" / "austen.txt") in str(e.value)
  assert "config.data.path" in str(e.value) and "pip install -e ." in str(e.value)
  with pytest.raises(errors.InputNotFoundError, match=r"— run it elsewhere$"):
    bundled.find(fix="run it elsewhere")


def test_where_a_run_keeps_it():
  assert bundled.output_dir("runs/x") == pathlib.Path("runs/x/data/austen")
  cache = bundled.output_dir("gs://bucket/run")
  assert cache == pathlib.Path.home() / ".cache" / "bertjax" / "data" / "austen"


@pytest.mark.slow
def test_prepared_once_per_workdir(tmp_path, monkeypatch):
  text = (REPO / "data" / "austen.txt").read_text()[:30_000]
  (tmp_path / "small.txt").write_text(text)
  monkeypatch.setattr(bundled, "CORPUS_PATH", tmp_path / "small.txt")
  out = bundled.prepared_dir(str(tmp_path / "run"))
  assert out == str(tmp_path / "run" / "data" / "austen")
  assert (pathlib.Path(out) / "metadata.json").is_file()

  def again(*a, **k):
    raise AssertionError("prepared twice")

  monkeypatch.setattr(bundled, "prepare_into", again)
  assert bundled.prepared_dir(str(tmp_path / "run")) == out
