"""Optimisers: BERT's weight-decay mask, bias correction, layer-wise LAMB, the schedules, the
recipes' choices, and exact gradient accumulation."""

import argparse
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import flax.linen as nn

from bertjax import model as model_lib
from bertjax.commands import finetune_args
from bertjax.data import pretraining
from bertjax.tasks import recipe as recipe_lib
from bertjax.training import optim, sharding, train
from conftest import synthetic_batch, tiny_config
from experiments import pretrain


def test_decay_mask_excludes_layer_norm_and_biases():
  params = {
      "dense": {"kernel": 1, "bias": 2},
      "layer_norm": {"scale": 3, "bias": 4},
      "mlm_bias": 5,
      "emb": {"embedding": 6},
  }
  assert optim.decay_mask(params) == {
      "dense": {"kernel": True, "bias": False},
      "layer_norm": {"scale": False, "bias": False},
      "mlm_bias": False,
      "emb": {"embedding": True},
  }


@pytest.mark.parametrize(
    "name,kernel_update", [("adamw", -0.01), ("bert_adamw", -0.01), ("lamb", -1.0)]
)  # LAMB: ratio ||w||/||0.01 w||
def test_optimizers_decay_weights_only(name, kernel_update):
  c = tiny_config(learning_rate=1.0, warmup_steps=0, clip_norm=0.0, optimizer=name)
  tx = optim.make_optimizer(c.train, lambda _: 1.0)
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,)), "scale": jnp.ones((2,))}
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], kernel_update * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_array_equal(updates["bias"], 0.0)
  np.testing.assert_array_equal(updates["scale"], 0.0)


def test_bert_adamw_has_no_bias_correction_and_adamw_has():
  """First step, gradient g: BERT's m/sqrt(v) = 0.1 g / sqrt(0.001 g^2) = sqrt(10); optax's 1."""
  params, grads = {"kernel": jnp.zeros((3,))}, {"kernel": jnp.array([0.5, -2.0, 4.0])}
  for name, size in (("bert_adamw", np.sqrt(10.0)), ("adamw", 1.0)):
    c = tiny_config(clip_norm=0.0, optimizer=name)
    tx = optim.make_optimizer(c.train, lambda _: 1.0)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(-updates["kernel"], size * np.sign(grads["kernel"]), rtol=1e-4)


def test_unknown_names_raise_naming_the_field():
  with pytest.raises(
      ValueError,
      match=r"^config.train.optimizer='adam'; valid: 'bert_adamw', 'adamw', 'lamb', "
      r"'stable_adamw'$",
  ):
    optim.make_optimizer(tiny_config(optimizer="adam").train, lambda _: 1.0)
  with pytest.raises(
      ValueError,
      match=r"^config.train.schedule='cosine'; valid: 'bert', 'warmup_linear', 'wsd', "
      r"'one_cycle'$",
  ):
    optim.make_schedule(tiny_config(schedule="cosine").train)


def test_warmup_then_linear_decay_to_zero():
  f = optim.warmup_linear_decay(1e-4, 10, 100)
  assert float(f(0)) == 0.0
  assert float(f(10)) == pytest.approx(1e-4)
  assert float(f(55)) == pytest.approx(0.5e-4)
  assert float(f(100)) == pytest.approx(0.0, abs=1e-12)


def test_bert_schedule_decays_from_step_zero_under_the_warmup():
  """create_optimizer: peak * (1 - step/total), and peak * step/warmup while step < warmup."""
  f = optim.bert_schedule(1e-4, 10, 100)
  assert float(f(0)) == 0.0
  assert float(f(9)) == pytest.approx(0.9e-4)
  assert float(f(10)) == pytest.approx(0.9e-4)  # not the peak: the decay started at step 0
  assert float(f(55)) == pytest.approx(0.45e-4)
  assert float(f(100)) == 0.0 and float(f(150)) == 0.0
  assert float(optim.bert_schedule(1e-4, 0, 100)(0)) == pytest.approx(1e-4)


@pytest.mark.parametrize(
    "variant,optimizer,schedule",
    [
        ("base", "bert_adamw", "bert"),
        ("large", "bert_adamw", "bert"),
        ("base_lamb", "lamb", "warmup_linear"),
        ("large_lamb", "lamb", "warmup_linear"),
        ("tiny", "adamw", "warmup_linear"),
        ("demo", "adamw", "warmup_linear"),
        ("medium", "adamw", "warmup_linear"),
    ],
)
def test_recipes_choose_optimizer_and_schedule(variant, optimizer, schedule):
  c = pretrain.get_config(variant)
  assert (c.train.optimizer, c.train.schedule) == (optimizer, schedule)
  optim.make_optimizer(c.train, optim.make_schedule(c.train, c.phase2))


