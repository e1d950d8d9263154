"""ModernBERT to and from transformers, proved on transformers' own `ModernBertForMaskedLM`.

transformers builds and runs the reference network (its random init, eager and SDPA
attention); bertjax reads its directory with `load_hf` and must give the same MLM logits and
hidden states, and a directory bertjax writes must load in transformers with the same logits.
The model is small but every departure from BERT is live: pre-LN with layer 0's identity norm
and the final norm, GeGLU, RoPE with two thetas, local attention (window 8 at length 32) with a
global layer every third, no token types, and padding in the batch.
"""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import cli
from bertjax import model as model_lib
from bertjax.interop import convert
from bertjax.model.config import BertConfig

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB, B, L = 97, 3, 32
HF_FIELDS = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=5,
    num_attention_heads=4,
    intermediate_size=80,
    max_position_embeddings=64,
    initializer_range=0.2,  # 10x BERT's: attention far from uniform, so every mask shows
    local_attention=8,
    global_attn_every_n_layers=3,
    global_rope_theta=160000.0,
    local_rope_theta=10000.0,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
    cls_token_id=None,
    sep_token_id=None,
)
MODERN = BertConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    num_layers=5,
    num_heads=4,
    intermediate_size=80,
    max_position_embeddings=64,
    type_vocab_size=0,
    hidden_dropout_rate=0.0,
    attention_dropout_rate=0.0,
    layer_norm_eps=1e-5,
    initializer_range=0.2,
    norm_placement="pre",
    mlp_type="glu",
    position_embedding="rope",
    rope_theta=160000.0,
    local_rope_theta=10000.0,
    use_bias=False,
    local_attention=8,
    global_every=3,
)


def _hf_model(bias: bool, attn: str = "eager", seed: int = 0):
  """transformers' own random init, with the constant-initialised tensors (norm scales,
  decoder bias) moved off their constants so a swapped or dropped one cannot hide."""
  torch.manual_seed(seed)
  biases = dict(attention_bias=bias, mlp_bias=bias, norm_bias=bias, classifier_bias=bias)
  hf_cfg = transformers.ModernBertConfig(**HF_FIELDS, **biases, attn_implementation=attn)
  m = transformers.ModernBertForMaskedLM(hf_cfg).eval()
  with torch.no_grad():
    for name, p in m.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return m


def _batch(seed: int = 0):
  """Ids, a padding mask (rows of 32, 20 and 5 real tokens) and positions to score."""
  rng = np.random.default_rng(seed)
  mask = np.ones((B, L), np.int64)
  mask[1, 20:], mask[2, 5:] = 0, 0
  ids = rng.integers(1, VOCAB, (B, L)) * mask
  return ids, mask


