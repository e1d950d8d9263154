"""Packed fine-tuning (GLUE): several examples share a row, each pooled from its own tokens.

The same parameters give the same predictions packed and unpacked, in the input's order, with
one compiled shape per step; a short training run packed scores as unpacked, within seed noise.
"""

import numpy as np
import pytest

from bertjax import errors, model as model_lib
from bertjax.commands import finetune_args
from bertjax.tasks import batching, encoder as encoder_lib, finetuning
from bertjax.tasks.finetuning import trainer as trainer_lib
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
  scores = {k: r.dev["accuracy"] for k, r in runs.items()}
  labels = data["dev"].labels_N
  majority = max(np.mean(labels), 1 - np.mean(labels))
  assert scores[0] > majority + 0.1, (scores, majority)
  assert abs(scores[4] - scores[0]) <= 0.08, scores
  assert runs[4].compiled_shapes == (1, 1)


def test_glue_packing_flag():
  from bertjax.commands import glue

  base = ["--task", "sst2", "--workdir", "out", "--init", "random"]

  def packing(*flags):
    return finetune_args.resolve_packing(glue._parser().parse_args(base + list(flags)))

  assert glue.PACKING_DEFAULT is True and packing() is True  # measured faster (docs/glue.md)
  assert packing("--no-packing") is False and packing("--packing") is True
  # asking for length buckets asks for unpacked batches; with --packing it is a mistake
  assert packing("--length-bucket", "16") is False and packing("--max-lengths", "2") is False
  with pytest.raises(errors.ConfigError, match="--length-bucket.*--no-packing"):
    packing("--packing", "--length-bucket", "16")
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
        trainer_lib._apply(trainer.model, p, batch, deterministic=True), batch, regression=False
    )
    return jax.jit(jax.value_and_grad(loss))(params)  # compiled: eager dispatch is slow

  (want_loss, want), (got_loss, got) = (
      loss_and_grads(t, b) for t, b in zip((plain, packed), batches)
  )
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, atol=1e-5 * float(np.abs(w).max()) + 1e-9)


# ------------------------------------------------------------------------- SQuAD, NER, extract
import json
import os
import random

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER = os.path.join(REPO, "data", "tokenizer.model")
_FILLER = "the a of and to in was is that it her his he she had for with as not be".split()
_NOUNS = "house sister mother father day time man lady way room family evening morning".split()


def _tokenizer():
  from bertjax.data.tokenizer import SentencePieceTokenizer

  return SentencePieceTokenizer(TOKENIZER)


def _small_encoder(vocab_size):
  cfg = CFG.replace(vocab_size=vocab_size, max_position_embeddings=64)
  return encoder_lib.Encoder(cfg, None, tokenizer=None, source="random")


def _squad_file(path, n, seed, max_words=40):
  """Questions whose answer is the word after "letter", in contexts of 3..`max_words` words:
  short ones share packed rows, long ones are cut into doc-stride windows."""
  r = random.Random(seed)
  paragraphs = []
  for i in range(n):
    words = [r.choice(_FILLER) for _ in range(r.randint(3, max_words))]
    k = r.randint(0, len(words))
    answer = r.choice(_NOUNS)
    words[k:k] = ["letter", answer]
    start = len(" ".join(words[: k + 1])) + 1
    qa = dict(
        id=f"q{i}",
        question="what came with the letter ?",
        answers=[dict(text=answer, answer_start=start)],
    )
    paragraphs.append(dict(context=" ".join(words), qas=[qa]))
  path.write_text(json.dumps(dict(version="1.1", data=[dict(title="t", paragraphs=[*paragraphs])])))


def _tagged_file(path, n, seed):
  """Sentences of 2..12 words tagged by word identity (names B-PER, places B-LOC, else O)."""
  r = random.Random(seed)
  names, places = "elizabeth jane lydia darcy".split(), "london kent bath".split()
  with open(path, "w") as f:
    for _ in range(n):
      words = []
      for _ in range(r.randint(2, 12)):
        u = r.random()
        if u < 0.2:
          words.append((r.choice(names), "B-PER"))
        elif u < 0.35:
          words.append((r.choice(places), "B-LOC"))
        else:
          words.append((r.choice(_FILLER), "O"))
      f.write("".join(f"{w} {t}\n" for w, t in words) + "\n")


def _real(x_NxL, mask_NxL):
  return np.where(mask_NxL.astype(bool), x_NxL, 0.0)