def _lamb(params, grads_seq, lr=1e-2, wd=0.01):
  """Updates of our LAMB (no clipping) for each gradient tree of `grads_seq`, from `params`."""
  c = tiny_config(optimizer="lamb", clip_norm=0.0, weight_decay=wd)
  tx = optim.make_optimizer(c.train, lambda _: lr)
  update, state, out = jax.jit(tx.update), tx.init(params), []
  for grads in grads_seq:
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
    out.append(updates)
  return out


def _normal_like(tree, seed):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), tree)


@pytest.mark.slow
def test_lamb_is_the_papers_algorithm_2():
  """A port of You et al. 2019, Algorithm 2 (LAMB), per variable x with gradient g:
  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  m^ = m / (1-b1^t);  v^ = v / (1-b2^t);
  r = m^ / (sqrt(v^) + eps);  x -= lr * ||x|| / ||r + wd x|| * (r + wd x).
  LayerNorm scales and biases: no decay and ratio 1 (TF-Addons' exclude_from_layer_adaptation)."""
  b1, b2, eps, lr, wd = 0.9, 0.999, 1e-6, 1e-2, 0.1
  params = {
      "dense": {"kernel": jnp.full((4, 3), 0.5), "bias": jnp.full((3,), 0.2)},
      "layer_norm": {"scale": jnp.ones((3,))},
      "emb": {"embedding": jnp.full((5, 4), 2.0)},
  }
  grads_seq = [_normal_like(params, seed) for seed in range(4)]
  got = _lamb(params, grads_seq, lr, wd)
  flat = lambda tree: {
      jax.tree_util.keystr(p): np.asarray(x, np.float64)
      for p, x in jax.tree_util.tree_leaves_with_path(tree)
  }
  x, m, v = flat(params), {}, {}
  for t, grads in enumerate(grads_seq, start=1):
    for name, g in flat(grads).items():
      m[name] = b1 * m.get(name, 0.0) + (1 - b1) * g
      v[name] = b2 * v.get(name, 0.0) + (1 - b2) * g**2
      r = (m[name] / (1 - b1**t)) / (np.sqrt(v[name] / (1 - b2**t)) + eps)
      if "bias" in name or "scale" in name:
        step = lr * r
      else:
        r = r + wd * x[name]
        step = lr * np.linalg.norm(x[name]) / np.linalg.norm(r) * r
      # float32 against float64: optax's bias correction 1 - 0.999^t alone is off by ~1e-5.
      np.testing.assert_allclose(
          -flat(got[t - 1])[name], step, rtol=5e-5, atol=1e-5 * np.abs(step).max(), err_msg=name
      )
      x[name] = x[name] - step


def _tiny_params(scale_layer_1=3.0):
  cfg = model_lib.from_preset("tiny", vocab_size=64, max_position_embeddings=32)
  d = model_lib.dummy_inputs()
  params = nn.unbox(
      jax.jit(model_lib.BertForPreTraining(cfg).init)(
          jax.random.key(0),
          d["input_ids"],
          d["token_type_ids"],
          d["attention_mask"],
          d["masked_positions"],
      )["params"]
  )
  # Layers of different norms: one ratio over the stack would not give each its own.
  layers = params["bert"]["encoder"]
  layers["layer_1"] = jax.tree.map(lambda x: x * scale_layer_1, layers["layer_1"])
  return params


@pytest.mark.slow
def test_lamb_scanned_layers_get_one_ratio_per_layer():
  """The same params and gradients, stacked by `scan_layers` or not, give the same updates."""
  params = _tiny_params()
  grads_seq = [_normal_like(params, seed) for seed in range(3)]
  flat_updates = _lamb(params, grads_seq)
  stack = lambda tree: model_lib.stack_layer_params(tree, 2)
  stacked_updates = _lamb(stack(params), [stack(g) for g in grads_seq])
  assert "layers" in stacked_updates[0]["bert"]["encoder"]
  for want, got in zip(flat_updates, stacked_updates):
    got = model_lib.unstack_layer_params(got)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-9, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_lamb_fused_qkv_kernel_is_three_variables():
  """Each q/k/v slice of the fused [H, 3, N, D] kernel updates as Google's separate
  query/key/value kernels would."""
  h, n, d = 8, 2, 4
  w = jax.random.normal(jax.random.key(1), (h, 3, n, d)) * jnp.array([1.0, 5.0, 0.2])[:, None, None]
  b = jnp.ones((3, n, d))
  fused = {"attention": {"qkv": {"kernel": w, "bias": b}}}
  names = ("query", "key", "value")
  split = lambda tree: {
      "attention": {
          nm: {
              "kernel": tree["attention"]["qkv"]["kernel"][:, i],
              "bias": tree["attention"]["qkv"]["bias"][i],
          }
          for i, nm in enumerate(names)
      }
  }
  grads_seq = [_normal_like(fused, seed) for seed in range(3)]
  for f, s in zip(_lamb(fused, grads_seq), _lamb(split(fused), [split(g) for g in grads_seq])):
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-9), split(f), s)


