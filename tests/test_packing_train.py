"""Packed pretraining end to end: a packed batch trains, packed and unpacked losses of the same
examples agree, and a packed loop run logs the real-token share and resumes exactly."""

import jax
import numpy as np
import pytest

from bertjax.data import packing, pretraining, synthetic
from bertjax.training import fit, loop, losses, phases as phases_lib, sharding, train
from conftest import loop_config, metrics_rows, run_until, tiny_config


def _one_device():
  return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def _packed_config(**data):
  c = tiny_config(warmup_steps=0, learning_rate=1e-3)
  c.data.packing = True
  c.data.max_examples_per_row = 4
  for k, v in data.items():
    c.data[k] = v
  return c


def _stream(c, batch):
  d = c.data
  cfg = pretraining.InputConfig(
      source="synthetic",
      seq_len=d.seq_len,
      max_predictions_per_seq=d.max_predictions_per_seq,
      vocab_size=c.model.vocab_size,
      packing=d.packing,
      max_examples_per_row=d.max_examples_per_row,
      short_seq_prob=1.0,  # short examples: several per row
  )
  return pretraining.make_stream(cfg, global_batch_size=batch, process_index=0, process_count=1)


def test_packed_batch_trains_and_counts_examples():
  c = _packed_config()
  s = train.setup(c, sharding.make_mesh(2, 2, 2))
  host = next(_stream(c, c.train.batch_size))
  assert host["nsp_labels"].shape == (16, 4) and host["nsp_weights"].sum() > 16  # packed
  state = s.init_state(0)
  first = None
  for _ in range(3):
    state, m = s.train_step(state, pretraining.global_batch(host, s.batch_sharding))
    first = float(m["loss"]) if first is None else first
    assert np.isfinite(float(m["loss"]))
  assert float(m["loss"]) < first  # it learns the batch
  np.testing.assert_allclose(float(m["examples_per_row"]), host["nsp_weights"].sum() / 16)
  np.testing.assert_allclose(
      float(m["real_token_fraction"]), packing.real_token_fraction(host["attention_mask"])
  )
  host["at_mask"] = np.asarray(losses.at_mask_token(host))
  sums = s.eval_step(state.params, pretraining.global_batch(host, s.batch_sharding))
  assert float(sums["nsp_count"]) == host["nsp_weights"].sum()
  assert float(sums["mlm_count"]) == host["masked_weights"].sum()


def _examples(c, n):
  """n unpacked synthetic examples (short ones: several fit a row), masked."""
  stream = _stream(c, 1)
  spec = stream.spec
  b = synthetic.synthetic_batch(
      seed=3,
      step=0,
      rows=np.arange(n),
      seq_len=c.data.seq_len,
      pair_mode="nsp",
      short_seq_prob=1.0,
      spec=spec,
  )
  return {k: b[k] for k in pretraining.FEATURES}, spec.pad_id


def _eval_sums(s, params, batch):
  batch = dict(batch, at_mask=np.asarray(losses.at_mask_token(batch)))
  return jax.device_get(s.eval_step(params, pretraining.global_batch(batch, s.batch_sharding)))


def test_packed_and_unpacked_losses_of_the_same_examples_agree():
  c = _packed_config(seq_len=64, max_predictions_per_seq=10)
  with c.unlocked():
    c.model.hidden_dropout_rate = c.model.attention_dropout_rate = 0.0
  s = train.setup(c, _one_device())
  params = s.init_state(0).params
  examples, pad = _examples(c, 12)
  rows = packing.plan_rows(examples["attention_mask"].sum(1).tolist(), 64, 4)
  assert len(rows) < 12  # several examples share a row
  R = packing.prediction_budget(64, 10, c.data.mask_prob, 4)
  packed = packing.pack(examples, rows, max_examples=4, max_predictions=R, pad_id=pad)
  a, b = _eval_sums(s, params, examples), _eval_sums(s, params, packed)
  for k in ("mlm_count", "nsp_count", "mlm_correct", "nsp_correct"):
    assert float(a[k]) == float(b[k]), k
  assert float(b["nsp_count"]) == 12
  for k in ("mlm_loss", "nsp_loss"):
    np.testing.assert_allclose(float(b[k]), float(a[k]), rtol=1e-5, err_msg=k)