def test_squad_packed_logits_and_answers_equal_unpacked(tmp_path):
  """Windows (doc-stride ones among them) packed several to a row give each window's start and
  end logits of its own tokens, in the input's order, and the same answers."""
  from bertjax.tasks.squad import data, features as squad_features, train

  _squad_file(tmp_path / "dev.json", 24, 0, max_words=70)
  examples, _ = data.read(str(tmp_path / "dev.json"), "1.1", training=False)
  tok = _tokenizer()
  feats = squad_features.build(tok, examples, 64, 16, 12, training=False)
  assert len(feats) > len(examples)  # long contexts took several windows
  enc = _small_encoder(tok.vocab_size)
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8)
  opts = train.Options(max_seq_len=64, doc_stride=16, max_query_length=12)
  trainers = {
      p: finetuning.Trainer(
          train.make_model(p), enc, recipe, 10, train.squad_loss, "squad", packing=p
      )
      for p in (0, 3)
  }
  params = trainers[0].init_state(1, 0.0).params
  got = {}
  for p, trainer in trainers.items():
    logits = trainer.predict(params, feats.arrays, 8)
    scores, dec = train.predict_and_score(trainer, params, tok, examples, feats, recipe, opts)
    got[p] = (logits, scores, dec.predictions)
  mask = feats.arrays["attention_mask"]
  for want, have in zip(got[0][0], got[3][0]):
    assert have.shape == want.shape == mask.shape
    np.testing.assert_allclose(_real(have, mask), _real(want, mask), atol=1e-5, rtol=0)
  assert got[3][1:] == got[0][1:]
  lengths = batching.example_lengths(mask)
  assert sum(len(r) > 1 for r in batching.pack_examples(lengths, 64, 3)) >= 3  # rows shared
  assert trainers[3].compiled_shapes() == (0, 1)


def test_squad_packed_loss_reads_each_window_alone():
  """The packed loss of a window is the cross-entropy of its own start and end logits (the
  softmax over its own tokens): as the window alone in a row of its length."""
  import jax.numpy as jnp

  from bertjax.tasks.squad import train

  rng = np.random.default_rng(0)
  lengths = [5, 9, 3]
  start_E, end_E = np.array([2, 0, 1]), np.array([3, 8, 2])
  logits = [rng.normal(size=(n,)).astype(np.float32) for n in lengths]
  row_L = np.concatenate(logits + [np.full(3, 7.0, np.float32)])  # padding after them
  seg_L = np.concatenate([np.full(n, e + 1) for e, n in enumerate(lengths)] + [np.zeros(3)])
  batch = dict(
      segment_ids=jnp.asarray(seg_L[None], jnp.int32),
      cls_positions=jnp.asarray([[0, 5, 14, -1]], jnp.int32),
      start_positions=jnp.asarray(np.append(start_E, 0)[None], jnp.int32),
      end_positions=jnp.asarray(np.append(end_E, 0)[None], jnp.int32),
      weights=jnp.asarray([[1.0, 1.0, 1.0, 0.0]]),
  )
  got = train.squad_loss((jnp.asarray(row_L[None]), jnp.asarray(row_L[None])), batch)
  alone = [
      train.squad_loss(
          (jnp.asarray(x[None]), jnp.asarray(x[None])),
          dict(
              start_positions=jnp.asarray([s]), end_positions=jnp.asarray([t]), weights=jnp.ones(1)
          ),
      )
      for x, s, t in zip(logits, start_E, end_E)
  ]
  np.testing.assert_allclose(got, np.mean(alone), rtol=1e-6)