def test_finetuning_optimizer_follows_the_width_and_the_flag(capsys):
  assert recipe_lib.optimizer_for(512)[0] == "adamw"
  assert recipe_lib.optimizer_for(768)[0] == recipe_lib.optimizer_for(1024)[0] == "bert_adamw"
  p = argparse.ArgumentParser()
  finetune_args.add_recipe_args(p, learning_rate=2e-5, epochs=3, max_seq_len=128)
  assert finetune_args.recipe_from_args(p.parse_args([]), 768, "glue").optimizer == "bert_adamw"
  assert "glue: optimizer bert_adamw (BERT's, for hidden size 768; --optimizer overrides)" in (
      capsys.readouterr().out
  )
  assert finetune_args.recipe_from_args(p.parse_args([]), 128, "ner").optimizer == "adamw"
  recipe = finetune_args.recipe_from_args(p.parse_args(["--optimizer", "adamw"]), 768, "squad")
  assert (
      recipe.optimizer == "adamw"
      and "optimizer" not in capsys.readouterr().out.split("learning rate")[-1]
  )
  with pytest.raises(ValueError, match=r"^Recipe.optimizer='sgd'; valid: 'bert_adamw', 'adamw'$"):
    recipe_lib.make_optimizer(recipe_lib.Recipe(optimizer="sgd"), 10)


@pytest.mark.parametrize("name", ["bert_adamw", "adamw"])
def test_finetuning_optimizers_are_bert_and_bias_corrected(name):
  """10 steps, warmup 1: step 0 at lr 0, step 1 at BERT's 1 - 1/10 or warmup_linear's 1."""
  tx = recipe_lib.make_optimizer(recipe_lib.Recipe(optimizer=name, weight_decay=0.0), 10)
  params, g = {"kernel": jnp.zeros((3,))}, jnp.array([0.1, -0.2, 0.3])
  state = tx.init(params)
  first, state = tx.update({"kernel": g}, state, params)
  second, _ = tx.update({"kernel": g}, state, params)
  np.testing.assert_array_equal(first["kernel"], 0.0)
  m, v = (0.1 * 0.9 + 0.1) * g, (0.001 * 0.999 + 0.001) * g**2  # uncorrected moments of g
  want = 0.9 * m / (np.sqrt(v) + 1e-6) if name == "bert_adamw" else np.sign(g)
  np.testing.assert_allclose(-second["kernel"], want, rtol=1e-4)


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
  return synthetic_batch(c, mesh, step)


@pytest.mark.slow
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