def test_microbatches_split_the_packed_arrays():
  """Two microbatches of a packed batch give the one-batch loss and gradient step."""
  c = _packed_config()
  with c.unlocked():
    c.model.hidden_dropout_rate = c.model.attention_dropout_rate = 0.0
  host = next(_stream(c, c.train.batch_size))
  out = []
  for m in (1, 2):
    c.train.microbatches = m
    s = train.setup(c, sharding.make_mesh(2, 4, 1))
    _, metrics = s.train_step(s.init_state(0), pretraining.global_batch(host, s.batch_sharding))
    out.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  for k in ("loss", "nsp_loss", "mlm_loss", "grad_norm", "param_norm"):
    np.testing.assert_allclose(out[1][k], out[0][k], rtol=1e-5, err_msg=k)


def test_abstract_batch_has_the_packed_shapes():
  c = _packed_config(seq_len=512, max_predictions_per_seq=80)
  ph = phases_lib.Phase(0, 0, 1, 512, 32, 80, 1)
  shapes = {k: v.shape for k, v in fit._abstract_batch(ph, None, c.data).items()}
  r = packing.prediction_budget(512, 80, 0.15, 4)
  assert shapes["segment_ids"] == shapes["position_ids"] == (32, 512)
  assert shapes["cls_positions"] == shapes["nsp_labels"] == shapes["nsp_weights"] == (32, 4)
  assert shapes["masked_positions"] == shapes["masked_weights"] == (32, r)
  c.data.packing = False
  shapes = {k: v.shape for k, v in fit._abstract_batch(ph, None, c.data).items()}
  assert shapes["nsp_labels"] == (32,) and "segment_ids" not in shapes


@pytest.mark.long
@pytest.mark.slow
def test_packed_loop_on_prepared_shards_logs_real_tokens_and_resumes(tmp_path, austen_shards):
  kw = {
      "data.source": "prepared",
      "data.path": str(austen_shards),
      "data.packing": True,
      "eval.every_steps": 0,
  }

  def config():
    c = loop_config(6, **kw)
    c.model.vocab_size = None  # the prepared data's
    return c

  full = tmp_path / "full"
  assert loop.train_and_evaluate(config(), str(full)) == 0
  rows, _ = metrics_rows(full)
  assert sorted(rows) == list(range(1, 7))
  for r in rows.values():
    assert 0.5 < r["real_token_fraction"] <= 1.0 and r["examples_per_row"] >= 1.0
    assert np.isfinite(r["loss"])
  r = rows[6]
  assert r["tokens_per_sec"] == pytest.approx(
      r["seq_per_sec"] / r["examples_per_row"] * 32 * r["real_token_fraction"]
  )
  part = tmp_path / "part"
  run_until(config(), part, 3)
  assert loop.train_and_evaluate(config(), str(part)) == 0
  resumed, _ = metrics_rows(part)
  for step in (4, 5, 6):
    assert resumed[step]["loss"] == rows[step]["loss"]
    assert resumed[step]["real_token_fraction"] == rows[step]["real_token_fraction"]


def test_progress_line_shows_the_real_token_share():
  from bertjax.training import metrics_writer

  m = {"loss": 7.0, "seq_per_sec": 10.0, "tokens_per_sec": 1200.0, "real_token_fraction": 0.956}
  line = metrics_writer.progress_line(5, 10, m)
  assert "1.2k tok/s | 96% real |" in line
  assert "real" not in metrics_writer.progress_line(5, 10, {"loss": 7.0})
