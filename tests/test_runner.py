"""The fine-tuning runner: a task written as one adapter runs end to end; a sweep's Trainer is
kept by the cache its caller owns, and by nothing else."""

import dataclasses
import json
import weakref

import numpy as np
import optax
import pytest

from bertjax import errors, model as model_lib
from bertjax.tasks import encoder as encoder_lib, finetuning
from bertjax.tasks.finetuning import masked_mean
from bertjax.tasks.recipe import Recipe

CFG = model_lib.BertConfig(
    vocab_size=64,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)


def _encoder(source="random"):
  return encoder_lib.Encoder(CFG, None, tokenizer=None, source=source)


def _arrays(n, seed):
  """Rows whose label says whether token 5 is in them."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(6, CFG.vocab_size, (n, 8)).astype(np.int32)
  labels = rng.integers(0, 2, n).astype(np.int32)
  ids[labels == 1, 3] = 5
  ids[:, 0] = 2
  zeros = np.zeros_like(ids)
  return dict(input_ids=ids, token_type_ids=zeros, attention_mask=np.ones_like(ids), labels=labels)


@dataclasses.dataclass
class HasFive:
  """A new task written only as an adapter: binary classification of whole rows."""

  data: dict
  name = "hasfive"
  run_name = ""
  main_metric = "accuracy"
  seen: list = dataclasses.field(default_factory=list)  # what `submission` was given

  def features(self):
    if not len(self.data["train"]["input_ids"]):
      raise errors.BadInputError("hasfive: no training rows")
    return finetuning.Splits(
        train=self.data["train"],
        scored={"dev": self.data["dev"]},
        final={"dev": self.data["dev"], "test": self.data["test"]},
    )

  def head(self, cfg):
    return model_lib.BertForSequenceClassification(cfg, num_labels=2)

  def loss(self, logits_BxC, batch):
    ce_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, batch["labels"])
    return masked_mean(ce_B, batch["weights"])

  def predictions(self, split, logits_NxC):
    return np.argmax(logits_NxC, -1)

  def metric(self, predicted):
    return {"accuracy": float(np.mean(predicted["dev"] == self.data["dev"]["labels"]))}

  def submission(self, predicted, run):
    self.seen.append((predicted, run))
    with open(f"{run.workdir}/test.txt", "w") as f:
      f.write("".join(f"{int(p)}\n" for p in predicted["test"]))
    return dict(task=self.name, dev=run.fit.best, packing=run.packing)


def _has_five():
  return HasFive({"train": _arrays(32, 0), "dev": _arrays(16, 1), "test": _arrays(8, 2)})


def test_a_new_task_is_one_adapter(tmp_path):
  task = _has_five()
  assert isinstance(task, finetuning.TaskAdapter)
  recipe = Recipe(batch_size=8, eval_batch_size=8, epochs=2, learning_rate=1e-3)
  out = finetuning.run(task, _encoder(), recipe, str(tmp_path), eval_untrained=True)
  assert [h["epoch"] for h in out.fit.history] == [0, 1, 2]
  best_entry = out.fit.history[out.fit.best_epoch]
  assert out.fit.best == {"accuracy": best_entry["accuracy"]}
  assert best_entry["accuracy"] == max(h["accuracy"] for h in out.fit.history[1:])
  # the metric is computed from the dev predictions the runner hands the adapter
  ((predicted, run),) = task.seen
  assert set(predicted) == {"dev", "test"} and predicted["test"].shape == (8,)
  assert run.fit is out.fit and run.packing == 0 and run.config.scan_layers is False
  assert out.predicted is predicted
  lines = (tmp_path / "test.txt").read_text().splitlines()
  assert [int(l) for l in lines] == list(predicted["test"])
  best = json.loads((tmp_path / "best.json").read_text())
  assert best == {"task": "hasfive", "dev": out.fit.best, "packing": 0}
  assert (tmp_path / "best").is_dir()
  logged = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [e["epoch"] for e in logged] == [0, 1, 2]


def test_the_runner_refuses_a_negative_packing_before_reading_anything(tmp_path):
  task = _has_five()
  task.data["train"] = _arrays(0, 0)
  with pytest.raises(errors.ConfigError, match=r"^packing=-1 must be >= 0"):
    finetuning.run(task, _encoder(), Recipe(batch_size=8), str(tmp_path), packing=-1)
  with pytest.raises(errors.BadInputError, match="no training rows"):  # then the adapter's
    finetuning.run(task, _encoder(), Recipe(batch_size=8), str(tmp_path))


def test_every_task_is_an_adapter():
  from bertjax.tasks.glue import finetune, tasks
  from bertjax.tasks.ner import train as ner_train
  from bertjax.tasks.squad import train as squad_train

  for task in (
      finetune.GlueTask(tasks.TASKS["sst2"], {}),
      squad_train.SquadTask(None, [], [], squad_train.Options(), 512),
      ner_train.NerTask(None, {}, 128),
  ):
    assert isinstance(task, finetuning.TaskAdapter), type(task)


def test_the_cache_keeps_a_sweeps_trainer_and_holds_its_encoder():
  """A sweep's runs (only the learning rate and seed differ) share one Trainer. It is matched
  to its encoder by identity and holds it: a dropped encoder's id cannot pass to a new one
  while the Trainer is kept, so a new encoder always gets its own Trainer. Nothing is kept
  without a cache."""
  from bertjax.tasks.glue import finetune, tasks

  glue = finetune.GlueTask(tasks.TASKS["sst2"], {})
  recipe = Recipe(batch_size=8, eval_batch_size=8)
  cache = finetuning.TrainerCache()

  def get(enc, r):  # a new object stands for each built Trainer: the cache's rules are tested
    return cache.get(glue, enc, r, 10, 0, object)

  first_enc = _encoder("first")
  first = get(first_enc, recipe)
  assert get(first_enc, dataclasses.replace(recipe, learning_rate=1e-3, seed=1)) is first
  assert get(first_enc, dataclasses.replace(recipe, dropout=0.0)) is not first
  first = get(first_enc, recipe)
  other = object()
  assert cache.get(glue, first_enc, recipe, 11, 0, lambda: other) is other  # other steps
  first = get(first_enc, recipe)
  held = weakref.ref(first_enc)
  del first_enc
  assert held() is not None  # kept with its Trainer: its id stays taken
  assert get(_encoder("first"), recipe) is not first
  assert held() is None  # the new Trainer replaced it: freed at once, nothing older is kept
  cache.clear()
  assert cache._kept is None
