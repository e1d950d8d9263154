"""The train step on 1 vs 8 devices, the non-finite guard, and the loop end to end (two phases,
metrics.jsonl, resume in phase 2), all on the synthetic source."""

import json

import jax
import numpy as np
import pytest

from bertjax.data import pretraining
from bertjax.training import loop, sharding, train
from conftest import loop_config, metrics_rows, run_until, tiny_config


def _losses(c, mesh, steps=3):
  s = train.setup(c, mesh)
  state = s.init_state(0)
  cfg = pretraining.InputConfig(
      source="synthetic",
      seq_len=c.data.seq_len,
      max_predictions_per_seq=c.data.max_predictions_per_seq,
      vocab_size=c.model.vocab_size,
      seed=0,
  )
  stream = pretraining.make_stream(
      cfg, global_batch_size=c.train.batch_size, process_index=0, process_count=1
  )
  out = []
  for _ in range(steps):
    state, m = s.train_step(state, pretraining.global_batch(next(stream), s.batch_sharding))
    out.append(float(m["loss"]))
  return np.array(out), state


@pytest.mark.slow
def test_one_device_equals_eight_devices():
  c = tiny_config(warmup_steps=0, learning_rate=1e-3)  # dropout stays on
  one, _ = _losses(c, sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
  for mesh in (sharding.make_mesh(2, 2, 2), sharding.make_mesh(1, 8, 1)):
    many, state = _losses(c, mesh)
    np.testing.assert_allclose(many, one, rtol=1e-5)
    assert len(state.params["mlm_bias"].sharding.device_set) == 8
  assert one[2] < one[0]  # and it learns


@pytest.mark.slow
def test_nonfinite_step_is_not_applied():
  c = tiny_config(inject_nan_at_step=1)
  mesh = sharding.make_mesh(2, 2, 2)
  s = train.setup(c, mesh)
  cfg = pretraining.InputConfig(
      source="synthetic", seq_len=32, max_predictions_per_seq=5, vocab_size=1000
  )
  stream = pretraining.make_stream(cfg, global_batch_size=16, process_index=0, process_count=1)
  state, m0 = s.train_step(
      s.init_state(0), pretraining.global_batch(next(stream), s.batch_sharding)
  )
  before = jax.device_get(state)
  state, m1 = s.train_step(state, pretraining.global_batch(next(stream), s.batch_sharding))
  assert float(m0["finite"]) == 1.0 and float(m1["finite"]) == 0.0
  assert np.isnan(float(m1["loss"]))
  after = jax.device_get(state)
  jax.tree.map(np.testing.assert_array_equal, before.params, after.params)
  jax.tree.map(np.testing.assert_array_equal, before.opt_state, after.opt_state)
  assert int(after.step) == 2


@pytest.mark.slow
def test_guard_stops_the_loop(tmp_path, capsys, monkeypatch):
  c = loop_config(6, **{"train.inject_nan_at_step": 3, "eval.every_steps": 0})
  assert loop.train_and_evaluate(c, str(tmp_path)) == 1
  out = capsys.readouterr().out
  assert "step 4: non-finite loss nan" in out and "stopping: 1 non-finite" in out
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["3"]
  # With a budget of one skip the run goes on and finishes; a relative workdir (as in
  # `bertjax demo --workdir runs/demo`) works although orbax writes only absolute paths.
  c = loop_config(
      6, **{"train.inject_nan_at_step": 3, "train.max_bad_steps": 1, "eval.every_steps": 0}
  )
  monkeypatch.chdir(tmp_path)
  assert loop.train_and_evaluate(c, "skip") == 0
  assert {"3", "6"} <= {p.name for p in (tmp_path / "skip" / "checkpoints").iterdir()}
  train_rows, _ = metrics_rows(tmp_path / "skip")
  assert all(np.isfinite(r["loss"]) for r in train_rows.values())


@pytest.mark.slow
def test_two_phase_run_and_resume_in_phase_two(tmp_path):
  kw = {
      "phase2.fraction": 0.5,
      "phase2.seq_len": 64,
      "phase2.max_predictions_per_seq": 8,
      "phase2.batch_size": 8,
  }
  full = tmp_path / "full"
  assert loop.train_and_evaluate(loop_config(8, **kw), str(full)) == 0
  rows, evals = metrics_rows(full)
  keys = {
      "step",
      "loss",
      "mlm_loss",
      "mlm_accuracy",
      "nsp_loss",
      "nsp_accuracy",
      "learning_rate",
      "seq_per_sec",
      "tokens_per_sec",
      "mfu",
  }
  assert keys <= set(rows[8])
  assert {"eval_mlm_perplexity", "eval_mlm_accuracy", "eval_nsp_accuracy"} <= set(evals[0])
  # tokens/s counts real tokens (padding left out); unpacked, one example per row.
  for step, seq in ((8, 64), (3, 32)):
    r = rows[step]
    assert r["examples_per_row"] == 1.0 and 0.5 < r["real_token_fraction"] <= 1.0
    assert r["tokens_per_sec"] == pytest.approx(r["seq_per_sec"] * seq * r["real_token_fraction"])
  # Stop at step 6 (in phase 2, checkpoint at 6), then rerun to 8: same losses as `full`.
  part = tmp_path / "part"
  run_until(loop_config(8, **kw), part, 6)
  assert loop.train_and_evaluate(loop_config(8, **kw), str(part)) == 0
  resumed, _ = metrics_rows(part)
  assert resumed[8]["loss"] == rows[8]["loss"]


@pytest.mark.slow
def test_metrics_are_one_record_per_step_across_resumes(tmp_path):
  """metrics.jsonl after a preemption + resume, and after a kill that left records past the
  checkpoint, holds exactly the uninterrupted run's records: step 1 included, interval
  averages over the same steps (logging every 4, checkpoints every 3: intervals straddle
  resumes), valid JSON only."""
  kw = {"log_every_steps": 4, "eval.every_steps": 0}
  full = tmp_path / "full"
  assert loop.train_and_evaluate(loop_config(12, **kw), str(full)) == 0
  ref, _ = metrics_rows(full)
  assert sorted(ref) == [1, 4, 8, 12]
  part = tmp_path / "part"
  run_until(loop_config(12, **kw), part, 6)  # preempted at 6: the interval 5..8 is half done
  with open(part / "metrics.jsonl", "a") as f:  # as if killed at 7 after writing later records
    f.write(json.dumps({"step": 8, "loss": 0.0}) + "\n" + '{"step": 9, "lo')
  assert loop.train_and_evaluate(loop_config(12, **kw), str(part)) == 0
  lines = (part / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(l, parse_constant=lambda c: pytest.fail(f"non-JSON {c}")) for l in lines]
  assert [r["step"] for r in rows] == [1, 4, 8, 12]
  for r in rows:
    for k in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm", "learning_rate"):
      assert r[k] == pytest.approx(ref[r["step"]][k], rel=1e-6), (r["step"], k)


def test_nonfinite_metrics_are_null_and_named(tmp_path):
  from bertjax.training import metrics_writer

  w = metrics_writer.MetricsWriter(str(tmp_path), tensorboard=False)
  w.write(5, {"mlm_perplexity": float("inf"), "loss": float("nan"), "mlm_accuracy": 0.5})
  w.close()
  row = json.loads(
      (tmp_path / "metrics.jsonl").read_text(),
      parse_constant=lambda c: pytest.fail(f"non-JSON {c}"),
  )
  assert row["mlm_perplexity"] is None and row["loss"] is None and row["mlm_accuracy"] == 0.5
  assert row["nonfinite"] == ["mlm_perplexity", "loss"]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("train.steps", 0, r"config.train.steps=0: must be an integer >= 1"),
        ("checkpoint.every_steps", 0, r"config.checkpoint.every_steps=0"),
        ("train.batch_size", 5, r"config.train.batch_size=5"),
    ],
)
def test_bad_config_from_python_is_one_error_and_writes_nothing(tmp_path, field, value, message):
  wd = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    loop.train_and_evaluate(loop_config(4, **{field: value}), str(wd))
  assert not wd.exists()


