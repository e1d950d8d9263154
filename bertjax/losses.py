"""Pretraining losses and metrics: MLM over real masked positions, NSP/SOP on [CLS].

Shape letters: B batch, P masked positions per sequence, V vocabulary.

Everything is returned as *sums* with their counts, so that gradient accumulation over
microbatches and data-parallel reduction give exactly the loss of the whole global batch
(a mean of per-microbatch means would weight microbatches with few masks too heavily).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def cross_entropy(logits_BxPxV: Array, labels_BxP: Array) -> tuple[Array, Array]:
  """Per-position negative log-likelihood and whether the argmax is right (float32)."""
  logp_BxPxV = jax.nn.log_softmax(logits_BxPxV.astype(jnp.float32), axis=-1)
  nll_BxP = -jnp.take_along_axis(logp_BxPxV, labels_BxP[..., None].astype(jnp.int32),
                                 axis=-1)[..., 0]
  correct_BxP = (jnp.argmax(logits_BxPxV, axis=-1) == labels_BxP).astype(jnp.float32)
  return nll_BxP, correct_BxP


def pretraining_sums(mlm_logits_BxPxV: Array, nsp_logits_Bx2: Array, batch: dict[str, Array],
                     pair_mode: str) -> dict[str, Array]:
  """Summed losses and counts of one (micro)batch; `finalize` turns them into means."""
  w_BxP = batch["masked_weights"].astype(jnp.float32)  # 0 on padded prediction slots
  nll_BxP, correct_BxP = cross_entropy(mlm_logits_BxPxV, batch["masked_ids"])
  sums = dict(mlm_loss=jnp.sum(nll_BxP * w_BxP), mlm_correct=jnp.sum(correct_BxP * w_BxP),
              mlm_count=jnp.sum(w_BxP))
  if pair_mode == "none":
    zero = jnp.zeros((), jnp.float32)
    sums.update(nsp_loss=zero, nsp_correct=zero, nsp_count=zero)
  else:
    nll_B, correct_B = cross_entropy(nsp_logits_Bx2, batch["nsp_labels"])
    sums.update(nsp_loss=jnp.sum(nll_B), nsp_correct=jnp.sum(correct_B),
                nsp_count=jnp.asarray(nll_B.shape[0], jnp.float32))
  return sums


def total_loss(sums: dict[str, Array], mlm_count: Array, nsp_count: Array) -> Array:
  """The training objective given the counts of the *whole* batch: mean MLM + mean NSP."""
  return (sums["mlm_loss"] / jnp.maximum(mlm_count, 1.0)
          + sums["nsp_loss"] / jnp.maximum(nsp_count, 1.0))


def finalize(sums: dict[str, Array]) -> dict[str, Array]:
  """Means from sums: loss, mlm_loss, mlm_accuracy, mlm_perplexity, nsp_loss, nsp_accuracy."""
  mlm_n = jnp.maximum(sums["mlm_count"], 1.0)
  nsp_n = jnp.maximum(sums["nsp_count"], 1.0)
  mlm_loss = sums["mlm_loss"] / mlm_n
  nsp_loss = sums["nsp_loss"] / nsp_n
  return dict(loss=mlm_loss + nsp_loss, mlm_loss=mlm_loss, mlm_accuracy=sums["mlm_correct"] / mlm_n,
              mlm_perplexity=jnp.exp(mlm_loss), nsp_loss=nsp_loss,
              nsp_accuracy=sums["nsp_correct"] / nsp_n)