def test_ner_packed_logits_and_tags_equal_unpacked(tmp_path):
  """Sentences packed several to a row are tagged from their own tokens: the same logits at
  every real token and the same tags, in the input's order."""
  from bertjax.tasks.ner import conll, features as ner_features, train

  _tagged_file(tmp_path / "dev.txt", 40, 0)
  sents = conll.read(str(tmp_path / "dev.txt"))
  labels = conll.label_list(sents)
  tok = _tokenizer()
  feats = ner_features.build(tok, sents, labels, 32)
  enc = _small_encoder(tok.vocab_size)
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8)
  trainers = {
      p: finetuning.Trainer(
          train.make_model(len(labels), p), enc, recipe, 10, train.ner_loss, "ner", packing=p
      )
      for p in (0, 4)
  }
  params = trainers[0].init_state(2, 0.0).params
  mask = feats.arrays["attention_mask"]
  logits = {p: t.predict(params, feats.arrays, 8) for p, t in trainers.items()}
  assert logits[4].shape == logits[0].shape == mask.shape + (len(labels),)
  np.testing.assert_allclose(
      _real(logits[4], mask[..., None]), _real(logits[0], mask[..., None]), atol=1e-5, rtol=0
  )
  tags = {p: train.tag(t, params, sents, feats, labels, 8) for p, t in trainers.items()}
  assert tags[4] == tags[0]
  lengths = batching.example_lengths(mask)
  assert len(batching.pack_examples(lengths, 32, 4)) < 0.6 * len(feats)
  assert trainers[4].compiled_shapes() == (0, 1)


def test_ner_packed_loss_and_gradients_equal_unpacked(tmp_path):
  """NER's loss is the mean over scored pieces: packed rows give the unpacked value and
  gradients."""
  import jax
  import jax.numpy as jnp

  from bertjax.tasks.ner import conll, features as ner_features, train

  _tagged_file(tmp_path / "t.txt", 12, 3)
  sents = conll.read(str(tmp_path / "t.txt"))
  labels = conll.label_list(sents)
  feats = ner_features.build(_tokenizer(), sents, labels, 32)
  enc = _small_encoder(_tokenizer().vocab_size)
  recipe = finetuning.Recipe(batch_size=8, eval_batch_size=8)
  plain = finetuning.Trainer(train.make_model(len(labels)), enc, recipe, 10, train.ner_loss, "ner")
  packed = finetuning.Trainer(
      train.make_model(len(labels), 4), enc, recipe, 10, train.ner_loss, "ner", packing=4
  )
  params = plain.init_state(3, 0.0).params
  arrays = feats.arrays
  n = len(feats)
  lengths = batching.example_lengths(arrays["attention_mask"])
  rows = batching.pack_examples(lengths, 32, 4)
  batches = (
      batching.train_batch(arrays, np.arange(n), 32, n + 2),  # + two rows of weight 0
      batching.packed_batch(arrays, lengths, rows, 4, len(rows) + 1)[0],  # + an empty row
  )

  def loss_and_grads(trainer, batch):
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    loss = lambda p: train.ner_loss(trainer_lib._apply(trainer.model, p, batch), batch)
    return jax.jit(jax.value_and_grad(loss))(params)  # compiled: eager dispatch took minutes

  (want_loss, want), (got_loss, got) = (
      loss_and_grads(t, b) for t, b in zip((plain, packed), batches)
  )
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, atol=1e-5 * float(np.abs(w).max()) + 1e-9)


def _encoder_with_tokenizer():
  tok = _tokenizer()
  cfg = CFG.replace(vocab_size=tok.vocab_size, max_position_embeddings=64)
  return encoder_lib.Encoder(cfg, None, tokenizer=tok, source="random")


@pytest.mark.slow
def test_squad_packed_training_scores_as_unpacked(tmp_path):
  """Same windows, recipe and seed: dev F1 packed (3 windows a row at most) is within seed
  noise of unpacked, and both learn the task (far above the untrained model's F1)."""
  from bertjax.tasks.squad import data, features as squad_features, train

  _squad_file(tmp_path / "train.json", 128, 1, max_words=20)
  _squad_file(tmp_path / "dev.json", 64, 2, max_words=20)
  train_ex, _ = data.read(str(tmp_path / "train.json"), "1.1", training=True)
  dev_ex, _ = data.read(str(tmp_path / "dev.json"), "1.1", training=False)
  enc = _encoder_with_tokenizer()
  opts = train.Options(max_seq_len=64, doc_stride=16, max_query_length=12, eval_untrained=True)
  recipe = finetuning.Recipe(
      batch_size=16, eval_batch_size=32, learning_rate=3e-4, epochs=2, dropout=0.0
  )
  runs = {
      p: train.train_and_evaluate(
          enc, train_ex, dev_ex, recipe, opts, str(tmp_path / str(p)), progress=False, packing=p
      )
      for p in (0, 3)
  }
  f1 = {p: r.best["f1"] for p, r in runs.items()}
  untrained = {p: r.history[0]["f1"] for p, r in runs.items()}
  # learned: untrained F1 was 8-20 over seeds 0-2, trained 80-98 (this recipe)
  assert all(f1[p] > untrained[p] + 50 for p in runs), (f1, untrained)
  # Seed noise, measured with this recipe and data for seeds 0, 1, 2: unpacked F1 96.9, 80.1,
  # 95.3; packed 98.4, 88.1, 96.9. Pooled per-run std 7.6 F1, so the difference of two runs
  # has std 10.8; the bound is 2 of those, 21.7, rounded down to 20. (Seed 0 differs by 1.5.)
  assert abs(f1[3] - f1[0]) <= 20, f1
  feats = squad_features.build(enc.tokenizer, train_ex, 64, 16, 12, training=True)
  lengths = batching.example_lengths(feats.arrays["attention_mask"])
  assert len(batching.pack_examples(lengths, 64, 3)) < 0.7 * len(feats)  # rows really shared


