"""Packed rows: several examples in one row compute exactly what each computes alone.

A packed row holds complete examples back to back ([CLS] A [SEP] B [SEP], each with its own
token types), then padding: `segment_ids` 1..k (0 for padding), positions restarting at each
example, `cls_positions` naming each example's [CLS]. Nothing may leak between examples.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from bertjax import model as model_lib
from bertjax.model import ops

VOCAB, L, E = 64, 32, 3
CLS, SEP, PAD = 2, 3, 0
CFG = model_lib.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=L)


def _example(rng, len_a, len_b, num_masked=2):
  """One NSP example: ids, token types and its own masked positions (never [CLS]/[SEP])."""
  a, b = (rng.integers(5, VOCAB, n) for n in (len_a, len_b))
  ids = np.concatenate([[CLS], a, [SEP], b, [SEP]]).astype(np.int32)
  types = np.concatenate([np.zeros(len_a + 2), np.ones(len_b + 1)]).astype(np.int32)
  words = [i for i in range(len(ids)) if ids[i] not in (CLS, SEP)]
  masked = np.sort(rng.choice(words, num_masked, replace=False)).astype(np.int32)
  return ids, types, masked


def _pack(examples, length=L, max_examples=E):
  """The examples back to back in one row of `length`, padded; absent examples' [CLS] is -1."""
  ids, types, segs, masked, cls = [], [], [], [], []
  for k, (e_ids, e_types, e_masked) in enumerate(examples):
    cls.append(len(ids))
    masked.extend(len(ids) + e_masked)
    ids.extend(e_ids)
    types.extend(e_types)
    segs.extend([k + 1] * len(e_ids))
  pad = length - len(ids)
  assert pad >= 0
  cls += [-1] * (max_examples - len(examples))
  masked += [0] * (2 * max_examples - len(masked))  # padded like the data's masked positions
  row = (ids + [PAD] * pad, types + [0] * pad, segs + [0] * pad, masked, cls)
  return tuple(np.asarray(x, np.int32) for x in row)


def _rows(seed=0):
  """Two packed rows: three examples of different lengths, and two (the third absent)."""
  rng = np.random.default_rng(seed)
  first = [_example(rng, 3, 2), _example(rng, 6, 4), _example(rng, 2, 3)]
  second = [_example(rng, 8, 5), _example(rng, 4, 4)]
  return [first, second], [_pack(first), _pack(second)]


