"""`bertjax bench --config contrastive`: both sides start from the same loss on the same
weights and batch, and the report carries the keys other tools read (speeds are measured,
never asserted)."""

import json

import pytest

from bertjax import cli

TINY = ["--preset", "tiny", "--batch-size", "8", "--seq-len", "16", "--vocab-size", "200"]
# No attention dropout: its random masks double the step's compile time here (hidden dropout,
# the recipe's 0.1, stays on both sides).
TINY += ["--attention-dropout", "0"]


@pytest.mark.slow  # imports sentence-transformers and compiles the step
def test_bench_contrastive_report(capsys):
  """What no other test shows: the benchmark's sentence-transformers model, written by the
  export and loaded by `SentenceTransformer`, computes the loss bertjax does on the benchmark's
  batch, and one timed step each side gives the keys tools read."""
  argv = ["bench", "--config", "contrastive", "--compare", "sentence-transformers", *TINY]
  assert cli.main(argv + ["--warmup", "1", "--steps", "1", "--json"]) == 0
  row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert (row["config"], row["batch_size"], row["seq_len"]) == ("contrastive", 8, 16)
  assert row["hard_negatives"] == 1 and row["texts_per_step"] == 24
  assert row["first_loss_bertjax"] > 0
  assert abs(row["first_loss_bertjax"] - row["first_loss_sentence-transformers"]) <= 1e-4
  for side in ("bertjax", "sentence-transformers"):
    assert row[f"{side}_steps_per_s"] > 0 and row[f"{side}_step_ms"] > 0
  assert row["speedup_sentence-transformers_cpu"] > 0
  assert row["speedup_sentence-transformers"] == pytest.approx(
      row["sentence-transformers_step_ms"] / row["bertjax_step_ms"]
  )


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--config", "contrastive_pretrain"],
            "--config contrastive_pretrain: not a recipe this benchmark times — valid: contrastive",
        ),
        (
            ["--config", "contrastive", "--compare", "hf-torch"],
            "--compare hf-torch: with --config contrastive — valid: sentence-transformers",
        ),
        (["--config", "contrastive", "--data", "d"], "--data: times the MLM step only"),
    ],
)
def test_bench_contrastive_refuses_in_one_line(capsys, extra, message):
  """A recipe, peer or flag it does not time: one line naming it and what is valid, exit 2,
  before any model is built."""
  assert cli.main(["bench", *extra, *TINY]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and message in err, err
