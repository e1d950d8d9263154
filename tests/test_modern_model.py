"""The ModernBERT switches of `BertConfig`: validation, the network they build, packed rows,
local windows, rotary positions, `scan_layers`, and training on 1 vs 8 devices (data x fsdp x
tensor and pure FSDP). transformers' numbers are in test_modern_interop.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertjax import model as model_lib
from bertjax.model import bert, rope
from bertjax.model.config import BertConfig
from bertjax.training import sharding

from conftest import tiny_config

VOCAB, L = 64, 32
MODERN_FIELDS = dict(
    norm_placement="pre",
    mlp_type="glu",
    position_embedding="rope",
    rope_theta=160000.0,
    local_rope_theta=10000.0,
    use_bias=False,
    type_vocab_size=0,
    local_attention=8,
    global_every=3,
)
CFG = BertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_layers=4,
    num_heads=4,
    intermediate_size=48,
    max_position_embeddings=L,
    hidden_dropout_rate=0.0,
    attention_dropout_rate=0.0,
    **MODERN_FIELDS,
)


def _params(cfg=CFG, seed=0):
  """Initial parameters moved off their init values (LayerNorm 1/0), so every path matters."""
  ids = np.zeros((1, 8), np.int32)
  v = model_lib.BertForPreTraining(cfg).init(jax.random.key(seed), ids, ids, ids + 1, ids[:, :2])
  leaves, tree = jax.tree.flatten(nn.unbox(v["params"]))
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return tree.unflatten([x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _apply(params, ids, cfg=CFG, **kw):
  return model_lib.BertForPreTraining(cfg).apply({"params": params}, ids, **kw)


# ------------------------------------------------------------------------------------ config


def test_defaults_are_bert_and_fields_round_trip():
  c = BertConfig()
  assert (c.norm_placement, c.mlp_type, c.position_embedding) == ("post", "dense", "learned")
  assert (c.use_bias, c.local_attention, c.global_every, c.type_vocab_size) == (True, 0, 1, 2)
  assert BertConfig.from_dict(CFG.to_dict()) == CFG


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("norm_placement", "middle", "norm_placement='middle'; valid: 'post', 'pre'"),
        ("mlp_type", "swiglu", "mlp_type='swiglu'; valid: 'dense', 'glu'"),
        ("position_embedding", "alibi", "position_embedding='alibi'; valid: 'learned', 'rope'"),
        ("local_attention", -1, "local_attention=-1"),
        ("global_every", 0, "global_every=0"),
        ("rope_theta", 0.0, "rope_theta=0.0"),
        ("type_vocab_size", -1, "type_vocab_size=-1"),
    ],
)
def test_invalid_switches_name_field_and_valid_values(field, value, needle):
  with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
    BertConfig(**{field: value})


@pytest.mark.parametrize(
    "window, every, needle",
    [
        (7, 3, "local_attention=7: must be even"),
        (8, 1, "local_attention=8 with global_every=1: every layer is global"),
        (0, 3, "global_every=3 with local_attention=0: the layers between global ones"),
    ],
)
def test_a_window_and_a_period_come_together_in_the_config_itself(window, every, needle):
  # A BertConfig built in Python is held to the rule the pretraining config is: one without the
  # other would silently run every layer global.
  with pytest.raises(ValueError, match=f"^BertConfig: {needle}"):
    BertConfig(local_attention=window, global_every=every)
  assert BertConfig(local_attention=8, global_every=3).heterogeneous_layers


def test_scan_layers_is_refused_for_layers_that_differ():
  with pytest.raises(ValueError, match=r"norm_placement='pre' .* set scan_layers=False"):
    CFG.replace(scan_layers=True)
  with pytest.raises(ValueError, match="local_attention=8 with global_every=3"):
    BertConfig(local_attention=8, global_every=3, scan_layers=True)


def test_scan_of_identical_modern_layers_equals_the_loop():
  # Post-LN with GLU, RoPE, no biases, all layers global: identical layers, so scan works.
  cfg = CFG.replace(norm_placement="post", local_attention=0, global_every=1)
  params = _params(cfg)
  ids = np.random.default_rng(0).integers(1, VOCAB, (2, 16))
  ref = _apply(params, ids, cfg).sequence_output
  stacked = model_lib.stack_layer_params(params, cfg.num_layers)
  got = _apply(stacked, ids, cfg.replace(scan_layers=True, remat="full")).sequence_output
  np.testing.assert_allclose(got, ref, atol=1e-5)


# ----------------------------------------------------------------------------------- network


def test_modern_parameter_tree_and_logical_axes():
  boxed = jax.eval_shape(
      lambda: model_lib.BertForPreTraining(CFG).init(
          jax.random.key(0), *model_lib.dummy_inputs(1, 8).values()
      )
  )["params"]
  names = jax.tree.map(lambda x: x.names, boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  enc = names["bert"]["encoder"]
  assert enc["layer_1"] == {
      "attention": {
          "qkv": {"kernel": ("embed", "qkv", "heads", "kv")},
          "out": {"kernel": ("heads", "kv", "embed")},
      },
      "attention_layer_norm": {"scale": ("embed",)},
      "mlp_layer_norm": {"scale": ("embed",)},
      "intermediate": {"kernel": ("embed", "glu", "mlp")},
      "output": {"kernel": ("mlp", "embed")},
  }
  assert "attention_layer_norm" not in enc["layer_0"]  # ModernBERT's identity
  assert set(names["bert"]["embeddings"]) == {"word_embeddings", "layer_norm"}
  assert names["bert"]["final_layer_norm"] == {"scale": ("embed",)}
  assert set(names["mlm_transform"]) == {"kernel"}  # no bias; the decoder's bias stays
  assert names["mlm_bias"] == ("vocab",)
  # Every parameter is placed by the rules: the GLU's input/gate axis stays whole.
  mesh = sharding.make_mesh(1, 4, 2)
  specs = sharding.state_shardings(boxed, mesh)
  layer = specs["bert"]["encoder"]["layer_1"]
  assert layer["intermediate"]["kernel"].spec == P("fsdp", None, "tensor")
  assert layer["output"]["kernel"].spec == P("tensor", "fsdp")
  assert layer["mlp_layer_norm"]["scale"].spec == P("fsdp")


def test_token_types_are_ignored_without_a_type_table():
  params = _params()
  ids = np.random.default_rng(1).integers(1, VOCAB, (2, 16))
  a = _apply(params, ids, token_type_ids_BxL=np.zeros_like(ids)).sequence_output
  b = _apply(params, ids, token_type_ids_BxL=np.ones_like(ids)).sequence_output
  np.testing.assert_array_equal(a, b)


def test_a_local_layer_sees_only_its_window():
  # Layer 1 is local (window 8: |i - j| <= 4): a key 5 tokens away does not reach query 0,
  # a key 4 away does; a global layer sees both.
  x = jax.random.normal(jax.random.key(0), (1, 16, CFG.hidden_size))
  positions = jnp.arange(16)[None]

  def out(is_global, changed):
    attn = bert.Attention(CFG, True, is_global)
    v = attn.init(jax.random.key(1), x, None, None, positions)
    y = x.at[0, changed].add(1.0)
    return (
        attn.apply(v, y, None, None, positions)[0, 0],
        attn.apply(v, x, None, None, positions)[0, 0],
    )

  far, near = 5, 4
  np.testing.assert_array_equal(*out(False, far))
  assert not np.allclose(*out(False, near))
  assert not np.allclose(*out(True, far))


def test_local_windows_change_the_model():
  params = _params()
  ids = np.random.default_rng(2).integers(1, VOCAB, (2, L))
  local = _apply(params, ids).sequence_output
  global_only = _apply(params, ids, CFG.replace(local_attention=0, global_every=1)).sequence_output
  assert np.abs(local - global_only).max() > 1e-2


def test_rope_products_depend_on_relative_positions_only():
  rng = np.random.default_rng(3)
  q, k = (rng.normal(size=(1, 1, 2, 8)).astype(np.float32) for _ in range(2))
  dot = lambda i, j: np.sum(
      rope.rotate(q, np.array([[i]]), 10000.0) * rope.rotate(k, np.array([[j]]), 10000.0), -1
  )
  np.testing.assert_allclose(dot(3, 7), dot(10, 14), atol=1e-5)
  assert not np.allclose(dot(3, 7), dot(3, 8), atol=1e-3)


# ------------------------------------------------------------------------------ packed rows


def _example(rng, n):
  ids = rng.integers(1, VOCAB, n).astype(np.int32)
  return ids, np.sort(rng.choice(n, 2, replace=False)).astype(np.int32)


def test_packed_rows_equal_each_example_alone():
  """Windows combine with segment ids, and RoPE reads the positions that restart per example."""
  rng = np.random.default_rng(4)
  examples = [_example(rng, n) for n in (7, 13, 9)]
  ids, segs, masked = [], [], []
  for k, (e_ids, e_masked) in enumerate(examples):
    masked.extend(len(ids) + e_masked)
    ids.extend(e_ids)
    segs.extend([k + 1] * len(e_ids))
  pad = L - len(ids)
  row = lambda x, fill: np.asarray(x + [fill] * pad, np.int32)[None]
  params = _params()
  out = _apply(
      params,
      row(ids, 0),
      masked_positions_BxP=np.asarray(masked, np.int32)[None],
      segment_ids=row(segs, 0),
      cls_positions=np.array([[0, 7, 20]]),
  )
  start = 0
  for k, (e_ids, e_masked) in enumerate(examples):
    alone = _apply(params, e_ids[None], masked_positions_BxP=e_masked[None])
    n = len(e_ids)
    np.testing.assert_allclose(
        out.sequence_output[0, start : start + n], alone.sequence_output[0], atol=1e-5
    )
    np.testing.assert_allclose(out.mlm_logits[0, 2 * k : 2 * k + 2], alone.mlm_logits[0], atol=1e-5)
    np.testing.assert_allclose(out.nsp_logits[0, k], alone.nsp_logits[0], atol=1e-5)
    start += n
  # The test has teeth: the same row without segment ids lets the examples see each other.
  leaky = _apply(params, row(ids, 0), attention_mask_BxL=row(segs, 0) > 0)
  assert not np.allclose(leaky.sequence_output[0, 7:20], out.sequence_output[0, 7:20], atol=1e-3)


# ----------------------------------------------------------------------- 1 vs 8 devices


def modern_tiny_config():
  """conftest's tiny pretraining config with the ModernBERT block (4 layers: layer 0 and 3
  global, 1 and 2 local with a window of 8 at length 32)."""
  c = tiny_config(warmup_steps=0, learning_rate=1e-3)
  c.model.num_layers = 4
  for field, value in MODERN_FIELDS.items():
    c.model[field] = value
  return c


@pytest.mark.long
@pytest.mark.slow
def test_modern_one_device_equals_eight_devices():
  from test_train import _losses

  c = modern_tiny_config()  # dropout stays on
  one, _ = _losses(c, sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
  for mesh in (sharding.make_mesh(2, 2, 2), sharding.make_mesh(1, 8, 1)):  # 3 axes; pure FSDP
    many, state = _losses(c, mesh)
    np.testing.assert_allclose(many, one, rtol=1e-5)
    kernel = state.params["bert"]["encoder"]["layer_1"]["intermediate"]["kernel"]
    assert len(kernel.sharding.device_set) == 8
  assert np.all(np.isfinite(one))
