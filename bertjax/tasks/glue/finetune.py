"""Fine-tune a restored encoder on one GLUE task with the BERT recipe.

    enc = encoder.load_encoder("runs/base")   # or a HF / Google BERT dir, or "random"
    run = finetune.train_and_evaluate(task, enc, feats, recipe.Recipe(), "out/sst2")

GLUE's adapter (`GlueTask`) for the fine-tuning runner (`bertjax.tasks.finetuning.run`): the
classifier on [CLS] (`model.BertForSequenceClassification`; `Recipe.pooling`), the
cross-entropy or squared-error loss, the task's metrics on every dev split, and the test
predictions (written as leaderboard files by `sweep`). The batch (`Recipe.batch_size`, 32) is
global, split over `Recipe.mesh`. A sweep's runs share one Trainer and its compiled steps: the
sweep passes one `finetuning.TrainerCache` to each of a task's runs.

`packing=E` (`bertjax glue --packing`) packs up to E examples into each row, each classified
from its own [CLS] (`finetuning.Trainer`'s packing): one compiled train and predict step.

After each epoch the dev splits are scored; the best epoch (by the task's main metric) is kept
on device for the test predictions and saved under `workdir/best/` (orbax) + `best.json`.

Shape letters: N examples, B batch, C classes (1 for regression).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import errors, model as model_lib
from bertjax.tasks import finetuning
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.finetuning import Finished, Splits, Trainer, masked_mean
from bertjax.tasks.recipe import Recipe
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
  return masked_mean(per_example_B, batch["weights"])


def make_trainer(
    task: tasks.Task, enc: Encoder, recipe: Recipe, total_steps: int, packing: int = 0
) -> Trainer:
  """The task's classifier (or regressor) on `enc`, with its loss; `packing` > 0 packs up to
  that many examples into a row."""
  glue = GlueTask(task, {}, recipe.pooling)
  return Trainer(glue.head, enc, recipe, total_steps, glue.loss, glue.name, packing=packing)


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


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """One GLUE (or custom TSV) task as a `finetuning` adapter: `data` holds "train", the
  task's dev splits and any of its test splits."""

  task: tasks.Task
  data: dict[str, features.Features]
  pooling: str = "cls"  # Recipe.pooling
  name = "glue"

  @property
  def run_name(self) -> str:
    return self.task.name

  @property
  def main_metric(self) -> str:
    return self.task.main_metric

  def features(self) -> Splits:
    for split in ("train",) + tuple(s.name for s in self.task.dev):
      if len(self.data[split]) == 0:
        raise errors.BadInputError(
            f"{self.task.name}: the {split} split has no usable rows; check its data "
            "(unreadable rows are reported before training)"
        )
    return Splits(
        train=arrays(self.data["train"]),
        scored={s.name: arrays(self.data[s.name]) for s in self.task.dev},
        final={s.name: arrays(self.data[s.name]) for s in self.task.test if s.name in self.data},
    )

  def head(self, cfg: model_lib.BertConfig) -> model_lib.BertForSequenceClassification:
    return model_lib.BertForSequenceClassification(
        cfg, num_labels=self.task.num_labels, pooling=self.pooling
    )

  def loss(self, logits_BxC: jax.Array, batch: dict) -> jax.Array:
    return glue_loss(logits_BxC, batch, regression=self.task.is_regression)

  def predictions(self, split: str, logits_NxC: np.ndarray) -> np.ndarray:
    del split  # every split is classified alike
    return predictions(self.task, logits_NxC)

  def metric(self, predicted: dict[str, np.ndarray]) -> dict[str, float]:
    out = {}
    for split in self.task.dev:
      out.update(
          metrics.compute(self.task, split, predicted[split.name], self.data[split.name].labels_N)
      )
    return out

  def submission(self, predicted: dict[str, np.ndarray], run: Finished) -> dict:
    """Nothing written here: a sweep writes the best run's test predictions."""
    del predicted
    task = self.task
    return dict(
        task=task.name,
        labels=list(task.labels) if task.labels else None,
        num_labels=task.num_labels,
        init=run.encoder.source,
        recipe=dataclasses.asdict(run.recipe),
        packing=run.packing,
        dev=dict(run.fit.best, epoch=run.fit.best_epoch),
        config=run.config.to_dict(),
        tokenizer=str(getattr(run.encoder.tokenizer, "path", "")),
    )


# ------------------------------------------------------------------------------------ the run


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
    recipe: Recipe,
    workdir: str,
    progress: bool = True,
    save_checkpoint: bool = True,
    packing: int = 0,
    trainers: finetuning.TrainerCache | None = None,
) -> RunResult:
  """Fine-tune for `recipe.epochs`, score the dev splits after each, predict the test splits
  with the best epoch. `data` holds "train", the task's dev splits and any test splits.
  `packing` > 0 trains and predicts on rows of up to that many examples (one compiled shape
  each, no length buckets); 0 one example per row. `trainers` (a sweep's, one per task) keeps
  the Trainer for the next run of the task."""
  out = finetuning.run(
      GlueTask(task, data, recipe.pooling),
      enc,
      recipe,
      workdir,
      packing=packing,
      progress=progress,
      save_checkpoint=save_checkpoint,
      trainers=trainers,
  )
  return RunResult(
      dev=out.fit.best,
      best_epoch=out.fit.best_epoch,
      history=out.fit.history,
      test=out.predicted,
      workdir=workdir,
      compiled_shapes=out.compiled_shapes,
  )
