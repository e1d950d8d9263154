"""The shared fine-tuning trainer: batch checks, encoder checks, padded prediction, the loop."""

import argparse
import dataclasses
import functools
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import flax.linen as nn

from bertjax import errors, model as model_lib
from bertjax.tasks import batching, encoder as encoder_lib, finetuning, recipe as recipe_lib
from bertjax.tasks.finetuning import trainer as trainer_lib
from bertjax.training import checkpoint, sharding, train

CFG = model_lib.BertConfig(
    vocab_size=64,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)


def _encoder(bert_params=None) -> encoder_lib.Encoder:
  return encoder_lib.Encoder(CFG, bert_params, tokenizer=None, source="test")


def _arrays(n: int, seq_len: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
  r = np.random.default_rng(seed)
  mask_NxL = np.ones((n, seq_len), np.int32)
  mask_NxL[:, seq_len // 2 :] = r.integers(0, 2, (n, seq_len - seq_len // 2))
  return dict(
      input_ids=r.integers(5, CFG.vocab_size, (n, seq_len)).astype(np.int32),
      token_type_ids=np.zeros((n, seq_len), np.int32),
      attention_mask=mask_NxL,
      labels=r.integers(0, 3, n).astype(np.int32),
  )


def _cls_loss(logits_BxC, batch):
  per_example_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, batch["labels"])
  return finetuning.masked_mean(per_example_B, batch["weights"])


def _trainer(
    recipe=finetuning.Recipe(batch_size=8, eval_batch_size=8),
    bert_params=None,
    name="ner",
    mesh=None,
):
  make_model = functools.partial(model_lib.BertForSequenceClassification, num_labels=3)
  return finetuning.Trainer(make_model, _encoder(bert_params), recipe, 10, _cls_loss, name, mesh)


def _one_device():
  """A mesh of one device: it compiles faster than the 8 fake ones where sharding is moot."""
  return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def test_batch_sizes_must_divide_over_the_devices_and_errors_name_the_field():
  with pytest.raises(
      errors.ConfigError, match=r"^Recipe.eval_batch_size=12 is not divisible by the 8"
  ):
    _trainer(finetuning.Recipe(batch_size=8, eval_batch_size=12), name="squad")


@pytest.mark.slow
def test_restored_encoder_is_checked_against_the_config():
  pre = model_lib.BertForPreTraining(CFG)
  d = model_lib.dummy_inputs(1, 8, 2)
  bert = nn.unbox(
      pre.init(
          jax.random.key(0),
          d["input_ids"],
          d["token_type_ids"],
          d["attention_mask"],
          d["masked_positions"],
      )["params"]
  )["bert"]
  state = _trainer(bert_params=bert).init_state(seed=1, learning_rate=1e-3)
  for got, want in zip(jax.tree.leaves(state.params["bert"]), jax.tree.leaves(bert)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  missing = {**bert, "pooler": {}}
  with pytest.raises(
      checkpoint.CheckpointMismatchError, match=r"^test: encoder has no bert/pooler/"
  ):
    _trainer(bert_params=missing)
  wrong = jax.tree.map(lambda x: x, bert)
  wrong["embeddings"]["word_embeddings"]["embedding"] = np.zeros((32, 16), np.float32)
  with pytest.raises(
      checkpoint.CheckpointMismatchError,
      match=r"has shape \(32, 16\), its config implies \(64, 16\)",
  ):
    _trainer(bert_params=wrong)


@pytest.mark.slow
def test_predict_pads_the_last_batch_and_drops_the_padding():
  trainer = _trainer()
  state = trainer.init_state(seed=0, learning_rate=0.0)
  arrays = _arrays(11)
  logits_NxC = trainer.predict(state.params, arrays, batch_size=8)
  want_NxC = trainer.model.apply(
      {"params": state.params},
      arrays["input_ids"],
      arrays["token_type_ids"],
      arrays["attention_mask"],
  )
  assert logits_NxC.shape == (11, 3)
  np.testing.assert_allclose(logits_NxC, np.asarray(want_NxC), atol=1e-5)
  empty = trainer.predict(state.params, {k: v[:0] for k, v in arrays.items()}, batch_size=8)
  assert empty.shape == (0, 3) and empty.dtype == np.float32


@pytest.mark.slow
def test_fit_trains_logs_every_epoch_and_keeps_the_best(tmp_path):
  recipe = finetuning.Recipe(
      batch_size=8, eval_batch_size=8, epochs=3, learning_rate=1e-2, dropout=0.0
  )
  trainer = _trainer(recipe)
  train = _arrays(20, seed=1)
  scores = iter([0.9, 0.4, 0.7, 0.2])  # untrained (never kept), then epochs 1-3: 2 is best
  seen = []

  def evaluate(params):
    seen.append(jax.tree.map(np.asarray, params))
    return {"f1": next(scores)}

  result = finetuning.fit(
      trainer, train, recipe, evaluate, "f1", str(tmp_path), eval_untrained=True, progress=False
  )
  assert result.best_epoch == 2 and result.best == {"f1": 0.7}
  for got, want in zip(jax.tree.leaves(result.best_params), jax.tree.leaves(seen[2])):
    np.testing.assert_array_equal(np.asarray(got), want)
  # 20 rows at batch 8: 3 steps an epoch, the last padded with zero-weight rows.
  assert recipe_lib.steps_per_epoch(20, recipe) == 3
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), seen[0], seen[3])
  assert all(jax.tree.leaves(changed["classifier"]))
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["epoch"] for l in lines] == [0, 1, 2, 3]
  assert [l["f1"] for l in lines] == [0.9, 0.4, 0.7, 0.2]
  assert all(np.isfinite(l["train_loss"]) for l in lines[1:])


