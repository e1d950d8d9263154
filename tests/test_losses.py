"""The fused MLM decoder + cross-entropy equals the plain expression, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.training import losses

B, P, H, V = 3, 5, 16, 97


def _inputs(seed=0, dtype=jnp.float32):
  k = jax.random.split(jax.random.key(seed), 4)
  x = jax.random.normal(k[0], (B, P, H), dtype)
  table = jax.random.normal(k[1], (V, H), jnp.float32) * 0.5
  bias = jax.random.normal(k[2], (V,), jnp.float32)
  labels = jax.random.randint(k[3], (B, P), 0, V)
  return x, table, bias, labels


def _plain(x, table, bias, labels):
  logits = jnp.dot(x, table.astype(x.dtype).T, preferred_element_type=jnp.float32) + bias
  return losses.cross_entropy(logits, labels)


@pytest.mark.slow
def test_values_equal_log_softmax_and_argmax():
  x, table, bias, labels = _inputs()
  nll, correct = losses.mlm_cross_entropy(x, table, bias, labels)
  ref_nll, ref_correct = _plain(x, table, bias, labels)
  assert nll.shape == correct.shape == (B, P)
  np.testing.assert_allclose(nll, ref_nll, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(correct, ref_correct)
  # labels that are the argmax by construction count as correct
  logits = jnp.dot(x, table.T) + bias
  top = jnp.argmax(logits, axis=-1)
  _, correct_top = losses.mlm_cross_entropy(x, table, bias, top)
  np.testing.assert_array_equal(correct_top, np.ones((B, P)))


@pytest.mark.slow
def test_weighted_gradients_equal_autodiff():
  x, table, bias, labels = _inputs(1)
  w = jnp.asarray(np.random.default_rng(0).integers(0, 2, (B, P)), jnp.float32)  # padded slots

  def loss(fn, x, table, bias):
    nll, correct = fn(x, table, bias, labels)
    return jnp.sum(nll * w) / jnp.sum(w) + 0.0 * jnp.sum(correct)

  got = jax.grad(lambda *a: loss(losses.mlm_cross_entropy, *a), argnums=(0, 1, 2))(x, table, bias)
  want = jax.grad(lambda *a: loss(_plain, *a), argnums=(0, 1, 2))(x, table, bias)
  for g, r, name in zip(got, want, ("x", "table", "bias")):
    assert g.shape == r.shape and g.dtype == r.dtype, name
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, err_msg=name)
  assert float(jnp.abs(got[2]).sum()) > 0  # the bias gradient is not trivially zero


@pytest.mark.slow
def test_bfloat16_inputs_keep_their_dtypes():
  x, table, bias, labels = _inputs(2, jnp.bfloat16)
  nll, _ = losses.mlm_cross_entropy(x, table.astype(jnp.bfloat16), bias, labels)
  assert nll.dtype == jnp.float32
  ref, _ = _plain(x, table, bias, labels)
  np.testing.assert_allclose(nll, ref, atol=0.1)
  gx, gt = jax.grad(
      lambda x, t: losses.mlm_cross_entropy(x, t, bias, labels)[0].sum(), argnums=(0, 1)
  )(x, table.astype(jnp.bfloat16))
  assert gx.dtype == gt.dtype == jnp.bfloat16


def test_jits_and_vmaps_like_any_function():
  x, table, bias, labels = _inputs(3)
  f = jax.jit(lambda *a: losses.mlm_cross_entropy(*a)[0])
  np.testing.assert_allclose(
      f(x, table, bias, labels), _plain(x, table, bias, labels)[0], rtol=1e-5, atol=1e-5
  )


def test_accuracy_at_mask_counts_only_positions_whose_input_is_mask():
  from bertjax.data.tokenizer import MASK_ID

  input_ids = np.array([[2, MASK_ID, 7, 8, 3, 0], [2, 9, MASK_ID, MASK_ID, 3, 0]], np.int32)
  batch = dict(
      input_ids=input_ids,
      masked_positions=np.array([[1, 2, 0], [2, 3, 1]], np.int32),  # [1,0] kept as is
      masked_weights=np.array([[1, 1, 0], [1, 0, 1]], np.float32),
  )  # [1,1] padding
  at = np.asarray(losses.at_mask_token(batch))
  np.testing.assert_array_equal(at, [[1, 0, 0], [1, 0, 0]])
  wordpiece = dict(batch, input_ids=np.where(input_ids == MASK_ID, 103, input_ids))
  np.testing.assert_array_equal(np.asarray(losses.at_mask_token(wordpiece, 103)), at)
  assert not np.asarray(losses.at_mask_token(wordpiece)).any()  # the data's id, not a constant
  sums = dict(
      mlm_loss=jnp.float32(3.0),
      mlm_correct=jnp.float32(2.0),
      mlm_count=jnp.float32(4.0),
      nsp_loss=jnp.float32(0.0),
      nsp_correct=jnp.float32(0.0),
      nsp_count=jnp.float32(0.0),
      mask_correct=jnp.float32(1.0),
      mask_count=jnp.float32(2.0),
  )
  out = losses.finalize(sums)
  assert float(out["mask_accuracy"]) == 0.5 and float(out["mlm_accuracy"]) == 0.5
  del sums["mask_correct"], sums["mask_count"]
  assert "mask_accuracy" not in losses.finalize(sums)  # training metrics: not computed
