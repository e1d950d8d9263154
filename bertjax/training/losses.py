"""Pretraining losses and metrics: MLM over real masked positions, NSP/SOP on [CLS].

Shape letters: B batch, P masked positions per sequence, V vocabulary, E examples per packed
row (a packed batch's NSP/SOP labels and logits are per example: [B, E], [B, E, 2]).

Everything is returned as *sums* with their counts, so that gradient accumulation over
microbatches and data-parallel reduction give exactly the loss of the whole global batch
(a mean of per-microbatch means would weight microbatches with few masks too heavily).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.data.tokenizer import MASK_ID

Array = jax.Array


def cross_entropy(logits_BxPxV: Array, labels_BxP: Array) -> tuple[Array, Array]:
  """Per-position negative log-likelihood and whether the argmax is right (float32)."""
  logp_BxPxV = jax.nn.log_softmax(logits_BxPxV.astype(jnp.float32), axis=-1)
  nll_BxP = -jnp.take_along_axis(logp_BxPxV, labels_BxP[..., None].astype(jnp.int32), axis=-1)[
      ..., 0
  ]
  correct_BxP = (jnp.argmax(logits_BxPxV, axis=-1) == labels_BxP).astype(jnp.float32)
  return nll_BxP, correct_BxP


def mlm_cross_entropy(
    x_BxPxH: Array, table_VxH: Array, bias_V: Array, labels_BxP: Array
) -> tuple[Array, Array]:
  """The tied MLM decoder and its cross-entropy in one op: (nll, correct), each [B, P] float32.

  Equal to `cross_entropy(x @ table.T + bias, labels)` (logits in float32 from `x`'s dtype,
  a label whose logit ties the maximum counts as correct), but with a hand-written gradient,
  because at BERT's vocabulary the elementwise work around the decoder costs as much as its
  matmuls: autodiff of that expression materialises a zero [B, P, V] tensor to scatter the
  label gradient into, takes an argmax pass and a log-softmax pass, and sums the bias
  gradient as a column reduction (on XLA's CPU backend ~30x slower than the same sum as a
  matrix-vector product). Here the gradient of the logits, softmax − one-hot, is one fused
  elementwise pass, and the bias gradient a matrix-vector product. Saved for the backward
  pass: the decoder's float32 output [B·P, V], as autodiff would save the logits.
  """
  b, p, h = x_BxPxH.shape
  nll_N, correct_N = _fused_xent(
      x_BxPxH.reshape(b * p, h), table_VxH, bias_V, labels_BxP.reshape(b * p).astype(jnp.int32)
  )
  return nll_N.reshape(b, p), correct_N.reshape(b, p)


def _xent_forward(x_NxH, table_VxH, bias_V, labels_N):
  # The matmul's output is what the backward pass keeps; the bias is added inside the passes
  # that read it (XLA fuses the add), so no second [N, V] array is written.
  raw_NxV = jnp.dot(x_NxH, table_VxH.T, preferred_element_type=jnp.float32)
  logits_NxV = raw_NxV + bias_V.astype(jnp.float32)
  max_N = jnp.max(logits_NxV, axis=-1)
  lse_N = max_N + jnp.log(jnp.sum(jnp.exp(logits_NxV - max_N[:, None]), axis=-1))
  label_logit_N = (
      jnp.take_along_axis(raw_NxV, labels_N[:, None], axis=-1)[:, 0]
      + bias_V.astype(jnp.float32)[labels_N]
  )
  nll_N = lse_N - label_logit_N
  correct_N = (label_logit_N >= max_N).astype(jnp.float32)
  return (nll_N, correct_N), (raw_NxV, lse_N)


@jax.custom_vjp
def _fused_xent(x_NxH, table_VxH, bias_V, labels_N):
  return _xent_forward(x_NxH, table_VxH, bias_V, labels_N)[0]


def _fused_xent_fwd(x_NxH, table_VxH, bias_V, labels_N):
  out, (raw_NxV, lse_N) = _xent_forward(x_NxH, table_VxH, bias_V, labels_N)
  return out, (x_NxH, table_VxH, bias_V, labels_N, raw_NxV, lse_N)


def _fused_xent_bwd(res, cotangents):
  x_NxH, table_VxH, bias_V, labels_N, raw_NxV, lse_N = res
  g_nll_N, _ = cotangents  # `correct` is a step function: no gradient
  is_label_NxV = jax.lax.broadcasted_iota(jnp.int32, raw_NxV.shape, 1) == labels_N[:, None]
  probs_NxV = jnp.exp(raw_NxV + bias_V.astype(jnp.float32) - lse_N[:, None])
  g_NxV = (probs_NxV - is_label_NxV) * g_nll_N[:, None]
  g_bias_V = jnp.dot(jnp.ones_like(g_nll_N), g_NxV)  # a column sum, as a matrix-vector product
  g_NxV = g_NxV.astype(x_NxH.dtype)
  g_x_NxH = jnp.dot(g_NxV, table_VxH, preferred_element_type=jnp.float32)
  g_table_VxH = jnp.dot(g_NxV.T, x_NxH, preferred_element_type=jnp.float32)
  return (
      g_x_NxH.astype(x_NxH.dtype),
      g_table_VxH.astype(table_VxH.dtype),
      g_bias_V.astype(bias_V.dtype),
      None,
  )


_fused_xent.defvjp(_fused_xent_fwd, _fused_xent_bwd)


def pretraining_sums(
    mlm_nll_BxP: Array,
    mlm_correct_BxP: Array,
    nsp_logits_Bx2: Array,
    batch: dict[str, Array],
    pair_mode: str,
) -> dict[str, Array]:
  """Summed losses and counts of one (micro)batch; `finalize` turns them into means.

  `mlm_nll_BxP` / `mlm_correct_BxP` come from `mlm_cross_entropy` on the model's
  `PretrainingOutput` (what the train step does) or from `cross_entropy` on logits.
  """
  w_BxP = batch["masked_weights"].astype(jnp.float32)  # 0 on padded prediction slots
  sums = dict(
      mlm_loss=jnp.sum(mlm_nll_BxP * w_BxP),
      mlm_correct=jnp.sum(mlm_correct_BxP * w_BxP),
      mlm_count=jnp.sum(w_BxP),
  )
  if pair_mode == "none":
    zero = jnp.zeros((), jnp.float32)
    sums.update(nsp_loss=zero, nsp_correct=zero, nsp_count=zero)
  else:
    # Unpacked: [B, 2] logits, [B] labels. Packed: [B, E, 2] and [B, E], one pair per example
    # slot, weighted by nsp_weights (0 for a slot no example fills).
    nll, correct = cross_entropy(nsp_logits_Bx2, batch["nsp_labels"])
    if "nsp_weights" in batch:
      w = batch["nsp_weights"].astype(jnp.float32)
      nll, correct = nll * w, correct * w
    sums.update(
        nsp_loss=jnp.sum(nll),
        nsp_correct=jnp.sum(correct),
        nsp_count=nsp_count(batch, pair_mode),
    )
  return sums


def nsp_count(batch: dict[str, Array], pair_mode: str) -> Array:
  """The examples the NSP/SOP loss averages over: every row unpacked, the present examples
  (sum of nsp_weights) packed, none without a pair task."""
  if pair_mode == "none":
    return jnp.zeros((), jnp.float32)
  if "nsp_weights" in batch:
    return jnp.sum(batch["nsp_weights"].astype(jnp.float32))
  return jnp.asarray(batch["nsp_labels"].shape[0], jnp.float32)


def at_mask_token(batch: dict[str, Array], mask_id: int = MASK_ID) -> Array:
  """[B, P] float32: 1 at the real predicted positions whose input token is `mask_id` (the
  data's [MASK]: 4 for SentencePiece, 103 in BERT's WordPiece vocabs)."""
  given_BxP = jnp.take_along_axis(batch["input_ids"], batch["masked_positions"], axis=1)
  return (given_BxP == mask_id).astype(jnp.float32) * batch["masked_weights"].astype(jnp.float32)


def total_loss(sums: dict[str, Array], mlm_count: Array, nsp_count: Array) -> Array:
  """The training objective given the counts of the *whole* batch: mean MLM + mean NSP."""
  return sums["mlm_loss"] / jnp.maximum(mlm_count, 1.0) + sums["nsp_loss"] / jnp.maximum(
      nsp_count, 1.0
  )


def finalize(sums: dict[str, Array]) -> dict[str, Array]:
  """Means from sums: loss, mlm_loss, mlm_accuracy, mlm_perplexity, nsp_loss, nsp_accuracy."""
  mlm_n = jnp.maximum(sums["mlm_count"], 1.0)
  nsp_n = jnp.maximum(sums["nsp_count"], 1.0)
  mlm_loss = sums["mlm_loss"] / mlm_n
  nsp_loss = sums["nsp_loss"] / nsp_n
  out = dict(
      loss=mlm_loss + nsp_loss,
      mlm_loss=mlm_loss,
      mlm_accuracy=sums["mlm_correct"] / mlm_n,
      mlm_perplexity=jnp.exp(mlm_loss),
      nsp_loss=nsp_loss,
      nsp_accuracy=sums["nsp_correct"] / nsp_n,
  )
  if "mask_count" in sums:  # evaluation: accuracy where the input is [MASK]
    out["mask_accuracy"] = sums["mask_correct"] / jnp.maximum(sums["mask_count"], 1.0)
  return out


# ------------------------------------------------------------------------------------ ELECTRA

ELECTRA_SUMS = (
    "mlm_loss",
    "mlm_correct",
    "mlm_count",
    "disc_loss",
    "disc_correct",
    "disc_count",
    "replaced_correct",
    "replaced_count",
    "original_correct",
)


def real_tokens(batch: dict[str, Array]) -> Array:
  """[B, L] float32: 1 on the real tokens the discriminator is scored on (padding excluded; the
  rows batch-size warmup skips too)."""
  real_BxL = batch["attention_mask"].astype(jnp.float32)
  if "row_weights" in batch:
    real_BxL = real_BxL * batch["row_weights"][:, None]
  return real_BxL


def binary_cross_entropy(logits_BxL: Array, labels_BxL: Array) -> Array:
  """[B, L] -log sigmoid(logit) for label 1, -log sigmoid(-logit) for 0, stable at any logit."""
  z_BxL = logits_BxL.astype(jnp.float32)
  return jnp.maximum(z_BxL, 0.0) - z_BxL * labels_BxL + jnp.log1p(jnp.exp(-jnp.abs(z_BxL)))


def electra_sums(
    mlm_nll_BxP: Array,
    mlm_correct_BxP: Array,
    disc_logits_BxL: Array,
    is_replaced_BxL: Array,
    batch: dict[str, Array],
) -> dict[str, Array]:
  """Summed losses and counts of one (micro)batch of ELECTRA: the generator's MLM over the real
  masked positions, the discriminator's binary cross-entropy over every real token, and its
  hits on the replaced and on the original tokens; `electra_finalize` turns them into means."""
  w_BxP = batch["masked_weights"].astype(jnp.float32)
  real_BxL = real_tokens(batch)
  replaced_BxL = is_replaced_BxL * real_BxL
  hit_BxL = ((disc_logits_BxL > 0).astype(jnp.float32) == is_replaced_BxL).astype(jnp.float32)
  return dict(
      mlm_loss=jnp.sum(mlm_nll_BxP * w_BxP),
      mlm_correct=jnp.sum(mlm_correct_BxP * w_BxP),
      mlm_count=jnp.sum(w_BxP),
      disc_loss=jnp.sum(binary_cross_entropy(disc_logits_BxL, is_replaced_BxL) * real_BxL),
      disc_correct=jnp.sum(hit_BxL * real_BxL),
      disc_count=jnp.sum(real_BxL),
      replaced_correct=jnp.sum(hit_BxL * replaced_BxL),
      replaced_count=jnp.sum(replaced_BxL),
      original_correct=jnp.sum(hit_BxL * (real_BxL - replaced_BxL)),
  )


def electra_loss(
    sums: dict[str, Array], mlm_count: Array, disc_count: Array, disc_weight: float
) -> Array:
  """ELECTRA's objective given the counts of the *whole* batch: mean generator MLM loss +
  λ · mean discriminator cross-entropy (λ = `disc_weight`, the paper's 50)."""
  return sums["mlm_loss"] / jnp.maximum(mlm_count, 1.0) + disc_weight * sums[
      "disc_loss"
  ] / jnp.maximum(disc_count, 1.0)


def electra_finalize(sums: dict[str, Array], disc_weight: float) -> dict[str, Array]:
  """Means from `electra_sums`: loss; the generator's mlm_loss, mlm_accuracy, mlm_perplexity;
  disc_loss, disc_accuracy (every real token), disc_accuracy_replaced / _original (on the
  replaced and on the original tokens), and replaced_fraction (of the real tokens)."""
  mlm_n = jnp.maximum(sums["mlm_count"], 1.0)
  disc_n = jnp.maximum(sums["disc_count"], 1.0)
  mlm_loss = sums["mlm_loss"] / mlm_n
  disc_loss = sums["disc_loss"] / disc_n
  original_n = sums["disc_count"] - sums["replaced_count"]
  out = dict(
      loss=mlm_loss + disc_weight * disc_loss,
      mlm_loss=mlm_loss,
      mlm_accuracy=sums["mlm_correct"] / mlm_n,
      mlm_perplexity=jnp.exp(mlm_loss),
      disc_loss=disc_loss,
      disc_accuracy=sums["disc_correct"] / disc_n,
      disc_accuracy_replaced=sums["replaced_correct"] / jnp.maximum(sums["replaced_count"], 1.0),
      disc_accuracy_original=sums["original_correct"] / jnp.maximum(original_n, 1.0),
      replaced_fraction=sums["replaced_count"] / disc_n,
  )
  if "mask_count" in sums:  # evaluation: the generator's accuracy where the input is [MASK]
    out["mask_accuracy"] = sums["mask_correct"] / jnp.maximum(sums["mask_count"], 1.0)
  return out
