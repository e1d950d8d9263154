"""The TPU path of `ops.attention`: Pallas splash attention, per shard under `shard_map`.

Without a TPU, two ways: the kernel runs in Pallas' interpreter on the 8 fake CPU devices (the
numbers), and the real TPU compiler (libtpu, compile-only devices of a v5p-8 slice, as
tests/test_compile.py uses them) compiles it alone and inside the model (the program).
"""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bertjax import model as model_lib
from bertjax.model import ops
from bertjax.training import sharding

B, L, N, D = 4, 256, 4, 32  # L: two splash blocks


def _segments(rng, batch=B, length=L):
  """Three examples of random lengths per row, then padding (segment 0)."""
  segs = np.zeros((batch, length), np.int32)
  for b in range(batch):
    cuts = np.sort(rng.choice(np.arange(2, length - 8), 3, replace=False))
    for i, (start, end) in enumerate(zip([0, *cuts[:2]], cuts)):
      segs[b, start:end] = i + 1
  return segs


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=(B, L, N, D)), jnp.float32) for _ in range(3))
  return q, k, v, jnp.asarray(_segments(rng))


def _cpu_mesh():
  return Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), sharding.MESH_AXES)


@pytest.fixture
def interpreted(monkeypatch):
  """`ops.attention(backend="tpu")` with the splash kernel in Pallas' interpreter."""
  monkeypatch.setattr(
      ops, "splash_attention", functools.partial(ops.splash_attention, interpret=True)
  )


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 48])
def test_splash_equals_xla_sharded_on_eight_devices(interpreted, window):
  """Batch over data x fsdp, heads over tensor: each shard's kernel sees its own rows."""
  q, k, v, segs = _inputs()
  want = ops.attention(q, k, v, segment_ids=segs, window=window, backend="cpu")
  with jax.set_mesh(_cpu_mesh()), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
    got = jax.jit(
        lambda q, k, v, s: ops.attention(q, k, v, segment_ids=s, window=window, backend="tpu")
    )(q, k, v, segs)
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.slow
def test_splash_takes_the_key_mask_as_segments(interpreted):
  # The unpacked model's [B, 1, 1, L] padding mask: real tokens' outputs are XLA's.
  q, k, v, _ = _inputs(1)
  lengths = np.array([L, 200, 131, 7])
  real = np.arange(L)[None, :] < lengths[:, None]
  mask = model_lib.attention_mask_bias(jnp.asarray(real))
  want = ops.attention(q, k, v, mask=mask, backend="cpu")
  got = jax.jit(lambda q, k, v: ops.attention(q, k, v, mask=mask, backend="tpu"))(q, k, v)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)


def test_tpu_falls_back_to_xla_where_splash_does_not_apply(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("splash attention called")

  monkeypatch.setattr(ops, "splash_attention", refuse)
  q, k, v, segs = _inputs()
  drop = dict(dropout_rate=0.1, dropout_rng=jax.random.key(0), deterministic=False)
  ops.attention(q, k, v, segment_ids=segs, backend="tpu", **drop)  # attention dropout
  ops.attention(q[:, :100], k[:, :100], v[:, :100], backend="tpu")  # not whole blocks
  full = jnp.ones((B, 1, L, L), bool)
  ops.attention(q, k, v, mask=full, backend="tpu")  # a mask that is not a key mask


# ------------------------------------------------------------ the real TPU compiler


@pytest.fixture(scope="module")
def v5p_mesh():
  """A v5p-8 slice (v5p:2x2x1, 4 chips), compile-only: data=2, fsdp=1, tensor=2."""
  pytest.importorskip("libtpu", reason="the TPU compiler: pip install -e '.[tpu]'")
  from bertjax.training import tpu

  devices = tpu.devices(tpu.parse_accelerator("v5p-8"))
  return Mesh(np.array(devices).reshape(2, 1, 2), sharding.MESH_AXES)


def _compile(fn, mesh, *args):
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
    return jax.jit(fn).trace(*args).lower().compile().as_text()


def _kernels(hlo: str) -> int:
  return len(re.findall(r'custom_call_target="tpu_custom_call"', hlo))


def _collectives(hlo: str) -> list[str]:
  ops_ = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
  return [op for op in ops_ if re.search(rf" {op}(-start)?\(", hlo)]


def test_splash_compiles_for_tpu_per_shard(v5p_mesh):
  """Forward and backward: the Pallas kernels, and no communication in the forward pass (the
  shard_map splits batch and heads as the activations already are)."""
  spec = NamedSharding(v5p_mesh, P(("data", "fsdp"), None, "tensor", None))
  qkv = jax.ShapeDtypeStruct((B, L, N, D), jnp.bfloat16, sharding=spec)
  segs = jax.ShapeDtypeStruct((B, L), jnp.int32, sharding=NamedSharding(v5p_mesh, P("data")))

  def forward(q, k, v, s):
    return ops.attention(q, k, v, segment_ids=s, window=64)

  hlo = _compile(forward, v5p_mesh, qkv, qkv, qkv, segs)
  assert _kernels(hlo) == 1 and _collectives(hlo) == [], _collectives(hlo)

  def grads(q, k, v, s):
    loss = lambda q, k, v: jnp.sum(forward(q, k, v, s).astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  hlo = _compile(grads, v5p_mesh, qkv, qkv, qkv, segs)
  assert _kernels(hlo) == 3  # forward, dq, dkv


def _packed_model_program(mesh, deterministic: bool, **cfg_changes) -> str:
  """The compiled HLO of BERT-tiny's forward (or, in training, its gradient) on packed rows."""
  cfg = model_lib.from_preset("tiny", vocab_size=1000, dtype="bfloat16", **cfg_changes)
  m = model_lib.BertForPreTraining(cfg)
  batch = NamedSharding(mesh, P(("data", "fsdp")))
  rows = jax.ShapeDtypeStruct((8, 128), jnp.int32, sharding=batch)
  masked = jax.ShapeDtypeStruct((8, 20), jnp.int32, sharding=batch)
  cls = jax.ShapeDtypeStruct((8, 3), jnp.int32, sharding=batch)
  init = lambda *a: nn.unbox(m.init(jax.random.key(0), *a))
  params = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())),
      jax.eval_shape(init, rows, rows, rows, masked),
  )

  def loss(p, ids, segs, masked, cls):
    out = m.apply(
        p,
        ids,
        jnp.zeros_like(ids),
        None,
        masked,
        segment_ids=segs,
        cls_positions=cls,
        deterministic=deterministic,
        rngs={"dropout": jax.random.key(0)},
    )
    return jnp.sum(out.mlm_hidden.astype(jnp.float32)) + jnp.sum(out.nsp_logits)

  return _compile(loss if deterministic else jax.grad(loss), mesh, params, rows, rows, masked, cls)


@pytest.mark.slow
def test_packed_model_compiles_with_splash_for_tpu(v5p_mesh):
  """BERT-tiny (2 layers) on packed rows: one kernel per layer in eval, three per layer in
  training without attention dropout; with BERT's 0.1, XLA's attention (splash has no
  dropout)."""
  assert _kernels(_packed_model_program(v5p_mesh, deterministic=True)) == 2
  assert _kernels(_packed_model_program(v5p_mesh, False, attention_dropout_rate=0.0)) == 6
  assert _kernels(_packed_model_program(v5p_mesh, deterministic=False)) == 0
