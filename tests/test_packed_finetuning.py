"""Packed fine-tuning (GLUE): several examples share a row, each pooled from its own tokens.

The same parameters give the same predictions packed and unpacked, in the input's order, with
one compiled shape per step; a short training run packed scores as unpacked, within seed noise.
"""

import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.tasks import batching, encoder as encoder_lib, finetuning
from bertjax.tasks.glue import features, finetune, tasks

CFG = model_lib.BertConfig(
    vocab_size=64,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
MAX_LEN = 48


def _arrays(n, seed=0, pairs=True):
  """`n` rows of random ids (3..20 real tokens, some pairs of segments), labels by a token."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((n, MAX_LEN), np.int32)
  types = np.zeros((n, MAX_LEN), np.int32)
  mask = np.zeros((n, MAX_LEN), np.int32)
  labels = np.zeros(n, np.float32)
  for i in range(n):
    k = int(rng.integers(3, 21))
    ids[i, :k] = rng.integers(5, CFG.vocab_size, k)
    ids[i, 0] = 2  # [CLS]
    labels[i] = float(5 in ids[i, 1:k] or 6 in ids[i, 1:k] or 7 in ids[i, 1:k])
    if pairs and k > 6 and i % 2:
      types[i, k // 2 : k] = 1
    mask[i, :k] = 1
  return dict(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)


def _trainer(task, packing, pooling="cls"):
  enc = encoder_lib.Encoder(CFG, None, tokenizer=None, source="random")
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8, pooling=pooling)
  return finetune.make_trainer(task, enc, recipe, 10, packing=packing)


def test_first_fit_decreasing_fills_rows_within_their_limits():
  lengths = np.array([30, 20, 20, 10, 9, 5, 5, 1])
  rows = batching.pack_examples(lengths, 40, 3)
  assert sorted(i for r in rows for i in r) == list(range(8))
  assert all(lengths[r].sum() <= 40 and len(r) <= 3 for r in rows)
  assert rows[0] == [0, 3]  # 30 then the first example that fits: 10
  order = np.random.default_rng(1).permutation(8)
  assert len(batching.pack_examples(lengths, 40, 3, order)) == len(rows)


@pytest.mark.parametrize("task_name,pooling", [("sst2", "cls"), ("sst2", "mean"), ("stsb", "mean")])
def test_packed_predictions_equal_unpacked_in_input_order(task_name, pooling):
  task = tasks.TASKS[task_name]
  arrays = _arrays(37)
  plain = _trainer(task, 0, pooling)
  packed = _trainer(task, 4, pooling)
  params = plain.init_state(3, 0.0).params
  want = plain.predict(params, arrays, 8)
  got = packed.predict(params, arrays, 8)
  assert got.shape == want.shape == (37, task.num_labels)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  # rows really shared: fewer predict rows than examples, one compiled predict shape
  lengths = batching.example_lengths(arrays["attention_mask"])
  assert len(batching.pack_examples(lengths, MAX_LEN, 4)) < 37 / 2
  assert packed.compiled_shapes() == (0, 1)


def _features(arrays):
  return features.Features(
      arrays["input_ids"], arrays["token_type_ids"], arrays["attention_mask"], arrays["labels"]
  )


def test_packed_training_scores_as_unpacked(tmp_path):
  """Same data, recipe and seed: dev accuracy packed is within seed noise of unpacked, with
  one compiled train step and one predict step."""
  task = tasks.TASKS["sst2"]
  data = dict(
      train=_features(_arrays(512, seed=1, pairs=False)),
      dev=_features(_arrays(128, seed=2, pairs=False)),
  )
  enc = encoder_lib.Encoder(CFG, None, tokenizer=None, source="random")
  recipe = finetuning.Recipe(
      batch_size=16, eval_batch_size=16, learning_rate=2e-3, epochs=3, dropout=0.0
  )
  runs = {}
  for packing in (0, 4):
    runs[packing] = finetune.train_and_evaluate(
        task,
        enc,
        data,
        recipe,
        str(tmp_path / str(packing)),
        progress=False,
        save_checkpoint=False,
        packing=packing,
    )
  finetune.clear_trainer_cache()
  scores = {k: r.dev["accuracy"] for k, r in runs.items()}
  labels = data["dev"].labels_N
  majority = max(np.mean(labels), 1 - np.mean(labels))
  assert scores[0] > majority + 0.1, (scores, majority)
  assert abs(scores[4] - scores[0]) <= 0.08, scores
  assert runs[4].compiled_shapes == (1, 1)


def test_glue_packing_flag():
  from bertjax.commands import glue

  base = ["--task", "sst2", "--workdir", "out", "--init", "random"]
  assert glue._parser().parse_args(base).packing is glue.PACKING_DEFAULT
  assert glue._parser().parse_args(base + ["--no-packing"]).packing is False
  assert glue._parser().parse_args(base + ["--packing"]).packing is True
  assert [glue.packed_examples(n) for n in (8, 64, 128, 512)] == [1, 4, 8, 32]


def test_packed_loss_and_gradients_equal_unpacked():
  """The loss of a packed batch averages over its examples as an unpacked batch does, and its
  gradients match: packing changes which examples share a row, not what is learned from them."""
  import jax
  import jax.numpy as jnp

  task = tasks.TASKS["sst2"]
  arrays = _arrays(24)
  plain, packed = _trainer(task, 0), _trainer(task, 4)
  params = plain.init_state(3, 0.0).params
  lengths = batching.example_lengths(arrays["attention_mask"])
  rows = batching.pack_examples(lengths, MAX_LEN, 4)
  batches = (
      batching.train_batch(arrays, np.arange(24), MAX_LEN, 24),
      batching.packed_batch(arrays, lengths, rows, 4, len(rows) + 1)[0],  # + an empty row
  )

  def loss_and_grads(trainer, batch):
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    loss = lambda p: finetune.glue_loss(
        finetuning._apply(trainer.model, p, batch, deterministic=True), batch, regression=False
    )
    return jax.value_and_grad(loss)(params)

  (want_loss, want), (got_loss, got) = (
      loss_and_grads(t, b) for t, b in zip((plain, packed), batches)
  )
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, atol=1e-5 * float(np.abs(w).max()) + 1e-9)