@pytest.mark.long
@pytest.mark.slow
def test_a_context_extension_phase_computes_with_its_own_rope_theta(tmp_path):
  """ModernBERT's context extension as phase 2: a longer sequence and a new global RoPE base.
  Phase 1 trains exactly as without the change, phase 2 differs, the checkpoint records the
  phase-2 model, and a resume inside phase 2 repeats the uninterrupted run."""
  from bertjax.training import pretrained

  kw = {
      "model.position_embedding": "rope",
      "phase2.fraction": 0.5,
      "phase2.seq_len": 64,
      "phase2.max_predictions_per_seq": 8,
      "phase2.batch_size": 8,
      "eval.every_steps": 0,
  }
  base = tmp_path / "base"
  assert loop.train_and_evaluate(loop_config(4, **kw), str(base)) == 0
  kw["phase2.rope_theta"] = 160_000.0
  ext = tmp_path / "ext"
  assert loop.train_and_evaluate(loop_config(4, **kw), str(ext)) == 0
  rows_base, _ = metrics_rows(base)
  rows_ext, _ = metrics_rows(ext)
  assert [rows_ext[s]["loss"] for s in (1, 2)] == [rows_base[s]["loss"] for s in (1, 2)]
  assert all(rows_ext[s]["loss"] != rows_base[s]["loss"] for s in (3, 4))
  assert pretrained.read_config(str(ext)).rope_theta == 160_000.0
  assert pretrained.read_config(str(base)).rope_theta == 10_000.0
  part = tmp_path / "part"
  run_until(loop_config(4, **kw), part, 3)
  assert loop.train_and_evaluate(loop_config(4, **kw), str(part)) == 0
  rows_part, _ = metrics_rows(part)
  assert rows_part[4]["loss"] == rows_ext[4]["loss"]
