"""The kernels behind the network (bertjax/model/ops.py): each equals its plain JAX version."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.model import ops


@pytest.mark.slow
def test_dot_product_attention_equals_einsum_reference():
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 3, 8)), jnp.float32) for _ in range(3))
  mask = np.ones((2, 6), np.int32)
  mask[0, 4:] = 0
  m = model_lib.attention_mask_bias(jnp.asarray(mask))
  fused = jax.nn.dot_product_attention(q, k, v, mask=m)
  ref = ops.einsum_attention(q, k, v, m)
  np.testing.assert_allclose(fused, ref, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_rate_and_scale(rate):
  x = jnp.ones((64, 128, 257), jnp.float32)  # odd last axis: the bit halves are trimmed
  y = ops.Dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  dropped = float(jnp.mean(y == 0))
  n = x.size
  assert abs(dropped - rate) < 5 * np.sqrt(rate * (1 - rate) / n), dropped
  assert abs(float(jnp.mean(y)) - 1.0) < 0.01  # unbiased: kept values are scaled up
  kept = y[y != 0]
  np.testing.assert_allclose(kept, kept[0])
  # both halves of each random word are used: no column pattern in the mask
  per_column = jnp.mean(y == 0, axis=(0, 1))
  assert abs(float(jnp.mean(per_column[:128])) - float(jnp.mean(per_column[128:256]))) < 0.01
  other = ops.Dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert float(jnp.mean((y == 0) != (other == 0))) > rate  # another key, another mask


@pytest.mark.slow
@pytest.mark.parametrize(
    "key",
    [jax.random.key(3), jax.random.PRNGKey(7), jax.random.fold_in(jax.random.key(1), 5)],
    ids=["typed", "raw", "folded"],
)
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (2, 4, 16, 64)])
def test_random_bits_match_jax_random_bits(key, shape):
  # the written-out threefry must give JAX's own stream, jitted or not
  expected = np.asarray(jax.random.bits(key, shape, jnp.uint32))
  np.testing.assert_array_equal(ops.random_bits(key, shape), expected)
  jitted = jax.jit(ops.random_bits, static_argnums=1)
  np.testing.assert_array_equal(jitted(key, shape), expected)


@pytest.mark.slow
def test_random_bits_are_computed_per_shard():
  # sharded along the batch, each device hashes only its own rows (no full-size array)
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  key = jax.random.key(0)
  shape = (2 * jax.device_count(), 16, 8)
  f = jax.jit(lambda k: ops.random_bits(k, shape), out_shardings=sharding)
  hlo = f.lower(key).compile().as_text()
  assert "u32[%d,16,8]" % shape[0] not in hlo and "u32[2,16,8]" in hlo
  np.testing.assert_array_equal(f(key), jax.random.bits(key, shape, jnp.uint32))


def test_random_bits_other_key_impl_goes_to_jax():
  key = jax.random.key(0, impl="rbg")
  np.testing.assert_array_equal(
      ops.random_bits(key, (4, 3)), jax.random.bits(key, (4, 3), jnp.uint32)
  )


@pytest.mark.slow
def test_dropout_identity_cases_and_dtype():
  x = jax.random.normal(jax.random.key(0), (4, 8), jnp.bfloat16)
  d = ops.Dropout(0.1)
  np.testing.assert_array_equal(d.apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(ops.Dropout(0.0).apply({}, x, deterministic=False), x)
  assert float(jnp.abs(ops.Dropout(1.0).apply({}, x, deterministic=False)).sum()) == 0
  y = d.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  assert y.dtype == jnp.bfloat16


def test_over_batch_chunks_keeps_row_order():
  x = jnp.arange(12.0).reshape(6, 2)
  seen = []

  def fn(a, b):
    seen.append(np.asarray(a[:, 0]))
    return a * 10 + b

  out = ops.over_batch_chunks(fn, 3, x, x)
  np.testing.assert_array_equal(out, x * 11)
  # interleaved slices: rows 0 and 3, 1 and 4, 2 and 5
  np.testing.assert_array_equal(np.stack(seen), [[0, 6], [2, 8], [4, 10]])


def test_flat_dot_general_equals_dot_general():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, 8)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
  dn = (((2,), (0,)), ((), ()))
  ref = lambda x, w: jnp.sum(jnp.sin(jax.lax.dot_general(x, w, dn)))
  flat = lambda x, w: jnp.sum(jnp.sin(ops.flat_dot_general(x, w, dn)))
  assert ops.flat_dot_general(x, w, dn).shape == (3, 5, 4)
  np.testing.assert_allclose(flat(x, w), ref(x, w), rtol=1e-6)
  for g, g_ref in zip(jax.grad(flat, (0, 1))(x, w), jax.grad(ref, (0, 1))(x, w)):
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6)


def _qkv_mask(batch=6, seed=1):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=(batch, 8, 2, 4)), jnp.float32) for _ in range(3))
  mask = np.ones((batch, 8), np.int32)
  mask[1, 5:] = 0
  mask[4, 2:] = 0
  return q, k, v, model_lib.attention_mask_bias(jnp.asarray(mask))


def test_attention_slices_the_batch_by_backend():
  assert ops.platform() == "cpu"
  assert ops.attention_chunks(0, 6) == 2 and ops.attention_chunks(0, 5) == 1
  assert ops.attention_chunks(0, 6, "tpu") == 1 and ops.attention_chunks(0, 6, "gpu") == 1
  assert ops.attention_chunks(4, 6) == 1 and ops.attention_chunks(3, 6) == 3


def test_attention_with_a_key_mask_is_dot_product_attention():
  # The model's unpacked path: the same numbers as `jax.nn.dot_product_attention`, to the bit.
  q, k, v, m = _qkv_mask()
  want = jax.nn.dot_product_attention(q, k, v, mask=m)
  for chunks in (1, 2):
    np.testing.assert_array_equal(ops.attention(q, k, v, mask=m, batch_chunks=chunks), want)


@pytest.mark.parametrize("deterministic", [True, False])
def test_attention_batch_chunks_compute_the_same_function(deterministic):
  # in training (attention dropout drawn for the whole batch) and in eval; 6 rows: 1, 2, 3
  # and 6 slices; 4 does not divide 6 and runs unsliced
  q, k, v, m = _qkv_mask()
  rng = jax.random.key(5)

  def run(chunks):
    def loss(q, k, v):
      out = ops.attention(
          q,
          k,
          v,
          mask=m,
          dropout_rate=0.3,
          dropout_rng=rng,
          deterministic=deterministic,
          batch_chunks=chunks,
      )
      return jnp.sum(jnp.sin(out)), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

  (_, ref), ref_grads = run(1)
  for chunks in (2, 3, 4, 6):
    (_, out), grads = run(chunks)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), grads, ref_grads)
  plain = ops.attention(q, k, v, mask=m)
  assert np.allclose(ref, plain, atol=1e-6) == deterministic  # dropout only in training


def test_attention_dropout_is_the_einsum_reference_with_keep_mask():
  q, k, v, m = _qkv_mask()
  rng = jax.random.key(7)
  got = ops.attention(q, k, v, mask=m, dropout_rate=0.2, dropout_rng=rng, deterministic=False)
  keep, scale = ops.keep_mask(rng, 0.2, (6, 2, 8, 8))
  np.testing.assert_allclose(got, ops.einsum_attention(q, k, v, m, keep, scale), atol=1e-6)
  assert 0.1 < 1 - float(jnp.mean(keep)) < 0.3
  other = ops.attention(
      q, k, v, mask=m, dropout_rate=0.2, dropout_rng=jax.random.key(8), deterministic=False
  )
  assert not np.allclose(got, other, atol=1e-3)


@pytest.mark.slow
def test_attention_batch_slices_add_no_communication():
  # batch 16 over 8 devices, in 2 interleaved slices: each device keeps its own rows, so the
  # sliced program communicates no more than the unsliced one (nothing, for attention alone),
  # dropout mask included
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  qkv = jax.ShapeDtypeStruct((16, 8, 2, 4), jnp.float32, sharding=rows)
  mask = jax.ShapeDtypeStruct((16, 1, 1, 8), jnp.bool_, sharding=rows)
  collectives = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
  for chunks in (1, 2):
    f = lambda q, k, v, m: ops.attention(
        q,
        k,
        v,
        mask=m,
        dropout_rate=0.1,
        dropout_rng=jax.random.key(0),
        deterministic=False,
        batch_chunks=chunks,
    )
    hlo = jax.jit(f, out_shardings=rows).lower(qkv, qkv, qkv, mask).compile().as_text()
    assert not [op for op in collectives if f" {op}(" in hlo or f" {op}-start(" in hlo], chunks
