"""BERT's objective (Devlin et al. 2018): masked language modelling, with next-sentence (NSP)
or sentence-order (SOP) prediction on [CLS] when `config.data.pair_mode` asks for a pair task.
An `objective.Objective`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from bertjax import model as model_lib
from bertjax.model.config import BertConfig
from bertjax.training import flops, losses, streams

Array = jax.Array
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "masked_positions")
# A packed batch's extra model inputs (bertjax.data.packing), passed as keywords when present.
PACKED_INPUTS = ("segment_ids", "position_ids", "cls_positions")


def apply(model, params, batch: dict, rngs: dict, deterministic: bool, targets=(), **extra):
  """`model` on a batch's inputs (and `targets`, packed inputs, `extra` keywords)."""
  return model.apply(
      {"params": params},
      *(batch[k] for k in MODEL_INPUTS + targets),
      **{k: batch[k] for k in PACKED_INPUTS if k in batch},
      **extra,
      deterministic=deterministic,
      rngs=rngs,
  )


def mlm_nll(out, masked_ids: Array) -> tuple[Array, Array]:
  """([B, P] nll, [B, P] correct) of an MLM output, the tied decoder fused with the loss."""
  return losses.mlm_cross_entropy(out.mlm_hidden, out.mlm_table, out.mlm_bias, masked_ids)


def grad_of_sums(obj, params, batch: dict, dropout_key, counts, draw=None):
  """(sums, gradients) of `obj.loss(obj.sums(...))` by one `jax.value_and_grad`: the train
  step of every objective without its own (`objective.Objective.grad`)."""

  def loss_fn(p):
    sums, _ = obj.sums(p, batch, dropout_key, False, draw)
    return obj.loss(sums, counts), sums

  (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return sums, grads


class ExampleStream:
  """The MLM/NSP example stream, its held-out metrics and checks: what MLM and ELECTRA read."""

  keeps_source_heads = True  # continued MLM trains the encoder its heads were trained with

  def stream(self, config, phase, state, split="train"):
    return streams.mlm_stream(config, phase, state, split)

  def evaluate(self, config, setup, params, phase, meta):
    return streams.mlm_evaluate(config, setup, params, phase, meta)

  def has_eval_data(self, config, meta, writer):
    return streams.mlm_has_eval_data(config, meta, writer)


@dataclasses.dataclass
class MLM(ExampleStream):
  bert_config: BertConfig
  pair_mode: str  # "nsp", "sop" or "none"
  name: str = "mlm"
  sum_names: tuple[str, ...] = (
      "mlm_loss",
      "mlm_correct",
      "mlm_count",
      "nsp_loss",
      "nsp_correct",
      "nsp_count",
  )

  def __post_init__(self):
    self.model = model_lib.BertForPreTraining(self.bert_config)

  def prepare(self, batch: dict, step_key: Array) -> tuple[dict, Any]:
    return batch, None

  def counts(self, batch: dict) -> dict[str, Array]:
    mlm = jax.numpy.sum(batch["masked_weights"].astype(jax.numpy.float32))
    return {"mlm": mlm, "nsp": losses.nsp_count(batch, self.pair_mode)}

  def sums(self, params, batch, dropout_key, deterministic, draw=None):
    out = apply(self.model, params, batch, {"dropout": dropout_key}, deterministic)
    nll_BxP, correct_BxP = mlm_nll(out, batch["masked_ids"])
    sums = losses.pretraining_sums(nll_BxP, correct_BxP, out.nsp_logits, batch, self.pair_mode)
    return sums, correct_BxP

  def loss(self, sums, counts):
    return losses.total_loss(sums, counts["mlm"], counts["nsp"])

  def grad(self, params, batch, dropout_key, counts, draw=None):
    return grad_of_sums(self, params, batch, dropout_key, counts, draw)

  def finalize(self, sums):
    return losses.finalize(sums)

  def flops_per_step(self, batch_size, seq_len, max_predictions):
    return flops.pretraining_flops_per_step(self.bert_config, batch_size, seq_len, max_predictions)

  def record(self) -> dict:
    return {"objective": self.name, "generator_config": None}

  def trained_heads(self) -> tuple[str, ...]:
    """The MLM head, and with a pair task its head and the pooler it reads."""
    return ("mlm",) + (("nsp", "pooler") if self.pair_mode != "none" else ())

  def note(self) -> str:
    return ""
