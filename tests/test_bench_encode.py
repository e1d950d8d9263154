"""`bertjax bench encode`: both sides embed the same documents to the same vectors, and the
report carries the keys other tools read (speeds are measured, never asserted)."""

import json

import pytest


@pytest.mark.slow  # builds a model in torch and compiles it in JAX at the bench's shape
def test_bench_encode_report(capsys):
  """What no other test shows: the benchmark's two sides embed its documents alike at its own
  shape and length, and its report has the keys tools read."""
  from bertjax import cli

  argv = ["bench", "encode", "--compare", "sentence-transformers", "--shape", "bert-mini"]
  assert cli.main(argv + ["--max-docs", "12", "--batch-size", "8", "--json"]) == 0
  row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert row["documents"] == 12 and row["max_seq_len"] == 256
  assert row["max_abs_diff"] < 1e-4
  for key in ("bertjax_docs_per_s", "sentence-transformers_docs_per_s"):
    assert row[key] > 0
  assert "speedup_sentence-transformers" in row