def _hf_outputs(m, ids, mask):
  with torch.no_grad():
    o = m(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
  return o.logits.numpy(), [h.numpy() for h in o.hidden_states]


def _ours(cfg, params, ids, mask):
  """MLM logits through the one entry point (token types passed and ignored), and the hidden
  states of the encoder."""
  positions = np.broadcast_to(np.arange(L), (B, L))
  types = np.ones_like(ids)  # a type table would change the numbers; there is none
  out = model_lib.BertForPreTraining(cfg).apply(
      {"params": params}, ids, types, mask, positions, deterministic=True
  )
  enc = model_lib.BertModel(cfg).apply(
      {"params": params["bert"]}, ids, types, mask, output_hidden_states=True
  )
  return np.asarray(out.mlm_logits), [np.asarray(h) for h in enc.hidden_states]


def _max_diff(a, b, mask):
  real = mask.astype(bool)
  return float(np.abs(a[real] - b[real]).max())


@pytest.mark.parametrize("bias", [False, True])
def test_transformers_modernbert_loads_with_the_same_logits(bias, tmp_path):
  m = _hf_model(bias)
  m.save_pretrained(tmp_path)
  cfg, params = convert.load_hf(tmp_path)
  assert cfg == MODERN.replace(use_bias=bias)
  ids, mask = _batch()
  want_logits, want_hidden = _hf_outputs(m, ids, mask)
  logits, hidden = _ours(cfg, params, ids, mask)
  assert _max_diff(logits, want_logits, mask) <= 1e-4
  assert len(hidden) == len(want_hidden) == 6  # embeddings, then each layer (last final-normed)
  for got, want in zip(hidden, want_hidden):
    assert _max_diff(got, want, mask) <= 1e-4
  # The window matters at this length: the same weights attending globally differ.
  global_only, _ = _ours(cfg.replace(local_attention=0, global_every=1), params, ids, mask)
  assert _max_diff(global_only, want_logits, mask) > 1e-2


def test_bertjax_params_load_in_transformers_with_the_same_logits(tmp_path):
  params = _init(MODERN, seed=3)
  convert.save_hf(params, MODERN, tmp_path)
  assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "modernbert"
  ids, mask = _batch(1)
  logits, _ = _ours(MODERN, params, ids, mask)
  for attn in ("eager", "sdpa"):
    m, info = transformers.ModernBertForMaskedLM.from_pretrained(
        tmp_path, attn_implementation=attn, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    want, _ = _hf_outputs(m.eval(), ids, mask)
    assert _max_diff(logits, want, mask) <= 1e-4, attn
  # And back: the same tensors, with bertjax's pooler and NSP head fresh (and deterministic).
  cfg, back = convert.load_hf(tmp_path)
  assert cfg == MODERN
  flat = dict(jax.tree_util.tree_leaves_with_path(params))
  for path, value in jax.tree_util.tree_leaves_with_path(back):
    name = jax.tree_util.keystr(path)
    if "pooler" in name or "nsp" in name:
      continue
    np.testing.assert_allclose(value, flat[path], atol=1e-6, err_msg=name)
  _, again = convert.load_hf(tmp_path)
  np.testing.assert_array_equal(again["nsp"]["kernel"], back["nsp"]["kernel"])


def test_layer_zero_has_no_attention_norm_so_conversion_is_one_to_one():
  params = jax.eval_shape(
      lambda: model_lib.BertForPreTraining(MODERN).init(
          jax.random.key(0), *model_lib.dummy_inputs(1, 8).values()
      )
  )["params"]
  layers = params["bert"]["encoder"]
  assert "attention_layer_norm" not in layers["layer_0"]
  assert "attention_layer_norm" in layers["layer_1"]
  ours = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
  theirs = convert.hf_tensor_names(MODERN)
  # Every bertjax tensor but the pooler's and NSP's is one transformers tensor, and back.
  assert len(ours) - 4 == len(theirs)


def test_a_mix_of_bert_and_modernbert_is_refused():
  with pytest.raises(convert.ConversionError, match=r"mlp_type='dense' is not \(ModernBERT: 'glu'"):
    convert.hf_architecture(MODERN.replace(mlp_type="dense"))
  with pytest.raises(convert.ConversionError, match=r"position_embedding='rope' is not \(BERT"):
    convert.hf_architecture(BertConfig(position_embedding="rope"))
  with pytest.raises(convert.ConversionError, match="use_bias=False"):
    convert.hf_architecture(BertConfig(use_bias=False))
  assert convert.hf_architecture(BertConfig()) == "bert"
  assert convert.hf_architecture(MODERN) == "modernbert"


def test_convert_cli_to_hf_and_back(tmp_path, capsys):
  from bertjax.training import pretrained

  params = _init(MODERN, seed=5)
  pretrained.save_pretrained(str(tmp_path / "run"), MODERN, params)
  run = lambda *a: cli.main(["convert", *map(str, a)])
  assert run("--from", "bertjax", tmp_path / "run", "--to", "hf", tmp_path / "hf") == 0
  m = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
  ids, mask = _batch(2)
  logits, _ = _ours(MODERN, params, ids, mask)
  assert _max_diff(logits, _hf_outputs(m, ids, mask)[0], mask) <= 1e-4
  assert run("--from", "hf", tmp_path / "hf", "--to", "bertjax", tmp_path / "back") == 0
  back = pretrained.load_pretrained(str(tmp_path / "back"))
  assert back.config == MODERN
  assert _max_diff(_ours(back.config, back.params, ids, mask)[0], logits, mask) <= 1e-5
  # A mix is refused in one line, and nothing is written.
  capsys.readouterr()
  mixed = MODERN.replace(mlp_type="dense")
  pretrained.save_pretrained(str(tmp_path / "mixed"), mixed, _init(mixed))
  assert run("--from", "bertjax", tmp_path / "mixed", "--to", "hf", tmp_path / "x") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "mlp_type='dense'" in err[0] and "neither" in err[0], err
  assert run("--from", "bertjax", tmp_path / "run", "--to", "google", tmp_path / "g") == 2
  assert "--to google" in capsys.readouterr().err
  assert not (tmp_path / "x").exists() and not (tmp_path / "g").exists()


def _init(cfg, seed=0):
  """bertjax's initial parameters (numpy float32), each moved off its init value (LayerNorm
  1/0), so no part of the network is the identity."""
  params = model_lib.BertForPreTraining(cfg).init(
      jax.random.key(seed), *model_lib.dummy_inputs(1, 8).values()
  )["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: (np.asarray(x) + 0.1 * rng.normal(size=x.shape)).astype(np.float32),
      nn.unbox(params),
  )
