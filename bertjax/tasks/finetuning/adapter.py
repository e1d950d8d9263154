"""What a fine-tuning task gives the runner (`finetuning.run`): one small interface.

    class Sentiment:                              # a `TaskAdapter`: no base class needed
      name, run_name, main_metric = "sentiment", "", "accuracy"
      def features(self) -> Splits: ...           # the arrays to train on, score, predict
      def head(self, cfg) -> nn.Module: ...       # encoder "bert" + the task's layer
      def loss(self, outputs, batch) -> jax.Array: ...
      def predictions(self, split, outputs): ...  # model outputs of a split -> its answers
      def metric(self, predicted) -> dict[str, float]: ...
      def submission(self, predicted, run: Finished) -> dict: ...

The runner owns everything in between (the total steps, the Trainer, the epochs, the best
epoch, predicting, the checkpoint); GLUE (`glue/finetune.py`), SQuAD (`squad/train.py`) and
NER (`ner/train.py`) are adapters. Arrays are dicts of numpy arrays, one row per example:
"input_ids", "token_type_ids" and "attention_mask" [N, L] and the task's targets, which the
loss reads from its batches ([N] or [N, L]; packed rows carry them per example or per token,
`batching.packed_batch`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import flax.linen as nn
import jax
import numpy as np

from bertjax import model as model_lib
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.finetuning.loop import FitResult
from bertjax.tasks.recipe import Recipe

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Splits:
  """A task's model inputs and targets, by split."""

  train: Arrays  # the rows trained on
  scored: dict[str, Arrays]  # predicted after every epoch, for `TaskAdapter.metric`
  final: dict[str, Arrays]  # predicted with the best epoch, for `TaskAdapter.submission`


@dataclasses.dataclass(frozen=True)
class Finished:
  """A finished run, as `TaskAdapter.submission` sees it."""

  fit: FitResult  # the best epoch's metrics and parameters, every epoch's history
  workdir: str  # where the task's output files go
  encoder: Encoder  # what was fine-tuned (its source and tokenizer go into best.json)
  recipe: Recipe
  packing: int  # examples a row at most; 0 one a row
  config: model_lib.BertConfig  # the model as fine-tuned (the recipe's dropout, unscanned)


@runtime_checkable
class TaskAdapter(Protocol):
  """One fine-tuning task: its arrays, head, loss, decoding, metric and output files."""

  name: str  # the family, "glue", "squad", "ner": opens progress bars and log lines
  run_name: str  # shown beside it ("" none): a GLUE task's name
  main_metric: str  # the key of `metric`'s result the best epoch is chosen by

  def features(self) -> Splits:
    """The arrays of every split; a split that cannot be trained or scored is an error
    (`errors.UserError`) here, before anything is built."""
    ...

  def head(self, cfg: model_lib.BertConfig) -> nn.Module:
    """The model: `model.BertModel` as the submodule "bert" and the task's layer on it, taking
    (input_ids, token_type_ids, attention_mask) and, on packed rows, `segment_ids` and
    `cls_positions` (`model.heads`)."""
    ...

  def loss(self, outputs: Any, batch: dict) -> jax.Array:
    """The mean loss of a batch (its "weights": 1 a real example, 0 padding)."""
    ...

  def predictions(self, split: str, outputs: Any) -> Any:
    """The task's answers for the rows of `split` from the model's outputs on them (numpy,
    in the rows' order): class ids, answer spans, word tags."""
    ...

  def metric(self, predicted: dict[str, Any]) -> dict[str, float]:
    """The dev metrics of `predicted` (split -> `predictions`, every `Splits.scored` split)."""
    ...

  def submission(self, predicted: dict[str, Any], run: Finished) -> dict:
    """Write the task's output files from the best epoch's `predicted` (every `Splits.final`
    split; process 0 writes) and return what best.json records beside the checkpoint."""
    ...