def test_config_checks_accept_exactly_optims_names():
  """The jax-free config check and optim agree on the valid optimizer and schedule names."""
  import importlib.util

  from bertjax.training import config_checks

  spec = importlib.util.spec_from_file_location(
      "pretrain_cfg", pathlib.Path(__file__).resolve().parents[1] / "experiments" / "pretrain.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for field, names in (("optimizer", optim.OPTIMIZERS), ("schedule", optim.SCHEDULES)):
    for name in list(names) + ["sgd"]:
      c = module.get_config("tiny")
      c.train[field] = name
      if name in names:
        config_checks.validate(c)
      else:
        with pytest.raises(ValueError, match=rf"config.train.{field}='sgd': valid: "):
          config_checks.validate(c)


# ------------------------------------------------- the modern recipe's schedules and optimizer


def _wsd_reference(t, peak, warmup, total, decay_fraction, final):
  """Hagele et al. 2024's constant lr + (1-sqrt) cooldown after a linear warmup, with
  ModernBERT's floor alpha_f: written from the papers' formula, one step at a time."""
  n_decay = round(decay_fraction * total)
  if warmup and t < warmup:
    return peak * t / warmup
  if t <= total - n_decay:
    return peak
  if t >= total:
    return peak * final
  return peak * (final + (1 - final) * (1 - ((t - (total - n_decay)) / n_decay) ** 0.5))


@pytest.mark.parametrize("final", [0.0, 0.02])
def test_wsd_is_the_trapezoid_with_a_one_minus_sqrt_decay(final):
  f = optim.wsd_schedule(8e-4, 10, 200, decay_fraction=0.2, final_lr_fraction=final)
  for t in (0, 3, 10, 11, 100, 160, 161, 170, 180, 199, 200, 250):
    want = _wsd_reference(t, 8e-4, 10, 200, 0.2, final)
    assert float(f(t)) == pytest.approx(want, rel=1e-5, abs=1e-12), t
  # the decay's shape: a quarter of the way down the lr has lost half its height (1 - sqrt(1/4))
  assert float(f(170)) == pytest.approx(8e-4 * (final + (1 - final) * 0.5), rel=1e-5)


def test_one_cycle_is_crammings_triangle():
  """Cramming's get_one_cycle: t / (T/2) before the middle, 2 - t / (T/2) after."""
  f = optim.one_cycle_schedule(1e-3, 999, 100)  # warmup is not used: the rise is the warmup
  for t in (0, 1, 25, 49, 50, 51, 75, 99, 100, 130):
    want = t / 50 if t < 50 else max(0.0, 2 - t / 50)
    assert float(f(t)) == pytest.approx(1e-3 * want, rel=1e-6, abs=1e-12), t
  g = optim.one_cycle_schedule(1.0, 0, 100, peak_fraction=0.25)
  assert [round(float(g(t)), 6) for t in (0, 25, 50, 100)] == [0.0, 1.0, round(50 / 75, 6), 0.0]


def test_a_restarted_phase_two_has_its_own_decay():
  """ModernBERT's shape: stable (no decay) through phase 1, then phase 2 at a lower lr whose
  own last 50% decays with 1-sqrt."""
  c = tiny_config(steps=100, learning_rate=8e-4, warmup_steps=10, schedule="wsd")
  c.train.decay_fraction = 0.0
  c.phase2.fraction, c.phase2.restart_schedule = 0.2, True
  c.phase2.learning_rate, c.phase2.warmup_steps, c.phase2.decay_fraction = 3e-4, 0, 0.5
  f = optim.make_schedule(c.train, c.phase2)
  assert float(f(79)) == pytest.approx(8e-4)  # no decay at the end of phase 1
  assert float(f(85)) == pytest.approx(3e-4)
  assert float(f(95)) == pytest.approx(3e-4 * (1 - 0.5**0.5), rel=1e-5)


def _stable_adamw_reference(params, grads_seq, lrs, b1, b2, eps, wd, decays):
  """Wortsman et al. 2023, Algorithm 2, in numpy, one tensor at a time, with the paper's
  debiased betas b(1 - b^(t-1)) / (1 - b^t) (not Adam's division by 1 - b^t); the RMS floor
  max(u, eps^2) as optimi's StableAdamW. Returns the updates and the RMS of each step."""
  v = {k: np.zeros_like(x) for k, x in params.items()}  # first moment (the paper's v)
  u = {k: np.zeros_like(x) for k, x in params.items()}  # second moment (the paper's u)
  theta = {k: np.array(x, np.float64) for k, x in params.items()}
  out, rms_seen = [], []
  for t, (g, lr) in enumerate(zip(grads_seq, lrs), start=1):
    b1_hat = b1 * (1 - b1 ** (t - 1)) / (1 - b1**t)
    b2_hat = b2 * (1 - b2 ** (t - 1)) / (1 - b2**t)
    step = {}
    for k in theta:
      gk = np.asarray(g[k], np.float64)
      v[k] = b1_hat * v[k] + (1 - b1_hat) * gk
      u[k] = b2_hat * u[k] + (1 - b2_hat) * gk**2
      slices = range(gk.shape[0]) if k == "layers" else [slice(None)]  # one tensor per layer
      step[k] = np.zeros_like(gk)
      for sl in slices:
        rms = np.sqrt(np.mean(gk[sl] ** 2 / np.maximum(u[k][sl], eps**2)))
        rms_seen.append(rms)
        eta = lr / max(1.0, rms)
        decay = eta * wd * theta[k][sl] if decays[k] else 0.0
        step[k][sl] = -decay - eta * v[k][sl] / (np.sqrt(u[k][sl]) + eps)
    for k in theta:
      theta[k] = theta[k] + step[k]
    out.append(step)
  return out, rms_seen


def test_stable_adamw_is_the_papers_algorithm_2():
  rng = np.random.default_rng(0)
  params = {
      "kernel": rng.standard_normal((4, 3)).astype(np.float32),
      "bias": rng.standard_normal((3,)).astype(np.float32),
      "layers": rng.standard_normal((2, 5)).astype(np.float32),  # a scan_layers stack
  }
  grads_seq = [_normal_like(params, seed) for seed in range(6)]
  # a spike in one layer of the stack: its RMS jumps above 1 and only that layer is clipped
  grads_seq[3]["layers"][1] *= 50.0
  grads_seq[4]["kernel"] *= 30.0
  lrs = [1e-3, 2e-3, 3e-3, 3e-3, 3e-3, 1e-3]
  b1, b2, eps, wd = 0.9, 0.98, 1e-6, 0.1
  want, rms_seen = _stable_adamw_reference(
      params, grads_seq, lrs, b1, b2, eps, wd, {"kernel": True, "bias": False, "layers": True}
  )
  assert max(rms_seen) > 1.5  # the clipping is exercised, not only the AdamW part

  c = tiny_config(optimizer="stable_adamw", clip_norm=0.0, b1=b1, b2=b2, eps=eps, weight_decay=wd)
  tx = optim.make_optimizer(c.train, lambda count: jnp.asarray(lrs)[count])
  p = jax.tree.map(jnp.asarray, params)
  state = tx.init(p)
  for t, grads in enumerate(grads_seq):
    updates, state = jax.jit(tx.update)(jax.tree.map(jnp.asarray, grads), state, p)
    p = optax.apply_updates(p, updates)
    for k in params:
      np.testing.assert_allclose(updates[k], want[t][k], rtol=2e-4, atol=1e-9, err_msg=(t, k))


def test_stable_adamw_differs_from_adamw_only_when_clipping():
  """Without spikes (RMS <= 1) StableAdamW is optax's AdamW with the same mask."""
  params = {"kernel": jnp.ones((3, 3)), "bias": jnp.zeros((3,))}
  g = {"kernel": jnp.full((3, 3), 0.5), "bias": jnp.full((3,), -0.2)}
  outs = []
  for name in ("adamw", "stable_adamw"):
    c = tiny_config(optimizer=name, clip_norm=0.0, weight_decay=0.01)
    tx = optim.make_optimizer(c.train, lambda _: 1e-3)
    s = tx.init(params)
    for _ in range(3):
      u, s = tx.update(g, s, params)
    outs.append(u)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), *outs)


