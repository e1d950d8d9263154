"""Fine-tuning: a restored encoder and a task head, trained and scored by one runner.

    outcome = finetuning.run(task, enc, recipe, "out/squad", packing=3)

A task is an adapter (`TaskAdapter`: features, head, loss, predictions, metric, submission;
docs/tasks.md, "Adding a task"); GLUE (`glue/finetune.py`), SQuAD (`squad/train.py`) and NER
(`ner/train.py`) are three. The modules, from the bottom up:

    trainer.py  `Trainer`: a head on the encoder, its state, shardings, jitted steps, prediction
    loop.py     `fit`: the epochs, the dev metric after each, the best epoch kept
    adapter.py  `TaskAdapter`, the interface a task implements, and what it is given
    runner.py   `run`: one adapter from encoder to results files and checkpoint; `TrainerCache`

The length policy of every fine-tuning batch (what a compile is worth in padded tokens) is
here, above the modules that read it.
"""

from __future__ import annotations

# A length used by fewer rows than this many batches is merged into the next longer one: a
# compile costs more than padding them.
MIN_BATCHES_PER_LENGTH = 4
# What one more compiled step costs, in steps at length 32: on 2 CPU cores a BERT-mini train
# step takes ~2 s to trace and lower and ~8.5 s to compile, but two compiles side by side take
# 13 s, so ~8.5 s per length in all: as long as ~24 steps at length 32 (0.35 s each). A length
# is kept only if the padding it saves over the run (all epochs) is worth more tokens than that
# (`padded_lengths`' compile_tokens).
COMPILE_COST_STEPS = 24
COMPILE_COST_LENGTH = 32


def compile_tokens(batch_size: int, epochs: int = 1) -> float:
  """`padded_lengths`' compile_tokens for rows padded once per epoch: one compile as padded
  tokens of a single pass."""
  return COMPILE_COST_STEPS * batch_size * COMPILE_COST_LENGTH / max(1, epochs)


# The package's interface, imported after the policy above, which trainer.py and loop.py read.
from bertjax.tasks.finetuning.adapter import Finished, Splits, TaskAdapter  # noqa: E402
from bertjax.tasks.finetuning.loop import FitResult, fit, save_params, total_steps  # noqa: E402
from bertjax.tasks.finetuning.runner import Outcome, TrainerCache, run  # noqa: E402
from bertjax.tasks.finetuning.trainer import Trainer, masked_mean  # noqa: E402
from bertjax.tasks.recipe import Recipe  # noqa: E402

__all__ = [
    "Finished",
    "FitResult",
    "Outcome",
    "Recipe",
    "Splits",
    "TaskAdapter",
    "Trainer",
    "TrainerCache",
    "compile_tokens",
    "fit",
    "masked_mean",
    "run",
    "save_params",
    "total_steps",
]
