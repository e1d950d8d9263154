"""ELECTRA's objective (Clark et al. 2020): the generator's MLM plus `disc_weight` x the
discriminator's replaced-token detection over every real token (`bertjax.model.electra`).
An `objective.Objective`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bertjax import errors
from bertjax.model import electra as electra_lib
from bertjax.model.config import BertConfig
from bertjax.training import flops, losses
from bertjax.training.objective_mlm import ExampleStream, apply, grad_of_sums, mlm_nll

Array = jax.Array


def generator_config(config, bert_config: BertConfig) -> BertConfig:
  """The generator's `BertConfig`: `config.electra.generator_hidden_fraction` of the width."""
  fraction = config.electra.generator_hidden_fraction
  try:
    return electra_lib.generator_config(bert_config, fraction)
  except ValueError as e:  # no width left, or a generator BertConfig refuses
    raise errors.ConfigError(
        f"config.electra.generator_hidden_fraction={fraction}: the generator of "
        f"hidden_size={bert_config.hidden_size} would be invalid "
        f"({str(e).removeprefix('BertConfig: ')}) — choose a fraction that leaves whole heads "
        "(ELECTRA: 0.25 or 1/3)"
    ) from e


@dataclasses.dataclass
class Electra(ExampleStream):
  bert_config: BertConfig  # the discriminator's
  generator_config: BertConfig
  disc_weight: float  # λ: the discriminator's loss weight (the paper's 50)
  name: str = "electra"
  sum_names: tuple[str, ...] = losses.ELECTRA_SUMS

  @classmethod
  def from_config(cls, config, bert_config: BertConfig) -> "Electra":
    gen = generator_config(config, bert_config)
    return cls(bert_config, gen, float(config.electra.disc_weight))

  def __post_init__(self):
    self.model = electra_lib.ElectraForPreTraining(self.bert_config, self.generator_config)

  def prepare(self, batch: dict, step_key: Array) -> tuple[dict, Any]:
    """Each row's index keys its draw: one draw per row of the step, whatever microbatch the
    row trains in."""
    rows = jnp.arange(batch["input_ids"].shape[0], dtype=jnp.int32)
    return dict(batch, row_ids=rows), jax.random.fold_in(step_key, 1 << 30)

  def counts(self, batch: dict) -> dict[str, Array]:
    mlm = jnp.sum(batch["masked_weights"].astype(jnp.float32))
    return {"mlm": mlm, "disc": jnp.sum(losses.real_tokens(batch))}

  def sums(self, params, batch, dropout_key, deterministic, draw=None):
    rows = batch.get("row_ids", jnp.arange(batch["input_ids"].shape[0], dtype=jnp.int32))
    rngs = {
        "dropout": dropout_key,
        "sample": jax.random.fold_in(dropout_key, 1) if draw is None else draw,
    }
    targets = ("masked_ids", "masked_weights")
    out = apply(self.model, params, batch, rngs, deterministic, targets, row_ids=rows)
    nll_BxP, correct_BxP = mlm_nll(out.generator, batch["masked_ids"])
    sums = losses.electra_sums(nll_BxP, correct_BxP, out.disc_logits, out.is_replaced, batch)
    return sums, correct_BxP

  def loss(self, sums, counts):
    return losses.electra_loss(sums, counts["mlm"], counts["disc"], self.disc_weight)

  def grad(self, params, batch, dropout_key, counts, draw=None):
    return grad_of_sums(self, params, batch, dropout_key, counts, draw)

  def finalize(self, sums):
    return losses.electra_finalize(sums, self.disc_weight)

  def flops_per_step(self, batch_size, seq_len, max_predictions):
    return flops.electra_flops_per_step(
        self.bert_config, self.generator_config, batch_size, seq_len, max_predictions
    )

  def record(self) -> dict:
    return {"objective": self.name, "generator_config": self.generator_config.to_dict()}

  def trained_heads(self) -> tuple[str, ...]:
    return ()  # the discriminator's head is ELECTRA's own; no BERT head trains

  def note(self) -> str:
    return (
        f" (ELECTRA: discriminator {self.bert_config.hidden_size} wide, generator "
        f"{self.generator_config.hidden_size} wide, embeddings {self.bert_config.embedding_width})"
    )