@pytest.mark.slow
def test_padding_rows_do_not_change_the_step():
  """A batch whose padding rows differ gives the same update: their weight is 0."""
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8, dropout=0.0)
  trainer = _trainer(recipe)
  a, b = _arrays(8, seed=2), _arrays(8, seed=3)
  weights_B = np.array([1, 1, 1, 1, 1, 0, 0, 0], np.float32)
  mixed = {k: np.concatenate([a[k][:5], b[k][5:]]) for k in a}
  out = []
  for batch in (a, mixed):
    state = trainer.init_state(seed=0, learning_rate=1e-3)
    state, loss = trainer.train_step(state, dict(batch, weights=weights_B))
    out.append((float(loss), jax.tree.map(np.asarray, state.params)))
  assert out[0][0] == pytest.approx(out[1][0], abs=1e-6)
  for x, y in zip(jax.tree.leaves(out[0][1]), jax.tree.leaves(out[1][1])):
    np.testing.assert_allclose(x, y, atol=1e-6)


def test_load_encoder_messages_name_the_arguments(tmp_path):
  with pytest.raises(errors.ConfigError, match=r"^init random needs tokenizer"):
    encoder_lib.load_encoder("random")
  with pytest.raises(errors.InputNotFoundError, match=r"^init .*: no such checkpoint"):
    encoder_lib.load_encoder(str(tmp_path / "missing"))


def test_default_learning_rate_follows_the_encoder_width():
  assert recipe_lib.learning_rates_for(128)[:2] == (1e-3, (3e-3, 1e-3, 3e-4, 1e-4))
  assert recipe_lib.learning_rates_for(256)[0] == 5e-4
  assert recipe_lib.learning_rates_for(512)[0] == 1e-4
  lr, grid, why = recipe_lib.learning_rates_for(768, 3e-5)
  assert (lr, grid) == (3e-5, (5e-5, 4e-5, 3e-5, 2e-5)) and "BERT" in why  # BERT's, as the paper
  assert recipe_lib.learning_rates_for(1024)[0] == 2e-5


