"""The Flax BERT is the same network as transformers' BertForPreTraining, and its variants agree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax.linen as nn

from bertjax import model as model_lib
from bertjax.interop import convert
from bertjax.training import losses

B, L, P = 3, 16, 4


def _batch(vocab, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[1, 10:] = 0  # padding in one row
  mask[2, 5:] = 0
  ids[mask == 0] = 0
  types = np.zeros((B, L), np.int32)
  types[:, 6:] = 1  # both segments
  types[mask == 0] = 0
  pos = np.stack([rng.choice(int(m.sum()), size=P, replace=False) for m in mask]).astype(np.int32)
  return ids, types, mask, pos


def _init(cfg, seed=0):
  ids, types, mask, pos = _batch(cfg.vocab_size)
  v = model_lib.BertForPreTraining(cfg).init(jax.random.key(seed), ids, types, mask, pos)
  return nn.unbox(v["params"])


def _apply(cfg, params, batch, **kw):
  ids, types, mask, pos = batch
  return model_lib.BertForPreTraining(cfg).apply(
      {"params": params}, ids, types, mask, pos, deterministic=True, **kw
  )


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  hf_cfg = transformers.BertConfig(
      vocab_size=99,
      hidden_size=32,
      num_hidden_layers=2,
      num_attention_heads=4,
      intermediate_size=64,
      max_position_embeddings=64,
      hidden_act="gelu",
  )
  m = transformers.BertForPreTraining(hf_cfg).eval()
  with torch.no_grad():  # move every weight off its init value (LayerNorm 1/0, zero biases)
    for p in m.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  path = tmp_path_factory.mktemp("hf")
  m.save_pretrained(path)
  return m, path


@pytest.mark.slow
def test_parity_with_transformers(hf_model):
  torch = pytest.importorskip("torch")
  m, path = hf_model
  cfg, params = convert.load_hf(path)
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (2, 32, 4)
  batch = _batch(cfg.vocab_size)
  ids, types, mask, pos = batch
  out = _apply(cfg, params, batch)
  with torch.no_grad():
    ref = m(
        input_ids=torch.tensor(ids, dtype=torch.long),
        token_type_ids=torch.tensor(types, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        output_hidden_states=True,
    )
  seq_ref = ref.hidden_states[-1].numpy()
  mlm_ref = np.take_along_axis(ref.prediction_logits.numpy(), pos[:, :, None], axis=1)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.sequence_output)[real], seq_ref[real], atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.mlm_logits), mlm_ref, atol=1e-5)
  np.testing.assert_allclose(
      np.asarray(out.nsp_logits), ref.seq_relationship_logits.numpy(), atol=1e-5
  )
  assert out.mlm_logits.shape == (B, P, cfg.vocab_size)
  assert out.pooled_output.shape == (B, cfg.hidden_size)


def test_hf_roundtrip_is_exact(hf_model, tmp_path):
  _, path = hf_model
  cfg, params = convert.load_hf(path)
  convert.save_hf(params, cfg, tmp_path / "out")
  cfg2, params2 = convert.load_hf(tmp_path / "out")
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params, params2)


@pytest.mark.slow
def test_masked_lm_and_base_model_directories_load_with_fresh_heads(hf_model, tmp_path):
  """What transformers' run_mlm.py saves (`BertForMaskedLM`: no pooler, no NSP head) and a bare
  `BertModel` (no MLM or NSP head) load: their own tensors exactly, so equal MLM logits or
  encoder outputs; the heads they lack start fresh and are named."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  pretraining, _ = hf_model
  batch = _batch(pretraining.config.vocab_size)
  ids, types, mask, pos = batch
  inputs = dict(
      input_ids=torch.tensor(ids, dtype=torch.long),
      token_type_ids=torch.tensor(types, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
  )
  real = mask.astype(bool)

  mlm = transformers.BertForMaskedLM(pretraining.config).eval()
  mlm.load_state_dict(pretraining.state_dict(), strict=False)  # its weights, moved off init
  assert mlm.bert.pooler is None
  mlm.save_pretrained(tmp_path / "mlm")
  fresh = []
  cfg, params = convert.load_hf(tmp_path / "mlm", fresh=fresh)
  assert fresh == ["the pooler", "the NSP head"]
  out = _apply(cfg, params, batch)
  with torch.no_grad():
    logits = mlm(**inputs).logits.numpy()
  np.testing.assert_allclose(
      np.asarray(out.mlm_logits), np.take_along_axis(logits, pos[:, :, None], axis=1), atol=1e-5
  )
  ref = convert.load_hf(hf_model[1])[1]  # the same tensors from BertForPreTraining
  jax.tree.map(np.testing.assert_array_equal, params["bert"]["encoder"], ref["bert"]["encoder"])
  fresh_heads = convert._fresh_heads(cfg)
  jax.tree.map(np.testing.assert_array_equal, params["nsp"], fresh_heads["nsp"])

  base = pretraining.bert.eval()
  base.save_pretrained(tmp_path / "base")
  fresh = []
  cfg, params = convert.load_hf(tmp_path / "base", fresh=fresh)
  assert fresh == ["the NSP head", "the MLM head"]
  out = _apply(cfg, params, batch)
  with torch.no_grad():
    want = base(**inputs)
  np.testing.assert_allclose(
      np.asarray(out.sequence_output)[real], want.last_hidden_state.numpy()[real], atol=1e-5
  )
  np.testing.assert_allclose(np.asarray(out.pooled_output), want.pooler_output.numpy(), atol=1e-5)
  jax.tree.map(np.testing.assert_array_equal, params["mlm_transform"], fresh_heads["mlm_transform"])
  # Saved back, it is a BertForPreTraining directory transformers reads without a missing key.
  convert.save_hf(params, cfg, tmp_path / "back")
  _, info = transformers.BertForPreTraining.from_pretrained(
      tmp_path / "back", output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_load_hf_errors_name_the_file(tmp_path):
  with pytest.raises(convert.ConversionError, match="config.json: not found"):
    convert.load_hf(tmp_path)
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(convert.ConversionError, match=r"config.json:1: invalid JSON"):
    convert.load_hf(tmp_path)


@pytest.mark.slow
def test_padding_tokens_change_no_real_output():
  cfg = model_lib.from_preset("tiny", vocab_size=64, max_position_embeddings=32)
  params = _init(cfg)
  batch = _batch(cfg.vocab_size)
  ids, types, mask, pos = batch
  ids2 = np.where(mask == 0, 7, ids)  # different tokens at padded positions only
  a = _apply(cfg, params, batch)
  b = _apply(cfg, params, (ids2, types, mask, pos))
  real = mask.astype(bool)
  np.testing.assert_allclose(
      np.asarray(a.sequence_output)[real], np.asarray(b.sequence_output)[real], atol=1e-6
  )
  np.testing.assert_allclose(a.mlm_logits, b.mlm_logits, atol=1e-5)
  np.testing.assert_allclose(a.nsp_logits, b.nsp_logits, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("remat,scan", [("full", False), ("none", True), ("dots", True)])
def test_remat_and_scan_equal_plain_stack(remat, scan):
  cfg = model_lib.from_preset("tiny", vocab_size=64, max_position_embeddings=32)
  params = _init(cfg)
  batch = _batch(cfg.vocab_size)
  ref = _apply(cfg, params, batch)
  cfg2 = cfg.replace(remat=remat, scan_layers=scan)
  params2 = model_lib.stack_layer_params(params, cfg.num_layers) if scan else params
  out = _apply(cfg2, params2, batch)
  np.testing.assert_allclose(out.mlm_logits, ref.mlm_logits, atol=1e-5)
  np.testing.assert_allclose(out.sequence_output, ref.sequence_output, atol=1e-5)

  # Gradients agree too (remat changes only what is saved for the backward pass).
  def loss(p, c):
    return _apply(c, p, batch).mlm_logits.sum()

  g_ref = (
      model_lib.stack_layer_params(jax.grad(loss)(params, cfg), cfg.num_layers)
      if scan
      else jax.grad(loss)(params, cfg)
  )
  g = jax.grad(loss)(params2, cfg2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), g, g_ref)
  assert jax.tree.structure(model_lib.unstack_layer_params(params2)) == jax.tree.structure(params)


@pytest.mark.slow
def test_scanned_init_has_layer_axis():
  cfg = model_lib.from_preset("tiny", vocab_size=64, scan_layers=True)
  ids, types, mask, pos = _batch(64)
  v = model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, types, mask, pos)
  qkv = v["params"]["bert"]["encoder"]["layers"]["attention"]["qkv"]["kernel"]
  assert qkv.names == ("layers", "embed", "qkv", "heads", "kv")
  assert qkv.value.shape == (2, 128, 3, 2, 64)


@pytest.mark.slow
def test_bf16_compute_close_to_fp32():
  cfg = model_lib.from_preset("tiny", vocab_size=64, max_position_embeddings=32)
  params = _init(cfg)
  batch = _batch(cfg.vocab_size)
  ref = _apply(cfg, params, batch)
  out = _apply(cfg.replace(dtype="bfloat16"), params, batch)
  assert out.sequence_output.dtype == jnp.bfloat16
  assert out.mlm_logits.dtype == jnp.float32  # losses are always computed in float32
  # bf16 keeps 8 mantissa bits (~0.4% relative); through 2 layers the logits stay within 0.1.
  np.testing.assert_allclose(out.mlm_logits, ref.mlm_logits, atol=0.1)
  np.testing.assert_allclose(out.nsp_logits, ref.nsp_logits, atol=0.1)


def test_every_param_has_logical_axes():
  cfg = model_lib.from_preset("tiny", vocab_size=64)
  ids, types, mask, pos = _batch(64)
  v = jax.eval_shape(
      lambda: model_lib.BertForPreTraining(cfg).init(jax.random.key(0), ids, types, mask, pos)
  )
  leaves = jax.tree.leaves(v["params"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  for x in leaves:
    assert len(x.names) == len(x.value.shape)


@pytest.mark.parametrize("preset,low,high", [("base", 109e6, 111e6), ("large", 334e6, 337e6)])
def test_preset_parameter_counts(preset, low, high):
  cfg = model_lib.from_preset(preset)
  d = model_lib.dummy_inputs()
  shapes = jax.eval_shape(
      lambda: model_lib.BertForPreTraining(cfg).init(
          jax.random.key(0),
          d["input_ids"],
          d["token_type_ids"],
          d["attention_mask"],
          d["masked_positions"],
      )
  )
  n = model_lib.count_params(shapes["params"])
  # Published: BERT-base 110M, BERT-large 340M (the paper rounds; HF's BertForPreTraining has
  # 110.1M and 336.2M with the 30522-token vocabulary).
  assert low <= n <= high, n


def test_config_errors_are_clear():
  with pytest.raises(ValueError, match="unknown preset 'huge'"):
    model_lib.from_preset("huge")
  with pytest.raises(ValueError, match="not divisible by num_heads"):
    model_lib.BertConfig(hidden_size=100, num_heads=3)


@pytest.mark.slow
def test_sequence_classification_head():
  cfg = model_lib.from_preset("tiny", vocab_size=64)
  ids, types, mask, _ = _batch(64)
  m = model_lib.BertForSequenceClassification(cfg, num_labels=3)
  v = m.init(jax.random.key(0), ids, types, mask)
  logits = m.apply(v, ids, types, mask, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert logits.shape == (B, 3) and logits.dtype == jnp.float32
  assert set(nn.unbox(v["params"])) == {"bert", "classifier"}


def test_mean_pooling_head_reads_the_mean_of_the_real_tokens():
  """pooling="mean": the classifier's input is the mean of the last layer over the real tokens,
  so padding changes nothing; the same weights with BERT's pooled [CLS] give other logits."""
  cfg = model_lib.from_preset("tiny", vocab_size=64)
  ids, types, mask, _ = _batch(64)
  mean = model_lib.BertForSequenceClassification(cfg, num_labels=3, pooling="mean")
  v = nn.unbox(mean.init(jax.random.key(0), ids, types, mask))
  ids2 = np.where(mask == 0, 7, ids)
  a, b = (mean.apply(v, x, types, mask) for x in (ids, ids2))
  np.testing.assert_allclose(a, b, atol=1e-6)
  enc = model_lib.BertModel(cfg).apply({"params": v["params"]["bert"]}, ids, types, mask)
  m = np.asarray(mask, np.float32)[:, :, None]
  want_BxH = (np.asarray(enc.sequence_output) * m).sum(1) / m.sum(1)
  k, bias = (v["params"]["classifier"][n] for n in ("kernel", "bias"))
  np.testing.assert_allclose(a, want_BxH @ np.asarray(k) + np.asarray(bias), atol=1e-5)
  cls = model_lib.BertForSequenceClassification(cfg, num_labels=3)
  assert not np.allclose(a, cls.apply(v, ids, types, mask), atol=1e-3)


@pytest.mark.slow
def test_model_imports_without_tensorflow():
  import subprocess, sys

  code = (
      "import sys; sys.modules['tensorflow'] = None\n"
      "import bertjax.model, bertjax.interop.convert\n"
      "print('ok')"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@pytest.mark.slow
def test_applies_under_a_mesh_with_logical_rules():
  """Full-rank logical names must be valid for the kernels as created (no flat reshapes)."""
  from jax.sharding import Mesh

  devices = np.array(jax.devices()[:8]).reshape(2, 2, 2)
  mesh = Mesh(devices, ("data", "fsdp", "tensor"))
  rules = (
      ("batch", ("data", "fsdp")),
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("mlp", "tensor"),
      ("vocab", "tensor"),
  )
  cfg = model_lib.from_preset("tiny", vocab_size=64, max_position_embeddings=32)
  batch = _batch(cfg.vocab_size)
  ids, types, mask, pos = (np.concatenate([x, x[:1]]) for x in batch)  # batch 4 splits 4 ways
  m = model_lib.BertForPreTraining(cfg)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    v = jax.jit(m.init)(jax.random.key(0), ids, types, mask, pos)
    out = jax.jit(lambda p: m.apply(p, ids, types, mask, pos))(v)
  kernel = v["params"]["bert"]["encoder"]["layer_0"]["attention"]["qkv"]["kernel"]
  assert kernel.value.shape == (128, 3, 2, 64)
  ref = m.apply(nn.unbox(v), ids, types, mask, pos)
  np.testing.assert_allclose(out.mlm_logits, ref.mlm_logits, atol=1e-5)


@pytest.mark.slow
def test_pretraining_output_feeds_the_fused_mlm_loss():
  # the train step scores the vocabulary fused with the loss; it equals the logits' loss
  cfg = model_lib.BertConfig.from_preset("tiny", vocab_size=100)
  out = _apply(cfg, _init(cfg), _batch(cfg.vocab_size))
  labels = np.random.default_rng(1).integers(0, cfg.vocab_size, (B, P)).astype(np.int32)
  fused_nll, fused_correct = losses.mlm_cross_entropy(
      out.mlm_hidden, out.mlm_table, out.mlm_bias, labels
  )
  nll, correct = losses.cross_entropy(out.mlm_logits, labels)
  assert out.mlm_logits.shape == (B, P, cfg.vocab_size)
  np.testing.assert_allclose(fused_nll, nll, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(fused_correct, correct)


def test_retired_attention_batch_chunks_field_still_loads():
  # bert_config.json files and checkpoints written before the attention hook carry the field
  cfg = model_lib.BertConfig.from_preset("tiny", vocab_size=100)
  assert "attention_batch_chunks" not in cfg.to_dict()
  assert model_lib.BertConfig.from_dict({**cfg.to_dict(), "attention_batch_chunks": 2}) == cfg
  with pytest.raises(ValueError, match="unknown fields"):
    model_lib.BertConfig.from_dict({**cfg.to_dict(), "attention_batch_chunkz": 2})


def test_init_is_berts_truncated_normal():
  """Kernels and tables are drawn as google-research/bert's `create_initializer`
  (modeling.py: tf.truncated_normal_initializer(stddev=initializer_range)): within ±2·0.02, with
  the truncated distribution's std, which TF's own initializer shows on the same shape."""
  tf = pytest.importorskip("tensorflow")
  cfg = model_lib.from_preset("tiny", vocab_size=4000)
  params = _init(cfg)
  table = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
  kernels = [
      np.asarray(x)
      for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
      if jax.tree_util.keystr(p).endswith("['kernel']")
  ]
  drawn = np.concatenate([table.ravel()] + [k.ravel() for k in kernels])
  ref = tf.compat.v1.truncated_normal_initializer(stddev=0.02, seed=0)(drawn.shape).numpy()
  assert np.abs(drawn).max() <= 0.04 + 1e-7
  assert abs(drawn.std() - ref.std()) < 2e-4, (drawn.std(), ref.std())
  assert abs(ref.std() - 0.0176) < 2e-4  # not N(0, 0.02): that would be 0.0200
