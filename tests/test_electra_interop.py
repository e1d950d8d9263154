"""ELECTRA against transformers' own code: the discriminator as `ElectraForPreTraining`, the
generator as `ElectraForMaskedLM` (in DIR/generator), factorised embeddings, padding in the
batch; logits equal both ways, and `load_hf` / `read_encoder` give the discriminator's encoder."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.interop import convert, electra as electra_interop
from bertjax.model import electra as electra_lib
from bertjax.tasks import encoder as encoder_lib
from conftest import hf_batch

# E = 16, factorised: the discriminator projects it to 32, its generator (1/4: 8 wide, one head)
# to 8; both have an `embeddings_project`.
DISC = dict(
    vocab_size=99,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=24,
    type_vocab_size=2,
    hidden_act="gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
GEN = dict(DISC, hidden_size=8, num_attention_heads=1, intermediate_size=16)
ATOL = 1e-4


def _hf_models():
  """transformers' random init of both networks, every weight then moved off its init value
  (LayerNorms 1/0 and zero biases would hide a swapped tensor), the generator's embeddings made
  the discriminator's (ELECTRA shares them)."""
  import torch
  import transformers

  torch.manual_seed(0)
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**DISC)).eval()
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**GEN)).eval()
  with torch.no_grad():
    for m in (disc, gen):
      for p in m.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    gen.generator_lm_head.weight = gen.electra.embeddings.word_embeddings.weight
  return disc, gen


def _hf_logits(disc, gen, ids, types, mask, pos):
  import torch

  t = lambda a: torch.tensor(a, dtype=torch.long)
  with torch.no_grad():
    d = disc(input_ids=t(ids), token_type_ids=t(types), attention_mask=t(mask)).logits.numpy()
    g = gen(input_ids=t(ids), token_type_ids=t(types), attention_mask=t(mask)).logits.numpy()
  return d, np.take_along_axis(g, pos[:, :, None], axis=1)


def _ours(params, cfg, gen_cfg, ids, types, mask, pos):
  model = electra_lib.ElectraForPreTraining(cfg, gen_cfg)

  @jax.jit
  def logits(params):
    v = {"params": params}
    d = model.apply(v, ids, types, mask, method=model.discriminate)
    return d, model.apply(v, ids, types, mask, pos, method=model.generate).mlm_logits

  d, g = logits(params)
  return np.asarray(d), np.asarray(g)


def _check(ours, theirs, ids_mask):
  (d, g), (hd, hg) = ours, theirs
  real = ids_mask.astype(bool)
  np.testing.assert_allclose(d[real], hd[real], atol=ATOL, rtol=0)  # padding: any value
  np.testing.assert_allclose(g, hg, atol=ATOL, rtol=0)


def test_transformers_to_bertjax_and_back(tmp_path):
  import transformers

  disc, gen = _hf_models()
  src = tmp_path / "hf"
  disc.save_pretrained(src)
  gen.save_pretrained(src / electra_interop.GENERATOR_DIR)
  batch = hf_batch(DISC["vocab_size"])
  ids, types, mask, pos = batch
  theirs = _hf_logits(disc, gen, *batch)

  fresh = []
  cfg, params, gen_cfg = electra_interop.load(src, fresh=fresh)
  assert cfg.embedding_size == 16 and cfg.hidden_size == 32 and gen_cfg.hidden_size == 8
  assert "the pooler" in fresh and "the discriminator head" not in fresh
  _check(_ours(params, cfg, gen_cfg, *batch), theirs, mask)

  # load_hf and the tasks' reader take the discriminator's encoder
  cfg2, params2 = convert.load_hf(src)
  assert cfg2 == cfg and set(params2["bert"]) >= {"embeddings", "embeddings_project", "pooler"}
  _, bert_params, _, kind = encoder_lib.read_encoder(src)
  assert kind == "hf"
  np.testing.assert_array_equal(
      bert_params["encoder"]["layer_1"]["output"]["kernel"],
      disc.electra.encoder.layer[1].output.dense.weight.detach().numpy().T,
  )

  # ElectraModel (the encoder alone) loads too: the discriminator head then starts fresh
  transformers.ElectraModel.from_pretrained(src).save_pretrained(tmp_path / "model")
  fresh = []
  _, only, _ = electra_interop.load(tmp_path / "model", fresh=fresh)
  assert "the discriminator head" in fresh and "discriminator_predictions" not in only
  np.testing.assert_array_equal(
      only["bert"]["embeddings_project"]["kernel"], params["bert"]["embeddings_project"]["kernel"]
  )

  # ... and back: bertjax's tree written out loads in transformers with the same logits
  out = tmp_path / "back"
  electra_interop.save(params, cfg, gen_cfg, out)
  disc2 = transformers.ElectraForPreTraining.from_pretrained(out).eval()
  gen2 = transformers.ElectraForMaskedLM.from_pretrained(out / "generator").eval()
  _check(_hf_logits(disc2, gen2, *batch), theirs, mask)