def _varied_lengths(n: int, seq_len: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
  """Rows of 2..seq_len real tokens, padded to seq_len, as the feature builders write them."""
  r = np.random.default_rng(seed)
  len_N = r.integers(2, seq_len + 1, n)
  mask_NxL = (np.arange(seq_len)[None, :] < len_N[:, None]).astype(np.int32)
  return dict(
      input_ids=r.integers(5, CFG.vocab_size, (n, seq_len)).astype(np.int32) * mask_NxL,
      token_type_ids=np.zeros((n, seq_len), np.int32),
      attention_mask=mask_NxL,
      labels=r.integers(0, 3, n).astype(np.int32),
  )


def test_epoch_batches_group_lengths_shuffle_and_repeat_with_the_seed():
  padded_N = batching.padded_lengths(_varied_lengths(50)["attention_mask"], 4)
  assert set(padded_N) <= {4, 8, 12, 16}
  plan = batching.epoch_batches(padded_N, 8, np.random.default_rng(3))
  assert len(plan) == 7 and sorted(np.concatenate(plan)) == list(range(50))
  mixed = [b for b in plan if len(set(padded_N[b])) > 1]
  assert len(mixed) <= 3  # only the batches on a length's boundary
  again = batching.epoch_batches(padded_N, 8, np.random.default_rng(3))
  assert all(np.array_equal(a, b) for a, b in zip(plan, again))
  other = batching.epoch_batches(padded_N, 8, np.random.default_rng(4))
  assert not all(np.array_equal(a, b) for a, b in zip(plan, other))
  assert set(batching.padded_lengths(_varied_lengths(5)["attention_mask"], 0)) == {16}


@pytest.mark.slow
def test_bucketed_steps_and_predictions_match_full_length(tmp_path, monkeypatch):
  """Dropout off, the same rows per step: cutting batches to their bucket changes the loss only
  by float noise, and predictions come back in the input's order."""
  monkeypatch.setattr(finetuning, "COMPILE_COST_STEPS", 0)  # every length is worth its compile
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8, dropout=0.0, length_bucket=8)
  trainer = _trainer(recipe, mesh=_one_device())
  train = _varied_lengths(32, seed=1)
  padded_N = batching.padded_lengths(train["attention_mask"], 8)
  plan = batching.epoch_batches(padded_N, 8, np.random.default_rng(0))
  bucketed = full = trainer.init_state(seed=0, learning_rate=1e-2)
  full = jax.tree.map(jnp.copy, full)  # the step donates its state
  for idx in plan:
    bucketed, loss_b = trainer.train_step(
        bucketed, batching.train_batch(train, idx, int(padded_N[idx].max()), 8)
    )
    full, loss_f = trainer.train_step(full, batching.train_batch(train, idx, 16, 8))
    assert float(loss_b) == pytest.approx(float(loss_f), rel=1e-5, abs=1e-6)
  assert trainer.compiled_shapes()[0] == 2  # lengths 8 and 16
  dev = _varied_lengths(80, seed=5)
  got = trainer.predict(bucketed.params, dev, 8)
  assert trainer.compiled_shapes()[1] == 2  # rows of lengths 8 and 16, each sorted together
  no_buckets = _trainer(dataclasses.replace(recipe, length_bucket=0), mesh=_one_device())
  want = no_buckets.predict(bucketed.params, dev, 8)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
  assert no_buckets.compiled_shapes()[1] == 1
  # A sweep's next runs (another learning rate and seed) reuse the compiled steps.
  for lr, seed in ((1e-2, 0), (3e-3, 1)):
    finetuning.fit(
        trainer,
        train,
        dataclasses.replace(recipe, learning_rate=lr, seed=seed, epochs=1),
        lambda params: {"f1": 0.0},
        "f1",
        str(tmp_path / f"{lr}-{seed}"),
        progress=False,
    )
    assert trainer.compiled_shapes()[0] == 2
  # fit compiled the lengths it uses before its first step (rows this few share one length)
  used = batching.padded_lengths(
      train["attention_mask"], 8, 4 * 8, recipe.max_lengths, finetuning.compile_tokens(8, 1)
  )
  assert sorted(k[1][1][1] for k in trainer._executables if k[0] == "train") == [16]
  assert set(used) == {16}


@pytest.mark.slow
def test_fit_compiles_the_evaluations_predict_steps_with_the_train_step(tmp_path):
  """`fit(predicts=...)` compiles every predict shape the evaluation will use before the first
  train step, beside the train step: evaluating compiles nothing more."""
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8, dropout=0.0, epochs=1)
  trainer = _trainer(recipe, mesh=_one_device())
  train, dev = _varied_lengths(32, seed=1), _varied_lengths(40, seed=5)
  seen = []

  def evaluate(params):
    seen.append(sorted(k for k in trainer._executables if k[0] == "predict"))
    traces = trainer.compiled_shapes()[1]
    trainer.predict(params, dev, 8)
    assert trainer.compiled_shapes()[1] == traces  # nothing traced at evaluation
    return {"f1": 0.0}

  finetuning.fit(
      trainer, train, recipe, evaluate, "f1", str(tmp_path), progress=False, predicts=(dev,)
  )
  want = {trainer_lib._shapes(*job[::2]) for job in trainer.predict_jobs(None, dev, 8)}
  assert seen and seen[0] and set(seen[0]) == want