def test_packed_squad_repeats_exactly_at_one_seed(tmp_path):
  """Two packed SQuAD runs at one seed, dropout on, each from a fresh encoder: the same train
  losses and the same dev F1, bit for bit (the packer and the steps are deterministic)."""
  from bertjax.tasks.squad import data, train

  _squad_file(tmp_path / "train.json", 64, 1, max_words=20)
  _squad_file(tmp_path / "dev.json", 32, 2, max_words=20)
  train_ex, _ = data.read(str(tmp_path / "train.json"), "1.1", training=True)
  dev_ex, _ = data.read(str(tmp_path / "dev.json"), "1.1", training=False)
  opts = train.Options(max_seq_len=64, doc_stride=16, max_query_length=12)
  recipe = finetuning.Recipe(
      batch_size=16, eval_batch_size=32, learning_rate=3e-4, epochs=1, dropout=0.1, seed=3
  )
  runs = [
      train.train_and_evaluate(
          _encoder_with_tokenizer(),
          train_ex,
          dev_ex,
          recipe,
          opts,
          str(tmp_path / str(i)),
          progress=False,
          packing=3,
      )
      for i in range(2)
  ]
  timeless = lambda run: [{k: v for k, v in h.items() if k != "seconds"} for h in run.history]
  assert timeless(runs[0]) == timeless(runs[1])  # train loss and dev metrics of every epoch
  assert runs[0].history[-1]["train_loss"] > 0 and runs[0].best["f1"] == runs[1].best["f1"]


@pytest.mark.slow
def test_ner_packed_training_scores_as_unpacked(tmp_path):
  """Same sentences, recipe and seed: dev entity F1 packed (4 sentences a row at most) is
  within seed noise of unpacked, and both learn the task (far above the untrained model)."""
  from bertjax.tasks.ner import conll, features as ner_features, train

  _tagged_file(tmp_path / "train.txt", 256, 1)
  _tagged_file(tmp_path / "dev.txt", 64, 2)
  splits = {k: conll.read(str(tmp_path / f"{k}.txt")) for k in ("train", "dev")}
  enc = _encoder_with_tokenizer()
  recipe = finetuning.Recipe(
      batch_size=16, eval_batch_size=32, learning_rate=2e-3, epochs=3, dropout=0.0
  )
  runs = {
      p: train.train_and_evaluate(
          enc, splits, recipe, 32, str(tmp_path / str(p)), True, progress=False, packing=p
      )
      for p in (0, 4)
  }
  f1 = {p: r.best["f1"] for p, r in runs.items()}
  untrained = {p: r.history[0]["f1"] for p, r in runs.items()}
  # learned: untrained F1 0.07, trained 0.91-0.94 over seeds 0-2 (this recipe)
  assert all(f1[p] > untrained[p] + 0.6 for p in runs), (f1, untrained)
  # Seed noise, measured with this recipe and data for seeds 0, 1, 2: unpacked F1 0.935,
  # 0.920, 0.935; packed 0.920, 0.913, 0.928. Pooled per-run std 0.0078, so the difference of
  # two runs has std 0.011; the bound is 2 of those, 0.022, rounded up to 0.025. (Seed 0: 0.0145.)
  assert abs(f1[4] - f1[0]) <= 0.025, f1
  feats = ner_features.build(enc.tokenizer, splits["train"], conll.label_list(splits["train"]), 32)
  lengths = batching.example_lengths(feats.arrays["attention_mask"])
  assert len(batching.pack_examples(lengths, 32, 4)) < 0.6 * len(feats)  # rows really shared