def test_batch_warmup_grows_the_accumulation_count():
  counts = [int(optim.active_microbatches(t, 4, 100, 1)) for t in (0, 24, 25, 49, 50, 75, 99, 100)]
  assert counts == [1, 1, 2, 2, 3, 4, 4, 4]  # 4 counts, 25 steps each
  assert [int(optim.active_microbatches(t, 4, 90, 2)) for t in (0, 29, 30, 60, 500)] == [
      2,
      2,
      3,
      4,
      4,
  ]
  assert int(optim.active_microbatches(0, 4, 0, 1)) == 4  # off


@pytest.mark.slow
def test_batch_warmup_trains_on_the_first_microbatches_without_recompiling():
  """At step 0 with 1 of 4 microbatches active, the update is exactly that of a batch holding
  only the first microbatch's rows (rows 0, 4, 8, ...); later steps, at other counts, reuse
  the compiled step."""
  mesh = sharding.make_mesh(2, 2, 2)
  c = tiny_config(microbatches=4, warmup_steps=0, batch_size=32)
  c.train.batch_warmup_steps, c.train.batch_warmup_start = 4, 1
  c.model.hidden_dropout_rate = c.model.attention_dropout_rate = 0.0
  s = train.setup(c, mesh)
  batch = _batch(c, mesh)
  state, m = s.train_step(s.init_state(0), batch)
  assert float(m["batch_fraction"]) == 0.25
  rows = {k: np.asarray(v)[0::4] for k, v in jax.device_get(batch).items()}
  c1 = tiny_config(microbatches=1, warmup_steps=0, batch_size=8)
  c1.model.hidden_dropout_rate = c1.model.attention_dropout_rate = 0.0
  s1 = train.setup(c1, mesh)
  state1, m1 = s1.train_step(
      s1.init_state(0), pretraining.global_batch(rows, sharding.batch_sharding(mesh))
  )
  for k in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
    assert float(m[k]) == pytest.approx(float(m1[k]), rel=1e-5), k
  assert float(m["real_token_fraction"]) == pytest.approx(float(m1["real_token_fraction"]) / 4)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      jax.device_get(state.params),
      jax.device_get(state1.params),
  )
  fractions = [0.25]
  for _ in range(4):
    state, m = s.train_step(state, batch)
    fractions.append(float(m["batch_fraction"]))
  assert fractions == [0.25, 0.5, 0.75, 1.0, 1.0]
  assert s.train_step.jitted._cache_size() == 1
