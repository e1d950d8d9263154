"""ELECTRA's objective against a NumPy transcription of the paper's definition (Clark et al.
2020, section 2), its sampling, labels and gradients; then the train step (both blocks, packing,
accumulation, a sharded mesh) and the loop (metrics, checkpoints, resume, fine-tuning's reader).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.data import pretraining
from bertjax.model import electra as electra_lib
from bertjax.training import flops, losses, sharding, train
from conftest import loop_config, metrics_rows, run_until

LAMBDA = 50.0


# ------------------------------------------------------------------------ the paper, in NumPy


def _np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def paper_electra(batch, gen_logits_BxPxV, sampled_BxP, disc_logits_BxL):
  """The paper's definitions, written plainly: x^corrupt replaces each masked position by the
  generator's sample; the discriminator's target is 1 where x^corrupt_t != x_t (a sample of
  the original token is "original"); L_MLM = mean over the masked positions of -log p_G(x_t);
  L_Disc = mean over the real tokens of the binary cross-entropy; loss = L_MLM + λ L_Disc."""
  ids = batch["input_ids"].copy()
  original = ids.copy()
  b_, p_ = batch["masked_positions"].shape
  for b in range(b_):
    for p in range(p_):
      if batch["masked_weights"][b, p] > 0:
        t = batch["masked_positions"][b, p]
        original[b, t] = batch["masked_ids"][b, p]
        ids[b, t] = sampled_BxP[b, p]
  labels = (ids != original).astype(np.float64)
  w = batch["masked_weights"].astype(np.float64)
  logp = _np_log_softmax(gen_logits_BxPxV.astype(np.float64))
  nll = -np.take_along_axis(logp, batch["masked_ids"][:, :, None], -1)[..., 0]
  mlm = (nll * w).sum() / w.sum()
  real = batch["attention_mask"].astype(np.float64)
  prob = 1.0 / (1.0 + np.exp(-disc_logits_BxL.astype(np.float64)))
  bce = -(labels * np.log(prob) + (1 - labels) * np.log(1 - prob))
  disc = (bce * real).sum() / real.sum()
  hit = ((prob > 0.5) == labels.astype(bool)).astype(np.float64)
  return dict(
      corrupted=ids,
      labels=labels,
      loss=mlm + LAMBDA * disc,
      mlm_loss=mlm,
      disc_loss=disc,
      disc_accuracy_replaced=(hit * labels * real).sum() / max((labels * real).sum(), 1),
      disc_accuracy_original=(hit * (1 - labels) * real).sum() / ((1 - labels) * real).sum(),
      replaced_fraction=(labels * real).sum() / real.sum(),
  )


def _tiny(**model):
  from experiments import pretrain

  c = pretrain.get_config("electra_tiny")
  c.model.vocab_size = 50
  c.data.source = "synthetic"
  c.data.seq_len, c.data.max_predictions_per_seq = 16, 4
  c.train.batch_size = 8
  c.train.warmup_steps = 0
  c.model.num_layers = 1  # one layer compiles fastest; the modern block's test asks for 2
  for k, v in model.items():
    c.model[k] = v
  return c


def _batch(c, seed=0, packing=False):
  cfg = pretraining.InputConfig(
      source="synthetic",
      seq_len=c.data.seq_len,
      max_predictions_per_seq=c.data.max_predictions_per_seq,
      vocab_size=c.model.vocab_size,
      pair_mode="none",
      seed=seed,
      packing=packing,
  )
  stream = pretraining.make_stream(
      cfg, global_batch_size=c.train.batch_size, process_index=0, process_count=1
  )
  return {k: np.asarray(v) for k, v in next(stream).items()}


def _model_and_batch(**model):
  c = _tiny(**model)
  cfg = train.model_config(c)
  model = electra_lib.ElectraForPreTraining(cfg, train.electra_generator_config(c, cfg))
  batch = _batch(c)
  batch["masked_weights"][0, -1] = 0.0  # a padded prediction slot: never replaced
  inputs = [batch[k] for k in train.MODEL_INPUTS + ("masked_ids", "masked_weights")]
  key = jax.random.key(0)
  params = nn.unbox(jax.jit(model.init)({"params": key, "sample": key}, *inputs)["params"])
  return model, params, batch, inputs


def test_loss_sampling_and_labels_match_the_paper():
  model, params, batch, inputs = _model_and_batch()

  @jax.jit
  def run(params):
    out = model.apply({"params": params}, *inputs, rngs={"sample": jax.random.key(1)})
    nll, correct = losses.mlm_cross_entropy(
        out.generator.mlm_hidden,
        out.generator.mlm_table,
        out.generator.mlm_bias,
        batch["masked_ids"],
    )
    sums = losses.electra_sums(nll, correct, out.disc_logits, out.is_replaced, batch)
    return out, out.generator.mlm_logits, losses.electra_finalize(sums, LAMBDA)

  out, gen_logits, got = run(params)
  sampled = np.asarray(out.sampled_ids)
  ref = paper_electra(batch, np.asarray(gen_logits), sampled, np.asarray(out.disc_logits))
  np.testing.assert_array_equal(np.asarray(out.corrupted_ids), ref["corrupted"])
  np.testing.assert_array_equal(np.asarray(out.is_replaced), ref["labels"])
  for k in (
      "loss",
      "mlm_loss",
      "disc_loss",
      "disc_accuracy_replaced",
      "disc_accuracy_original",
      "replaced_fraction",
  ):
    np.testing.assert_allclose(float(got[k]), ref[k], rtol=1e-5, err_msg=k)
  assert ref["labels"].sum() > 0
  # a sample equal to the original token counts as original; a padded slot writes nothing
  same = np.asarray(batch["masked_ids"])
  corrupted, labels = electra_lib.corrupt(
      batch["input_ids"], batch["masked_positions"], same, batch["masked_weights"], same
  )
  assert float(labels.sum()) == 0.0
  real = batch["masked_weights"] > 0
  rows = np.nonzero(real)[0]
  np.testing.assert_array_equal(
      np.asarray(corrupted)[rows, batch["masked_positions"][real]], same[real]
  )
  np.testing.assert_array_equal(np.asarray(corrupted)[:, 0], batch["input_ids"][:, 0])

  # the discriminator's loss sends no gradient into the generator (the draw is not
  # differentiable); the shared embeddings learn from it
  def disc_only(params):
    out = model.apply({"params": params}, *inputs, rngs={"sample": jax.random.key(1)})
    real = losses.real_tokens(batch)
    return jnp.sum(losses.binary_cross_entropy(out.disc_logits, out.is_replaced) * real)

  g = jax.jit(jax.grad(disc_only))(params)
  for name in ("generator", "generator_predictions", "generator_bias"):
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(g[name])), name
  assert np.any(np.asarray(g["bert"]["embeddings"]["word_embeddings"]["embedding"]))


def test_sampling_is_softmax_at_temperature_one_without_gradient():
  logits_1x1xV = jnp.asarray([[[2.0, 1.0, 0.0, -1.0, 0.5]]])
  keys = jax.random.split(jax.random.key(0), 20_000)
  draws = jax.vmap(lambda k: electra_lib.sample_replacements(logits_1x1xV, k))(keys).ravel()
  freq = np.bincount(np.asarray(draws), minlength=5) / draws.size
  p = np.exp(logits_1x1xV[0, 0]) / np.exp(logits_1x1xV[0, 0]).sum()
  np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(p * (1 - p) / draws.size).max())
  g = jax.grad(lambda l: jnp.sum(electra_lib.sample_replacements(l, keys[0]).astype(jnp.float32)))(
      logits_1x1xV
  )
  assert not np.any(np.asarray(g))


def _steps(c, mesh, batches):
  s = train.setup(c, mesh)
  state = s.init_state(0)
  out = []
  for b in batches:
    state, m = s.train_step(state, pretraining.global_batch(b, s.batch_sharding))
    out.append({k: float(v) for k, v in m.items() if k != "tokens_by_source"})
  return out, s


@pytest.mark.long
@pytest.mark.parametrize("block", ["bert", pytest.param("modern", marks=pytest.mark.slow)])
def test_train_step_every_block_packing_mesh_and_accumulation(block):
  modern = dict(
      norm_placement="pre",
      mlp_type="glu",
      position_embedding="rope",
      use_bias=False,
      type_vocab_size=0,
      intermediate_size=192,
      local_attention=8,
      global_every=2,
      num_layers=2,  # a global layer, then a local one
  )
  c = _tiny(**(modern if block == "modern" else {}))
  batches = [_batch(c, packing=block == "modern")]
  one, s = _steps(c, sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]), batches)
  # every parameter, the generator's included, is placed by its logical axes
  boxed = jax.eval_shape(lambda: train._init_fn(s.model, s.tx, 0)[0])
  assert all(
      isinstance(x, nn.Partitioned)
      for x in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  )
  assert set(boxed) >= {"generator", "generator_predictions", "generator_bias"}
  m = one[0]
  assert 0 < m["replaced_fraction"] < 0.5 and np.isfinite(m["loss"])
  assert m["loss"] == pytest.approx(m["mlm_loss"] + LAMBDA * m["disc_loss"], rel=1e-5)
  # the same step on a data x fsdp x tensor mesh in 2 microbatches: the same draws per row,
  # so the same loss, metrics and update
  c.train.microbatches = 2
  many, _ = _steps(c, sharding.make_mesh(2, 2, 2), batches)
  for k in ("loss", "mlm_loss", "disc_loss", "replaced_fraction", "grad_norm", "param_norm"):
    np.testing.assert_allclose(many[0][k], m[k], rtol=2e-5, err_msg=k)


def test_flops_count_the_generator():
  c = _tiny()
  cfg = train.model_config(c)
  gen = train.electra_generator_config(c, cfg)
  mlm = flops.pretraining_flops_per_step(cfg, 8, 16, 4)
  both = flops.pretraining_flops_per_step(cfg, 8, 16, 4, generator=gen)
  disc_alone = flops.encoder_flops(cfg, 8 * 16, 16)
  assert both > disc_alone + flops.encoder_flops(gen, 8 * 16, 16)
  assert gen.hidden_size == cfg.hidden_size // 4 and gen.num_layers == cfg.num_layers
  assert mlm > 0


@pytest.mark.long
@pytest.mark.slow
def test_loop_metrics_checkpoints_resume_and_finetuning_reader(tmp_path):
  from bertjax.tasks import encoder as encoder_lib
  from bertjax.training import checkpoint, pretrained
  from experiments import pretrain

  def config():
    c = loop_config(6)
    e = pretrain.get_config("electra_tiny")
    c.objective, c.electra = "electra", e.electra
    c.data.pair_mode = "none"
    c.model.embedding_size = 64
    c.data.seq_len, c.data.max_predictions_per_seq = 16, 3
    c.eval.every_steps = 6  # one held-out evaluation, at the end
    return c

  run_until(config(), tmp_path / "a", 3)
  from bertjax.training import loop

  assert loop.train_and_evaluate(config(), str(tmp_path / "a")) == 0  # resumes at 3
  assert loop.train_and_evaluate(config(), str(tmp_path / "b")) == 0  # uninterrupted
  a, ev = metrics_rows(tmp_path / "a")
  b, _ = metrics_rows(tmp_path / "b")
  for k in ("loss", "disc_accuracy_replaced", "disc_accuracy_original", "replaced_fraction"):
    np.testing.assert_allclose(a[6][k], b[6][k], rtol=1e-5, err_msg=k)
  assert "eval_disc_accuracy" in ev[-1] and "eval_mlm_accuracy" in ev[-1]
  pre = pretrained.load_pretrained(str(tmp_path / "a"))
  assert pre.generator_config.hidden_size == 32
  fresh = []
  cfg, bert, _, _ = encoder_lib.read_encoder(tmp_path / "a", fresh)
  assert "pooler" in bert and "embeddings_project" in bert and fresh == ["the pooler"]
  mlm = config()
  mlm.objective = "mlm"
  with pytest.raises(checkpoint.CheckpointMismatchError, match="objective"):
    loop.train_and_evaluate(mlm, str(tmp_path / "a"))

  # `bertjax convert --from bertjax RUN --to hf DIR`: the discriminator in DIR, the generator in
  # DIR/generator, as transformers loads them, with the run's logits; and back
  import torch
  import transformers

  from bertjax.commands import convert as convert_cmd

  hf = tmp_path / "hf"
  assert convert_cmd.main(["--from", "bertjax", str(tmp_path / "a"), "--to", "hf", str(hf)]) == 0
  disc = transformers.ElectraForPreTraining.from_pretrained(hf).eval()
  gen = transformers.ElectraForMaskedLM.from_pretrained(hf / "generator").eval()
  model = electra_lib.ElectraForPreTraining(pre.config, pre.generator_config)
  ids = np.random.default_rng(0).integers(5, 1000, size=(2, 16)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 10:] = 0
  pos = np.tile(np.arange(1, 5, dtype=np.int32), (2, 1))
  ours_d = model.apply({"params": pre.params}, ids, None, mask, method=model.discriminate)
  ours_g = model.apply({"params": pre.params}, ids, None, mask, pos, method=model.generate)
  t = lambda a: torch.tensor(a, dtype=torch.long)
  with torch.no_grad():
    theirs_d = disc(input_ids=t(ids), attention_mask=t(mask)).logits.numpy()
    theirs_g = gen(input_ids=t(ids), attention_mask=t(mask)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours_d)[mask > 0], theirs_d[mask > 0], atol=1e-4)
  np.testing.assert_allclose(
      np.asarray(ours_g.mlm_logits), np.take_along_axis(theirs_g, pos[:, :, None], 1), atol=1e-4
  )
  back = tmp_path / "back"
  assert convert_cmd.main(["--from", "hf", str(hf), "--to", "bertjax", str(back)]) == 0
  again = pretrained.load_pretrained(str(back))
  assert again.generator_config == pre.generator_config


def test_layerwise_lr_decay_follows_electra():
  import argparse

  from bertjax.commands import finetune_args
  from bertjax.tasks import recipe as recipe_lib

  z = np.zeros(2, np.float32)
  params = {
      "bert": {
          "embeddings": {"word_embeddings": {"embedding": z}},
          "embeddings_project": {"kernel": z},
          "encoder": {f"layer_{i}": {"output": {"kernel": z}} for i in range(3)},
          "pooler": {"kernel": z},
      },
      "classifier": {"kernel": z},
  }
  s = recipe_lib.layerwise_scales(params, 0.8)
  n = 3  # ELECTRA's _get_layer_lrs: decay ** (n + 2 - depth)
  assert float(s["bert"]["embeddings"]["word_embeddings"]["embedding"]) == pytest.approx(0.8**5)
  assert float(s["bert"]["embeddings_project"]["kernel"]) == pytest.approx(0.8 ** (n + 2))
  for i in range(n):
    got = float(s["bert"]["encoder"][f"layer_{i}"]["output"]["kernel"])
    assert got == pytest.approx(0.8 ** (n + 1 - i))
  assert float(s["classifier"]["kernel"]) == 1.0 == float(s["bert"]["pooler"]["kernel"])
  # scanned layers: one factor per slice
  stacked = {"bert": {"encoder": {"layers": {"kernel": np.zeros((3, 2), np.float32)}}}}
  per = np.asarray(recipe_lib.layerwise_scales(stacked, 0.8)["bert"]["encoder"]["layers"]["kernel"])
  np.testing.assert_allclose(per[:, 0], [0.8**4, 0.8**3, 0.8**2], rtol=1e-6)
  # in the optimizer: the same gradient moves the embeddings 0.8^5 as far as the head
  tx = recipe_lib.make_optimizer(
      recipe_lib.Recipe(layerwise_lr_decay=0.8, warmup_fraction=0.0, weight_decay=0.0), 10
  )
  g = jax.tree.map(lambda x: np.ones_like(x), params)
  u, _ = tx.update(g, tx.init(params), params)
  ratio = u["bert"]["embeddings"]["word_embeddings"]["embedding"] / u["classifier"]["kernel"]
  np.testing.assert_allclose(np.asarray(ratio), 0.8**5, rtol=1e-5)
  # the flag, on every fine-tuning command's recipe arguments
  p = argparse.ArgumentParser()
  finetune_args.add_recipe_args(p, learning_rate=2e-5, epochs=3, max_seq_len=128)
  assert p.parse_args(["--layerwise-lr-decay", "0.8"]).layerwise_lr_decay == 0.8
  assert p.parse_args([]).layerwise_lr_decay == 1.0
  with pytest.raises(SystemExit):
    p.parse_args(["--layerwise-lr-decay", "1.5"])
  with pytest.raises(Exception, match="layerwise_lr_decay"):
    recipe_lib.Recipe(layerwise_lr_decay=0.0)


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("objective", "elektra", "config.objective='elektra': valid: mlm, electra"),
        ("data.pair_mode", "nsp", "ELECTRA has no pair task"),
        ("electra.disc_weight", 0.0, "config.electra.disc_weight=0.0"),
        ("electra.generator_hidden_fraction", 0.001, "choose a fraction that leaves whole heads"),
        ("model.embedding_size", -1, "config.model.embedding_size=-1"),
        ("data.mask_token_prob", 0.95, "mask_token_prob + random_token_prob"),
    ],
)
def test_electra_config_mistakes_are_one_line_user_errors(field, value, needle):
  from bertjax import errors
  from bertjax.training import config_checks
  from experiments import pretrain

  c = pretrain.get_config("electra_tiny")
  node, _, leaf = field.rpartition(".")
  (c[node] if node else c)[leaf] = value
  if field == "data.mask_token_prob":
    c.data.random_token_prob = 0.1
  with pytest.raises(errors.UserError, match=needle.replace("(", r"\(").replace("+", r"\+")) as e:
    config_checks.validate(c)
    config_checks.preflight(c)
  assert "\n" not in str(e.value)
