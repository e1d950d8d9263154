"""The fine-tuning runner: one task adapter (`adapter.TaskAdapter`) from encoder to results.

    outcome = finetuning.run(squad_task, enc, recipe, "out/squad", packing=3)

`run` takes every task through the same steps: the adapter's arrays, the run's total steps,
a `trainer.Trainer` of the adapter's head and loss, `loop.fit` (scoring the adapter's metric
after each epoch, the best epoch kept), the best epoch's predictions of the final splits, the
adapter's output files and the checkpoint (workdir/best/ and best.json). GLUE, SQuAD and NER
are adapters (`glue/finetune.py`, `squad/train.py`, `ner/train.py`); a new task is one more.

A sweep's runs differ only in learning rate and seed, values in the state rather than the
compiled steps: a `TrainerCache` the caller makes (one per task) and passes to each run keeps
the Trainer, so the steps compile once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from bertjax import errors
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.finetuning import loop
from bertjax.tasks.finetuning.adapter import Finished, Splits, TaskAdapter
from bertjax.tasks.finetuning.trainer import Trainer
from bertjax.tasks.recipe import Recipe


@dataclasses.dataclass
class Outcome:
  fit: loop.FitResult  # the best epoch's dev metrics and parameters, every epoch's history
  predicted: dict[str, Any]  # final split -> the best epoch's `TaskAdapter.predictions`
  compiled_shapes: tuple[int, int]  # (train, predict) steps compiled so far by its Trainer


class TrainerCache:
  """The Trainer of a task's last run, for its next: kept when only the learning rate and the
  seed change (a sweep), so its compiled steps serve every run. The caller makes one per task
  and drops it when the task is done (its compiled steps with it). The encoder is matched by
  identity (the Trainer holds its parameters) and held with the Trainer, so that no later
  encoder can take its place."""

  def __init__(self):
    self._kept: tuple[Encoder, tuple, Trainer] | None = None

  def get(
      self,
      task: TaskAdapter,
      enc: Encoder,
      recipe: Recipe,
      total_steps: int,
      packing: int,
      build: Callable[[], Trainer],
  ) -> Trainer:
    """The kept Trainer if it was built for the same task, encoder, steps, packing and recipe
    (but for the learning rate and seed); else `build()`'s, kept in its place."""
    key = (
        type(task),
        task.name,
        task.run_name,
        total_steps,
        packing,
        tuple(
            (f.name, getattr(recipe, f.name))
            for f in dataclasses.fields(recipe)
            if f.name not in ("learning_rate", "seed")  # values in the state, not the Trainer's
        ),
    )
    if not (self._kept and self._kept[0] is enc and self._kept[1] == key):
      self._kept = None  # before building: the old Trainer need not live beside the new one
      self._kept = (enc, key, build())
    return self._kept[2]

  def clear(self) -> None:
    """Forget the kept Trainer (and its compiled steps)."""
    self._kept = None


def run(
    task: TaskAdapter,
    enc: Encoder,
    recipe: Recipe,
    workdir: str,
    *,
    packing: int = 0,
    eval_untrained: bool = False,
    progress: bool = True,
    save_checkpoint: bool = True,
    trainers: TrainerCache | None = None,
) -> Outcome:
  """Fine-tune `enc` on `task` for `recipe.epochs`, scoring its dev splits after each (and
  before the first with `eval_untrained`); predict its final splits with the best epoch, write
  its files (`TaskAdapter.submission`) and, with `save_checkpoint`, the best epoch's parameters
  (workdir/best/, best.json). `packing` > 0 trains and predicts on rows of up to that many
  examples (one compiled shape each, no length buckets); 0 one example a row. `trainers` keeps
  the Trainer for the task's next run."""
  if packing < 0:
    raise errors.ConfigError(f"packing={packing} must be >= 0 (0: one example per row)")
  splits: Splits = task.features()
  steps = loop.total_steps(splits.train, recipe, packing)

  def build() -> Trainer:
    return Trainer(task.head, enc, recipe, steps, task.loss, task.name, packing=packing)

  trainer = build() if trainers is None else trainers.get(task, enc, recipe, steps, packing, build)

  def predict(params, arrays: dict) -> dict[str, Any]:
    return {
        split: task.predictions(split, trainer.predict(params, a, recipe.eval_batch_size))
        for split, a in arrays.items()
    }

  result = loop.fit(
      trainer,
      splits.train,
      recipe,
      lambda params: task.metric(predict(params, splits.scored)),
      task.main_metric,
      workdir,
      eval_untrained,
      progress,
      run_name=task.run_name,
      predicts=tuple(splits.scored.values()),
  )
  predicted = predict(result.best_params, splits.final)
  meta = task.submission(predicted, Finished(result, workdir, enc, recipe, packing, trainer.cfg))
  if save_checkpoint:
    loop.save_params(workdir, result.best_params, meta)
  return Outcome(result, predicted, trainer.compiled_shapes())