def test_fsdp_on_8_devices_matches_1_device():
  """--mesh 2,4,1 splits the encoder's weights over fsdp as pretraining does; the steps match
  one device's."""
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8, dropout=0.0, mesh=(2, 4, 1))
  fsdp = _trainer(recipe)
  assert "fsdp" in str(fsdp.param_sh["bert"]["embeddings"]["word_embeddings"]["embedding"].spec)
  one = _trainer(recipe, mesh=_one_device())
  train = _varied_lengths(16, seed=4)
  states = [t.init_state(seed=0, learning_rate=1e-2) for t in (fsdp, one)]
  for idx in (np.arange(8), np.arange(8, 16)):
    batch = batching.train_batch(train, idx, 16, 8)
    (states[0], loss_a), (states[1], loss_b) = (
        t.train_step(s, batch) for t, s in zip((fsdp, one), states)
    )
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-5)
  for a, b in zip(jax.tree.leaves(states[0].params), jax.tree.leaves(states[1].params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_steps_run_under_the_rules_on_the_shared_state():
  """The state is pretraining's class; the steps are traced under the logical-axis rules, so the
  model's activation constraints are in them (outside the rules they are no-ops)."""
  trainer = _trainer(finetuning.Recipe(batch_size=8, eval_batch_size=8, mesh=(2, 4, 1)))
  assert type(trainer.built.abstract) is train.TrainState
  batch = {
      k: jax.ShapeDtypeStruct((8, 8), jnp.int32, sharding=trainer.batch_sh)
      for k in ("input_ids", "token_type_ids", "attention_mask")
  }
  batch["labels"] = jax.ShapeDtypeStruct((8,), jnp.int32, sharding=trainer.batch_sh)
  batch["weights"] = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=trainer.batch_sh)
  train_hlo = trainer._train.lower(trainer.built.abstract, batch).as_text()
  predict_hlo = trainer._predict.lower(trainer.built.abstract.params, batch).as_text()
  assert "sharding_constraint" in train_hlo and "sharding_constraint" in predict_hlo
  assert trainer.compiled_shapes() == (1, 1)  # traced, nothing compiled or run


def test_a_negative_learning_rate_never_makes_a_state():
  trainer = _trainer()
  for lr in (-1e-3, float("nan")):
    with pytest.raises(errors.ConfigError, match=r"^learning_rate=.* must be a finite number >= 0"):
      trainer.init_state(seed=0, learning_rate=lr)
  with pytest.raises(errors.ConfigError, match=r"^Recipe.learning_rate=-0.001 must be"):
    finetuning.Recipe(learning_rate=-1e-3)


def test_mesh_errors_name_the_field():
  with pytest.raises(errors.ConfigError, match=r"^Recipe.mesh=\(3, 1, 1\): .* 8 devices"):
    _trainer(finetuning.Recipe(batch_size=8, eval_batch_size=8, mesh=(3, 1, 1)), name="glue")


def test_fewest_padded_lengths_is_the_best_choice_of_k():
  """The dynamic programme keeps the k lengths (the longest among them) that pad least:
  checked against every choice of k on random length histograms."""
  rng = np.random.default_rng(0)
  for _ in range(30):
    lengths = np.sort(rng.choice(np.arange(8, 129, 8), rng.integers(2, 9), replace=False))
    counts = rng.integers(1, 50, len(lengths))
    k = int(rng.integers(1, len(lengths) + 1))

    def padded(kept):
      return int(sum(c * kept[np.searchsorted(kept, v)] for v, c in zip(lengths, counts)))

    best = min(
        padded(np.array(sorted(c) + [lengths[-1]]))
        for c in itertools.combinations(lengths[:-1], k - 1)
    )
    got = batching.fewest_padded_lengths(lengths, counts, k)
    assert len(got) == k and got[-1] == lengths[-1] and padded(got) == best


def test_max_lengths_caps_the_compiled_shapes():
  mask_NxL = _varied_lengths(400, seed=2)["attention_mask"]
  free = batching.padded_lengths(mask_NxL, 1)
  capped = batching.padded_lengths(mask_NxL, 1, max_lengths=3)
  assert len(np.unique(free)) > 3 and len(np.unique(capped)) == 3
  assert np.all(capped >= free) and capped.max() == free.max()


def test_a_length_is_kept_only_if_it_saves_more_than_a_compile():
  lengths, counts = np.array([8, 16, 24, 32]), np.array([100, 100, 100, 100])
  # one length: 400 * 32 = 12,800 tokens; all four: 8,000 (4,800 saved by three more lengths)
  assert list(batching.fewest_padded_lengths(lengths, counts, 4, 0.0)) == [8, 16, 24, 32]
  assert list(batching.fewest_padded_lengths(lengths, counts, 4, 5000.0)) == [32]
  # two lengths (16, 32) pad to 9,600: 3,200 saved by one more, worth it below 3,200
  assert list(batching.fewest_padded_lengths(lengths, counts, 4, 3000.0)) == [16, 32]
  # fewer epochs, a compile is worth more of each epoch's tokens: fewer lengths
  mask_NxL = _varied_lengths(2000, seq_len=64, seed=3)["attention_mask"]
  per_run = [
      len(np.unique(batching.padded_lengths(mask_NxL, 8, 0, 8, finetuning.compile_tokens(8, e))))
      for e in (1, 3, 30)
  ]
  assert per_run == sorted(per_run) and per_run[0] < per_run[-1] <= 8


def test_rare_lengths_join_the_next_longer_one():
  mask_NxL = np.arange(16)[None, :] < np.array([3] * 10 + [7] * 2 + [16] * 3)[:, None]
  assert list(batching.padded_lengths(mask_NxL, 4)) == [4] * 10 + [8] * 2 + [16] * 3
  assert list(batching.padded_lengths(mask_NxL, 4, 3)) == [4] * 10 + [16] * 5
  assert list(batching.padded_lengths(mask_NxL, 4, 4)) == [4] * 10 + [16] * 5
  assert list(batching.padded_lengths(mask_NxL, 4, 6)) == [16] * 15


def test_the_default_mesh_is_the_pretraining_runs_when_it_fits(tmp_path):
  """No --mesh: glue/squad/ner take the mesh from the pretrain workdir's config.json (also for
  one of its checkpoints/<step> dirs) when it fits these (8) devices, else data-parallel."""
  from bertjax.commands import finetune_args

  def workdir(name, mesh):
    d = tmp_path / name
    (d / "checkpoints" / "100").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"mesh": mesh}))
    return d

  fsdp = workdir("fsdp", {"data": 2, "fsdp": -1, "tensor": 1, "dcn_data": 1})
  assert finetune_args.pretrained_mesh(str(fsdp))[0] == (2, -1, 1)
  assert finetune_args.pretrained_mesh(str(fsdp / "checkpoints" / "100"))[0] == (2, -1, 1)
  too_big = workdir("big", {"data": 1, "fsdp": 16, "tensor": 1})
  mesh, why = finetune_args.pretrained_mesh(str(too_big))
  assert mesh == (-1, 1, 1) and "does not fit" in why and "16" in why
  assert finetune_args.pretrained_mesh("random")[0] == (-1, 1, 1)
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"hidden_size": 128}))
  assert finetune_args.pretrained_mesh(str(hf)) == (
      (-1, 1, 1),
      "data-parallel over every device; no pretraining mesh recorded",
  )
  args = argparse.Namespace(
      init=str(fsdp),
      mesh=None,
      learning_rate=1e-3,
      optimizer="adamw",
      bert_learning_rate=False,
      epochs=1,
      batch_size=8,
      eval_batch_size=8,
      warmup=0.1,
      weight_decay=0.01,
      dropout=0.1,
      seed=0,
      max_steps=0,
      length_bucket=8,
      max_lengths=8,
  )
  assert finetune_args.recipe_from_args(args, 128, "glue").mesh == (2, -1, 1)