def test_released_discriminator_alone_runs_through_the_documented_api(tmp_path):
  """A released discriminator (google/electra-*-discriminator: `ElectraForPreTraining`, no
  generator beside it) loads, and `ElectraForPreTraining(cfg, None)`'s `discriminate` gives
  transformers' logits on a padded batch; `generate` refuses in one line."""
  disc, _ = _hf_models()
  disc.save_pretrained(tmp_path / "disc")
  ids, types, mask, pos = hf_batch(DISC["vocab_size"])
  assert not mask.all()  # padding in the batch
  import torch

  t = lambda a: torch.tensor(a, dtype=torch.long)
  with torch.no_grad():
    theirs = disc(input_ids=t(ids), token_type_ids=t(types), attention_mask=t(mask)).logits.numpy()
  cfg, params, gen_cfg = electra_interop.load(tmp_path / "disc")
  assert gen_cfg is None and "generator_bias" not in params
  model = electra_lib.ElectraForPreTraining(cfg, gen_cfg)
  ours = model.apply({"params": params}, ids, types, mask, method=model.discriminate)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(ours)[real], theirs[real], atol=ATOL, rtol=0)
  with pytest.raises(ValueError, match="discriminator alone"):
    model.apply({"params": params}, ids, types, mask, pos, method=model.generate)


def test_bertjax_to_transformers(tmp_path):
  import transformers

  cfg = electra_interop.config_from_electra(DISC)
  gen_cfg = electra_interop.config_from_electra(GEN).replace(embedding_size=16)
  model = electra_lib.ElectraForPreTraining(cfg, gen_cfg)
  ids, types, mask, pos = batch = hf_batch(DISC["vocab_size"], seed=1)
  key = jax.random.key(3)
  init = jax.jit(model.init)
  params = nn.unbox(init({"params": key, "sample": key}, ids, types, mask, pos)["params"])
  # bertjax's init: zero biases, unit LayerNorms; move them, as for transformers' side
  leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, params))
  rng = np.random.default_rng(0)
  params = tree.unflatten([x + rng.normal(0, 0.05, x.shape).astype(np.float32) for x in leaves])
  ours = _ours(params, cfg, gen_cfg, *batch)

  out = tmp_path / "hf"
  electra_interop.save(params, cfg, gen_cfg, out)
  disc = transformers.ElectraForPreTraining.from_pretrained(out).eval()
  gen = transformers.ElectraForMaskedLM.from_pretrained(out / "generator").eval()
  assert (
      gen.generator_lm_head.weight.data_ptr()
      == gen.electra.embeddings.word_embeddings.weight.data_ptr()
  )
  _check(ours, _hf_logits(disc, gen, *batch), mask)


def test_modern_block_is_refused(tmp_path):
  cfg = electra_interop.config_from_electra(DISC).replace(
      norm_placement="pre",
      mlp_type="glu",
      position_embedding="rope",
      use_bias=False,
      type_vocab_size=0,
  )
  with pytest.raises(convert.ConversionError, match="BERT's block only"):
    electra_interop.save({}, cfg, None, tmp_path / "x")
