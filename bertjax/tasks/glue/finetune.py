"""Fine-tune a restored encoder on one GLUE task with the BERT recipe.

    enc = encoder.load_encoder("runs/base")   # or a HF / Google BERT dir, or "random"
    run = finetune.train_and_evaluate(task, enc, feats, finetuning.Recipe(), "out/sst2")

The trainer, optimizer and loop are `bertjax.tasks.finetuning`'s; this module adds what is GLUE's:
the classifier on [CLS] (`model.BertForSequenceClassification`; `Recipe.pooling`), the
cross-entropy or squared-error loss, the task's metrics on every dev split, and the test
predictions. The batch (`Recipe.batch_size`, 32) is global, split over `Recipe.mesh`. A sweep's
runs share one Trainer and its compiled steps (`_trainer`).

`packing=E` (`bertjax glue --packing`) packs up to E examples into each row, each classified
from its own [CLS] (`finetuning.Trainer`'s packing): one compiled train and predict step.

After each epoch the dev splits are scored; the best epoch (by the task's main metric) is kept
on device for the test predictions and saved under `workdir/best/` (orbax) + `best.json`.

Shape letters: N examples, B batch, C classes (1 for regression).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import errors, model as model_lib
from bertjax.tasks import finetuning
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.glue import features, metrics, tasks


def glue_loss(logits_BxC: jax.Array, batch: dict, *, regression: bool) -> jax.Array:
  """Mean over the present examples: `logits_BxC` [B, C] and labels [B], or packed [B, E, C]
  and [B, E] (the weights 0 for empty slots)."""
  labels_B = batch["labels"]
  if regression:
    per_example_B = jnp.square(logits_BxC[..., 0] - labels_B.astype(jnp.float32))
  else:
    per_example_B = optax.softmax_cross_entropy_with_integer_labels(
        logits_BxC, labels_B.astype(jnp.int32)
    )
  return finetuning.masked_mean(per_example_B, batch["weights"])


def make_trainer(
    task: tasks.Task,
    enc: Encoder,
    recipe: finetuning.Recipe,
    total_steps: int,
    packing: int = 0,
) -> finetuning.Trainer:
  """The task's classifier (or regressor) on `enc`, with its loss; `packing` > 0 packs up to
  that many examples into a row."""
  make_model = functools.partial(
      model_lib.BertForSequenceClassification,
      num_labels=task.num_labels,
      pooling=recipe.pooling,
  )
  loss_fn = functools.partial(glue_loss, regression=task.is_regression)
  return finetuning.Trainer(make_model, enc, recipe, total_steps, loss_fn, "glue", packing=packing)


def arrays(feats: features.Features) -> dict[str, np.ndarray]:
  """The model inputs and float32 labels (zeros for test splits) of `feats`."""
  labels_N = feats.labels_N if feats.labels_N is not None else np.zeros(len(feats), np.float32)
  return dict(
      input_ids=feats.input_ids_NxL,
      token_type_ids=feats.token_type_ids_NxL,
      attention_mask=feats.attention_mask_NxL,
      labels=labels_N.astype(np.float32),
  )


def predictions(task: tasks.Task, logits_NxC: np.ndarray) -> np.ndarray:
  """Class ids (argmax), or the regression score."""
  return logits_NxC[:, 0] if task.is_regression else np.argmax(logits_NxC, axis=-1)


# ------------------------------------------------------------------------------------ the loop


@dataclasses.dataclass
class RunResult:
  dev: dict[str, float]  # the best epoch's dev metrics
  best_epoch: int
  history: list[dict]  # per epoch: epoch, train_loss, dev metrics, seconds
  test: dict[str, np.ndarray]  # test split name -> predictions of the best epoch
  workdir: str
  compiled_shapes: tuple[int, int]  # (train, predict) steps compiled so far by its Trainer


def train_and_evaluate(
    task: tasks.Task,
    enc: Encoder,
    data: dict[str, features.Features],
    recipe: finetuning.Recipe,
    workdir: str,
    progress: bool = True,
    save_checkpoint: bool = True,
    packing: int = 0,
) -> RunResult:
  """Fine-tune for `recipe.epochs`, score the dev splits after each, predict the test splits
  with the best epoch. `data` holds "train", the task's dev splits and any test splits.
  `packing` > 0 trains and predicts on rows of up to that many examples (one compiled shape
  each, no length buckets); 0 one example per row."""
  if packing < 0:
    raise errors.ConfigError(f"packing={packing} must be >= 0 (0: one example per row)")
  for split in ("train",) + tuple(s.name for s in task.dev):
    if len(data[split]) == 0:
      raise errors.BadInputError(
          f"{task.name}: the {split} split has no usable rows; check its data (unreadable "
          "rows are reported before training)"
      )
  steps = finetuning.total_steps(arrays(data["train"]), recipe, packing)
  trainer = _trainer(task, enc, recipe, steps, packing)
  score_dev = lambda params: evaluate(trainer, task, params, data, recipe.eval_batch_size)
  run = finetuning.fit(
      trainer,
      arrays(data["train"]),
      recipe,
      score_dev,
      task.main_metric,
      workdir,
      progress=progress,
      run_name=task.name,
      predicts=tuple(arrays(data[split.name]) for split in task.dev),
  )
  if save_checkpoint:
    finetuning.save_params(
        workdir,
        run.best_params,
        dict(
            task=task.name,
            labels=list(task.labels) if task.labels else None,
            num_labels=task.num_labels,
            init=enc.source,
            recipe=dataclasses.asdict(recipe),
            packing=packing,
            dev=dict(run.best, epoch=run.best_epoch),
            config=trainer.cfg.to_dict(),
            tokenizer=str(enc.tokenizer.path),
        ),
    )
  test = {}
  for split in task.test:
    if split.name in data:
      logits_NxC = trainer.predict(
          run.best_params, arrays(data[split.name]), recipe.eval_batch_size
      )
      test[split.name] = predictions(task, logits_NxC)
  return RunResult(
      dev=run.best,
      best_epoch=run.best_epoch,
      history=run.history,
      test=test,
      workdir=workdir,
      compiled_shapes=trainer.compiled_shapes(),
  )


@dataclasses.dataclass
class _Kept:
  """The Trainer kept for the next run, and what it was built for."""

  enc: Encoder  # held: while kept, no other encoder can be this object (or reuse its id)
  key: tuple  # the task, the steps and every recipe field but the learning rate and seed
  trainer: finetuning.Trainer


_KEPT: list[_Kept] = []  # at most one: a finished task's compiled steps are not kept


def clear_trainer_cache() -> None:
  """Forget the kept Trainer (and its compiled steps)."""
  _KEPT.clear()


def _trainer(
    task: tasks.Task,
    enc: Encoder,
    recipe: finetuning.Recipe,
    total_steps: int,
    packing: int = 0,
) -> finetuning.Trainer:
  """The Trainer of the last run if only the learning rate and seed changed (a sweep): its
  steps are compiled already. The encoder is matched by identity (the Trainer holds its
  parameters), and held with the Trainer so that no later encoder can take its place."""
  key = (
      task.name,
      task.num_labels,
      task.is_regression,
      total_steps,
      packing,
      tuple(
          (f.name, getattr(recipe, f.name))
          for f in dataclasses.fields(recipe)
          if f.name not in ("learning_rate", "seed")  # values in the state, not the Trainer's
      ),
  )
  if not (_KEPT and _KEPT[0].enc is enc and _KEPT[0].key == key):
    _KEPT.clear()  # before building: the old Trainer need not live beside the new one
    _KEPT.append(_Kept(enc, key, make_trainer(task, enc, recipe, total_steps, packing)))
  return _KEPT[0].trainer


def evaluate(
    trainer: finetuning.Trainer,
    task: tasks.Task,
    params,
    data: dict[str, features.Features],
    batch_size: int,
) -> dict[str, float]:
  out = {}
  for split in task.dev:
    feats = data[split.name]
    pred = predictions(task, trainer.predict(params, arrays(feats), batch_size))
    out.update(metrics.compute(task, split, pred, feats.labels_N))
  return out
