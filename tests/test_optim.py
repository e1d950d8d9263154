"""Optimiser: BERT's weight-decay mask, the schedules, and exact gradient accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import optim, sharding, train
from bertjax.data import pretraining
from tests.test_sharding import tiny_config


def test_decay_mask_excludes_layer_norm_and_biases():
  params = {"dense": {"kernel": 1, "bias": 2}, "layer_norm": {"scale": 3, "bias": 4},
            "mlm_bias": 5, "emb": {"embedding": 6}}
  assert optim.decay_mask(params) == {"dense": {"kernel": True, "bias": False},
                                      "layer_norm": {"scale": False, "bias": False},
                                      "mlm_bias": False, "emb": {"embedding": True}}


def test_adamw_decays_weights_only():
  c = tiny_config(learning_rate=1.0, warmup_steps=0, clip_norm=0.0)
  tx = optim.make_optimizer(c.train, lambda _: 1.0)
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,)), "scale": jnp.ones((2,))}
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], -0.01 * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_array_equal(updates["bias"], 0.0)
  np.testing.assert_array_equal(updates["scale"], 0.0)


def test_warmup_then_linear_decay_to_zero():
  f = optim.warmup_linear_decay(1e-4, 10, 100)
  assert float(f(0)) == 0.0
  assert float(f(10)) == pytest.approx(1e-4)
  assert float(f(55)) == pytest.approx(0.5e-4)
  assert float(f(100)) == pytest.approx(0.0, abs=1e-12)


def test_two_phase_schedules():
  c = tiny_config(steps=100, learning_rate=6e-3, warmup_steps=10)
  c.phase2.fraction, c.phase2.learning_rate, c.phase2.warmup_steps = 0.2, 4e-3, 5
  assert optim.phase2_start(c.train, c.phase2) == 80
  one = optim.make_schedule(c.train, c.phase2)  # BERT: one schedule over both phases
  assert float(one(80)) == pytest.approx(6e-3 * 20 / 90)
  c.phase2.restart_schedule = True  # LAMB: phase 2 warms up again to its own peak
  two = optim.make_schedule(c.train, c.phase2)
  assert float(two(79)) < 1e-3 and float(two(80)) == 0.0
  assert float(two(85)) == pytest.approx(4e-3)


def _batch(c, mesh, step=0):
  cfg = pretraining.InputConfig(source="synthetic", seq_len=c.data.seq_len,
                                max_predictions_per_seq=c.data.max_predictions_per_seq,
                                vocab_size=c.model.vocab_size, seed=0)
  stream = pretraining.make_stream(cfg, global_batch_size=c.train.batch_size, process_index=0,
                                   process_count=1, state={"step": step})
  return pretraining.global_batch(next(stream), sharding.batch_sharding(mesh))


@pytest.mark.parametrize("microbatches", [4])
def test_gradient_accumulation_is_exact(microbatches):
  """Sums, not means of means: accumulation gives the whole batch's loss and update."""
  mesh = sharding.make_mesh(2, 2, 2)
  results = []
  for m in (1, microbatches):
    c = tiny_config(microbatches=m, warmup_steps=0)
    c.model.hidden_dropout_rate = c.model.attention_dropout_rate = 0.0
    s = train.setup(c, mesh)
    state, metrics = s.train_step(s.init_state(0), _batch(c, mesh))
    results.append((jax.device_get(metrics), jax.device_get(state.params)))
  (m1, p1), (m2, p2) = results
  for k in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm"):
    assert m2[k] == pytest.approx(m1[k], rel=1e-5), k
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p1, p2)
