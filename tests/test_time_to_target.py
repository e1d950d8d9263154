"""Time to target (MLPerf's time to train): the first evaluation whose held-out MLM accuracy
reaches config.eval.target_mlm_accuracy, reported as {step, wall_s, tokens} in metrics.jsonl
and the final line, and optionally the end of the run."""

import json

import pytest

from bertjax.training import loop, metrics_writer, progress
from bertjax.training.phases import phases
from conftest import loop_config, metrics_rows


def _records(workdir):
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_the_first_evaluation_at_or_above_the_target_counts_once():
  c = loop_config(9, **{"eval.target_mlm_accuracy": 0.5})
  clock = progress.TimeToTarget(c, phases(c), None)
  clock.add(1, {"real_token_fraction": 0.5})  # 16 rows x 32 tokens, half of them real
  assert not clock.check(3, {"eval_mlm_accuracy": 0.49})
  assert clock.check(6, {"eval_mlm_accuracy": 0.5})
  assert not clock.check(9, {"eval_mlm_accuracy": 0.9})  # the first time only
  assert clock.reached["step"] == 6 and clock.reached["tokens"] == 256
  assert clock.reached["wall_s"] >= 0
  # a resume carries tokens, wall time and the result
  again = progress.TimeToTarget(c, phases(c), clock.state())
  assert again.reached == clock.reached and again.tokens == clock.tokens
  assert again.wall_s() >= clock.reached["wall_s"]


def test_the_line_says_step_time_and_tokens_or_not_reached():
  line = metrics_writer.time_to_target_line(0.4, {"step": 300, "wall_s": 72.5, "tokens": 1_234_567})
  assert line == (
      "time to target (held-out MLM accuracy >= 0.4): step 300, 1m12s (72.5s), 1.23M tokens"
  )
  assert metrics_writer.time_to_target_line(0.4, None).endswith(": not reached")


@pytest.mark.slow
def test_a_run_stops_at_the_target_and_reports_it(tmp_path, capsys):
  kw = {"eval.target_mlm_accuracy": 0.0, "eval.stop_at_target": True}
  assert loop.train_and_evaluate(loop_config(9, **kw), str(tmp_path)) == 0
  out = capsys.readouterr().out
  assert "stopping at step 3: config.eval.stop_at_target" in out
  done = [l for l in out.splitlines() if l.startswith("done:")][0]
  assert "time to target (held-out MLM accuracy >= 0): step 3, " in done
  ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert ckpts == ["3"]
  records = _records(tmp_path)
  reached = [r for r in records if r.get("time_to_target")]
  assert reached[0]["step"] == 3 and "eval_mlm_accuracy" in reached[0]  # the eval record
  assert reached[-1] == {"step": 3, "time_to_target": reached[0]["time_to_target"]} | {
      "elapsed_sec": reached[-1]["elapsed_sec"],
      "tokens_by_source": reached[0]["tokens_by_source"],  # every row carries it
  }
  ttt = reached[0]["time_to_target"]
  assert ttt["step"] == 3 and ttt["wall_s"] > 0
  # tokens: the real tokens of steps 1..3 (metrics every step: log_every_steps=1)
  rows, _ = metrics_rows(tmp_path)
  want = sum(16 * 32 * rows[s]["real_token_fraction"] for s in (1, 2, 3))
  assert abs(ttt["tokens"] - want) <= 1
  # the same command again: the target was reached, nothing is trained
  assert loop.train_and_evaluate(loop_config(9, **kw), str(tmp_path)) == 0
  assert "nothing left to train" in capsys.readouterr().out
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["3"]


@pytest.mark.slow
def test_a_target_not_reached_is_null_and_the_run_goes_on(tmp_path, capsys):
  kw = {"eval.target_mlm_accuracy": 1.0, "eval.stop_at_target": True, "eval.pair_mode": "none"}
  # step 3 both evaluates (timed to the target) and checkpoints: the step's metrics are read once
  assert loop.train_and_evaluate(loop_config(6, **kw), str(tmp_path)) == 0
  out = capsys.readouterr().out
  assert "time to target (held-out MLM accuracy >= 1): not reached" in out
  # trained with NSP, scored on single segments: the eval lines print no pair-task figures
  evals = [l for l in out.splitlines() if l.startswith("eval step")]
  assert len(evals) == 2 and not any("nsp_" in l for l in evals)
  assert any("nsp_acc" in l for l in out.splitlines() if l.startswith("step "))
  last = _records(tmp_path)[-1]
  assert last["step"] == 6 and last["time_to_target"] is None
  assert (tmp_path / "checkpoints" / "3").exists()
  rows, evals = metrics_rows(tmp_path)
  assert sorted(rows) == [1, 2, 3, 4, 5, 6] and [e["step"] for e in evals] == [3, 6]
