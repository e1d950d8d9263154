"""The shared fine-tuning trainer: batch checks, encoder checks, padded prediction, the loop."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import finetuning, model as model_lib
from bertjax.glue import restore

CFG = model_lib.BertConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
                           intermediate_size=32, max_position_embeddings=16)


def _encoder(bert_params=None) -> restore.Encoder:
  return restore.Encoder(CFG, bert_params, tokenizer=None, source="test")


def _arrays(n: int, seq_len: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
  r = np.random.default_rng(seed)
  mask_NxL = np.ones((n, seq_len), np.int32)
  mask_NxL[:, seq_len // 2:] = r.integers(0, 2, (n, seq_len - seq_len // 2))
  return dict(input_ids=r.integers(5, CFG.vocab_size, (n, seq_len)).astype(np.int32),
              token_type_ids=np.zeros((n, seq_len), np.int32), attention_mask=mask_NxL,
              labels=r.integers(0, 3, n).astype(np.int32))


def _cls_loss(logits_BxC, batch):
  per_example_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, batch["labels"])
  return finetuning.masked_mean(per_example_B, batch["weights"])


def _trainer(recipe=finetuning.Recipe(batch_size=8, eval_batch_size=8), bert_params=None,
             name="ner"):
  make_model = functools.partial(model_lib.BertForSequenceClassification, num_labels=3)
  return finetuning.Trainer(make_model, _encoder(bert_params), recipe, 10, _cls_loss, name)


def test_batch_sizes_must_divide_over_the_devices_and_errors_name_the_command():
  with pytest.raises(ValueError, match=r"^squad: --eval-batch-size=12 is not divisible by the 8"):
    _trainer(finetuning.Recipe(batch_size=8, eval_batch_size=12), name="squad")


def test_restored_encoder_is_checked_against_the_config():
  pre = model_lib.BertForPreTraining(CFG)
  d = model_lib.dummy_inputs(1, 8, 2)
  bert = model_lib.nn.unbox(pre.init(jax.random.key(0), d["input_ids"], d["token_type_ids"],
                                     d["attention_mask"], d["masked_positions"])["params"])["bert"]
  state = _trainer(bert_params=bert).init_state(seed=1, learning_rate=1e-3)
  for got, want in zip(jax.tree.leaves(state.params["bert"]), jax.tree.leaves(bert)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  missing = {**bert, "pooler": {}}
  with pytest.raises(ValueError, match=r"^ner: test: encoder has no bert/pooler/"):
    _trainer(bert_params=missing)
  wrong = jax.tree.map(lambda x: x, bert)
  wrong["embeddings"]["word_embeddings"]["embedding"] = np.zeros((32, 16), np.float32)
  with pytest.raises(ValueError, match=r"has shape \(32, 16\), its config implies \(64, 16\)"):
    _trainer(bert_params=wrong)


def test_predict_pads_the_last_batch_and_drops_the_padding():
  trainer = _trainer()
  state = trainer.init_state(seed=0, learning_rate=0.0)
  arrays = _arrays(11)
  logits_NxC = trainer.predict(state.params, arrays, batch_size=8)
  want_NxC = trainer.model.apply({"params": state.params}, arrays["input_ids"],
                                 arrays["token_type_ids"], arrays["attention_mask"])
  assert logits_NxC.shape == (11, 3)
  np.testing.assert_allclose(logits_NxC, np.asarray(want_NxC), atol=1e-5)
  empty = trainer.predict(state.params, {k: v[:0] for k, v in arrays.items()}, batch_size=8)
  assert empty.shape == (0, 3) and empty.dtype == np.float32


def test_fit_trains_logs_every_epoch_and_keeps_the_best(tmp_path):
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8, epochs=3, learning_rate=1e-2,
                             dropout=0.0)
  trainer = _trainer(recipe)
  train = _arrays(20, seed=1)
  scores = iter([0.9, 0.4, 0.7, 0.2])  # untrained (never kept), then epochs 1-3: 2 is best
  seen = []

  def evaluate(params):
    seen.append(jax.tree.map(np.asarray, params))
    return {"f1": next(scores)}

  result = finetuning.fit(trainer, train, recipe, evaluate, "f1", str(tmp_path),
                          eval_untrained=True, progress=False)
  assert result.best_epoch == 2 and result.best == {"f1": 0.7}
  for got, want in zip(jax.tree.leaves(result.best_params), jax.tree.leaves(seen[2])):
    np.testing.assert_array_equal(np.asarray(got), want)
  # 20 rows at batch 8: 3 steps an epoch, the last padded with zero-weight rows.
  assert finetuning.steps_per_epoch(20, recipe) == 3
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), seen[0], seen[3])
  assert all(jax.tree.leaves(changed["classifier"]))
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["epoch"] for l in lines] == [0, 1, 2, 3]
  assert [l["f1"] for l in lines] == [0.9, 0.4, 0.7, 0.2]
  assert all(np.isfinite(l["train_loss"]) for l in lines[1:])


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


def test_load_encoder_messages_name_the_command(tmp_path):
  with pytest.raises(ValueError, match=r"^squad: --init random needs --tokenizer"):
    restore.load_encoder("random", prefix="squad")
  with pytest.raises(FileNotFoundError, match=r"^ner: --init .*: no such checkpoint"):
    restore.load_encoder(str(tmp_path / "missing"), prefix="ner")


def test_default_learning_rate_follows_the_encoder_width():
  assert finetuning.learning_rates_for(128)[:2] == (1e-3, (3e-3, 1e-3, 3e-4, 1e-4))
  assert finetuning.learning_rates_for(256)[0] == 5e-4
  assert finetuning.learning_rates_for(512)[0] == 1e-4
  lr, grid, why = finetuning.learning_rates_for(768, 3e-5)
  assert (lr, grid) == (3e-5, (5e-5, 4e-5, 3e-5, 2e-5)) and "BERT" in why  # BERT's, as the paper
  assert finetuning.learning_rates_for(1024)[0] == 2e-5