@pytest.fixture(scope="module")
def params():
  ids = np.zeros((1, L), np.int32)
  v = model_lib.BertForPreTraining(CFG).init(jax.random.key(0), ids, ids, ids + 1, ids[:, :2])
  # Move every weight off its init value (LayerNorm 1/0, zero biases), so no part of the
  # network is the identity and every input reaches the output.
  leaves, tree = jax.tree.flatten(nn.unbox(v["params"]))
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return tree.unflatten(
      [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  )


def _alone(params, example):
  """The example as its own row of its own length, as the unpacked model sees it."""
  ids, types, masked = (x[None] for x in example)
  return model_lib.BertForPreTraining(CFG).apply(
      {"params": params}, ids, types, np.ones_like(ids), masked
  )


def _packed(params, rows, cfg=CFG, **kw):
  ids, types, segs, masked, cls = (np.stack(x) for x in zip(*rows))
  return model_lib.BertForPreTraining(cfg).apply(
      {"params": params},
      ids,
      types,
      None,
      masked,
      segment_ids=segs,
      cls_positions=cls,
      **kw,
  )


def _assert_each_example_as_alone(params, examples_per_row, out):
  assert out.nsp_logits.shape == (len(examples_per_row), E, 2)
  assert out.pooled_output.shape == (len(examples_per_row), E, CFG.hidden_size)
  for r, examples in enumerate(examples_per_row):
    start = 0
    for k, example in enumerate(examples):
      n = len(example[0])
      alone = _alone(params, example)
      np.testing.assert_allclose(
          out.sequence_output[r, start : start + n], alone.sequence_output[0], atol=1e-5
      )
      np.testing.assert_allclose(
          out.mlm_logits[r, 2 * k : 2 * k + 2], alone.mlm_logits[0], atol=1e-5
      )
      np.testing.assert_allclose(out.nsp_logits[r, k], alone.nsp_logits[0], atol=1e-5)
      np.testing.assert_allclose(out.pooled_output[r, k], alone.pooled_output[0], atol=1e-5)
      start += n


def test_one_packed_row_equals_its_examples_alone(params):
  examples, rows = _rows()
  out = _packed(params, rows[:1])
  _assert_each_example_as_alone(params, examples[:1], out)
  # The test has teeth: without segment ids the examples see each other.
  ids, types, segs, masked, _ = rows[0]
  leaky = model_lib.BertForPreTraining(CFG).apply(
      {"params": params}, ids[None], types[None], (segs > 0)[None], masked[None]
  )
  assert not np.allclose(leaky.sequence_output[0, :7], out.sequence_output[0, :7], atol=1e-3)


@pytest.mark.slow
def test_a_batch_of_packed_rows_equals_its_examples_alone(params):
  examples, rows = _rows()
  out = jax.jit(lambda p: _packed(p, rows))(params)
  _assert_each_example_as_alone(params, examples, out)


def test_padding_tokens_change_no_real_output(params):
  _, rows = _rows()
  ids, types, segs, masked, cls = rows[0]
  other = (np.where(segs == 0, 7, ids), np.where(segs == 0, 1, types), segs, masked, cls)
  a, b = _packed(params, rows[:1]), _packed(params, [other])
  real = segs > 0
  np.testing.assert_allclose(a.sequence_output[0][real], b.sequence_output[0][real], atol=1e-6)
  np.testing.assert_allclose(a.mlm_logits, b.mlm_logits, atol=1e-6)
  np.testing.assert_allclose(a.nsp_logits, b.nsp_logits, atol=1e-6)


@pytest.mark.slow
def test_packed_rows_sharded_on_eight_devices(params):
  """Batch over data x fsdp, heads over tensor: the same numbers as the examples alone."""
  devices = np.array(jax.devices()[:8]).reshape(2, 2, 2)
  mesh = Mesh(devices, ("data", "fsdp", "tensor"))
  rules = (
      ("batch", ("data", "fsdp")),
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("act_heads", "tensor"),
      ("mlp", "tensor"),
      ("vocab", "tensor"),
  )
  examples, rows = _rows()
  examples, rows = examples * 2, rows * 2  # batch 4 splits 4 ways
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    out = jax.jit(lambda p: _packed(p, rows))(params)
  _assert_each_example_as_alone(params, examples, out)


@pytest.mark.slow
def test_packed_rows_through_scanned_and_rematerialised_layers(params):
  """Segment ids broadcast into every layer of the scan, as the mask does."""
  _, rows = _rows()
  ref = _packed(params, rows)
  cfg = CFG.replace(scan_layers=True, remat="full")
  stacked = model_lib.stack_layer_params(params, CFG.num_layers)
  out = _packed(stacked, rows, cfg=cfg)
  np.testing.assert_allclose(out.sequence_output, ref.sequence_output, atol=1e-5)
  np.testing.assert_allclose(out.nsp_logits, ref.nsp_logits, atol=1e-5)

  # In training too: attention dropout runs with the segment mask, and its gradients flow.
  def loss(p):
    o = _packed(p, rows, cfg=cfg, deterministic=False, rngs={"dropout": jax.random.key(2)})
    return jnp.sum(o.mlm_logits**2) * 1e-3 + jnp.sum(o.nsp_logits)

  grads = jax.jit(jax.grad(loss))(stacked)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_position_ids_restart_at_each_example():
  segs = np.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(
      model_lib.packed_position_ids(jnp.asarray(segs)),
      [[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]],
  )


def test_explicit_position_ids_are_used(params):
  # Given position ids win over the ones derived from the segments.
  _, rows = _rows()
  ids, types, segs, masked, cls = rows[0]
  derived = _packed(params, rows[:1])
  same = _packed(params, rows[:1], position_ids=model_lib.packed_position_ids(segs[None]))
  np.testing.assert_array_equal(same.sequence_output, derived.sequence_output)
  shifted = _packed(params, rows[:1], position_ids=np.arange(L)[None])
  assert not np.allclose(shifted.sequence_output, derived.sequence_output, atol=1e-3)


# ------------------------------------------------------------------------- ops.attention


def _reference(q, k, v, allowed):
  """Dense masked softmax attention in numpy, [B, L, N, D], `allowed` [B, L, L]."""
  logits = np.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(allowed[:, None], logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bnqk,bknd->bqnd", probs, v)


def _qkv_and_segments(seed=0, batch=2, length=24):
  rng = np.random.default_rng(seed)
  q, k, v = (rng.normal(size=(batch, length, 3, 8)).astype(np.float32) for _ in range(3))
  segs = np.zeros((batch, length), np.int32)
  segs[0, :5], segs[0, 5:14], segs[0, 14:20] = 1, 2, 3  # three examples, then padding
  segs[1, :11], segs[1, 11:] = 1, 2  # two examples, no padding
  return q, k, v, segs


@pytest.mark.parametrize("window", [None, 6])
def test_attention_with_segment_ids_equals_dense_masked_softmax(window):
  q, k, v, segs = _qkv_and_segments()
  allowed = segs[:, :, None] == segs[:, None, :]
  if window is not None:
    i = np.arange(segs.shape[1])
    allowed &= np.abs(i[:, None] - i[None, :]) <= window // 2
  want = _reference(q, k, v, allowed)
  for backend in ("cpu", "gpu"):  # XLA over two batch slices, and unsliced
    got = ops.attention(q, k, v, segment_ids=segs, window=window, backend=backend)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_attention_padding_tokens_change_no_real_output():
  q, k, v, segs = _qkv_and_segments()
  pad = (segs == 0)[:, :, None, None]
  noise = np.random.default_rng(9).normal(size=q.shape).astype(np.float32) * 10
  a = ops.attention(q, k, v, segment_ids=segs)
  b = ops.attention(*(np.where(pad, x + noise, x) for x in (q, k, v)), segment_ids=segs)
  real = segs > 0
  np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], atol=1e-6)
  assert not np.allclose(np.asarray(a)[~real], np.asarray(b)[~real])


def test_attention_mask_and_segments_combine():
  # A key mask and segment ids together: a token sees the unmasked keys of its own example.
  q, k, v, segs = _qkv_and_segments()
  keys = np.random.default_rng(3).random(segs.shape) < 0.8
  keys[:, [0, 5, 11, 14]] = True  # no real query's row is empty
  allowed = (segs[:, :, None] == segs[:, None, :]) & keys[:, None, :]
  got = ops.attention(q, k, v, segment_ids=segs, mask=keys[:, None, None, :])
  real = segs > 0
  np.testing.assert_allclose(np.asarray(got)[real], _reference(q, k, v, allowed)[real], atol=1e-5)


def test_attention_argument_errors():
  q, k, v, segs = _qkv_and_segments()
  with pytest.raises(ValueError, match="need a dropout_rng"):
    ops.attention(q, k, v, dropout_rate=0.1, deterministic=False)
  with pytest.raises(ValueError, match="must be rank 4"):
    ops.attention(q, k, v, mask=segs > 0)
