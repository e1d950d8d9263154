"""Task heads on the BERT encoder: sequence classification (GLUE), SQuAD spans, token tags.

One head per kind, on rows of one example or on packed rows (`segment_ids`, keyword-only and
optional: several examples share a row, each attending only to itself). Each head is new on
restore; the encoder underneath is `bert.BertModel` under the name "bert", so the pretrained
"bert" subtree loads into any of them.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import ops
from bertjax.model.bert import BertModel, dense
from bertjax.model.config import BertConfig

Array = jax.Array


def _head(cfg: BertConfig, num_outputs: int, name: str) -> nn.Dense:
  """A task head's dense layer from the hidden size to `num_outputs` logits (new on restore),
  with a bias whatever `cfg.use_bias` says of the encoder."""
  return dense(cfg, num_outputs, ("embed", "classes"), name, use_bias=True)


def _token_states(
    cfg: BertConfig, input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, segment_ids_BxL, det
) -> Array:
  """[B, L, H] the encoder's last layer (the submodule "bert" of the calling head), packed rows
  kept apart by their segment ids if given."""
  enc = BertModel(cfg, name="bert")(
      input_ids_BxL,
      token_type_ids_BxL,
      attention_mask_BxL,
      segment_ids=segment_ids_BxL,
      deterministic=det,
  )
  return enc.sequence_output


class BertForSequenceClassification(nn.Module):
  """The GLUE head: dropout + dense on the pooled [CLS]; num_labels == 1 is regression.

  `pooling="mean"` reads the mean of the last layer's token states (padding excluded) instead
  of the pooler's tanh of [CLS]: not BERT's head, an option for encoders whose [CLS] state has
  not been trained into a sentence summary (experiments/probe.py measures that).

  Packed rows (`batching.packed_batch`): with `segment_ids` [B, L] (1..E for the examples of a
  row, 0 padding) and `cls_positions` [B, E] (-1 an empty slot), each example is pooled from
  its own [CLS] or its own tokens and the logits are [B, E, C].
  """

  cfg: BertConfig
  num_labels: int
  pooling: str = "cls"  # cls (BERT's pooled output) | mean

  @nn.compact
  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      segment_ids: Array | None = None,
      cls_positions: Array | None = None,
      deterministic: bool = True,
  ) -> Array:
    if self.pooling not in ("cls", "mean"):
      raise ValueError(f"pooling {self.pooling!r}; valid: cls, mean")
    enc = BertModel(self.cfg, name="bert")(
        input_ids_BxL,
        token_type_ids_BxL,
        attention_mask_BxL,
        segment_ids=segment_ids,
        cls_positions=cls_positions,
        deterministic=deterministic,
    )
    x_BxLxH = enc.sequence_output
    if self.pooling == "cls":
      pooled = enc.pooled_output  # [B, H], or [B, E, H] packed
    elif segment_ids is not None:  # each example's mean over its own tokens
      slots_E = jnp.arange(1, cls_positions.shape[1] + 1)
      m_BxLxE = (segment_ids[:, :, None] == slots_E).astype(x_BxLxH.dtype)
      sums_BxExH = jnp.einsum("ble,blh->beh", m_BxLxE, x_BxLxH)
      pooled = sums_BxExH / jnp.maximum(m_BxLxE.sum(1), 1.0)[:, :, None]
    else:
      if attention_mask_BxL is None:
        attention_mask_BxL = jnp.ones_like(input_ids_BxL)
      m_BxLx1 = attention_mask_BxL[:, :, None].astype(x_BxLxH.dtype)
      pooled = (x_BxLxH * m_BxLx1).sum(1) / jnp.maximum(m_BxLx1.sum(1), 1.0)
    x = ops.Dropout(self.cfg.hidden_dropout_rate)(pooled, deterministic=deterministic)
    logits = _head(self.cfg, self.num_labels, "classifier")(x)  # [B, C] or [B, E, C]
    return logits.astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
  """google-research/bert's SQuAD head: one dense layer from each token to (start, end).

  Packed rows: with `segment_ids` [B, L] (1..E for the windows of a row, 0 padding) attention
  stays within each window; every token is scored, so `cls_positions` is not needed (the loss
  and the decoder read each window's tokens from its own [CLS] on)."""

  cfg: BertConfig

  @nn.compact
  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      segment_ids: Array | None = None,
      cls_positions: Array | None = None,
      deterministic: bool = True,
  ) -> tuple[Array, Array]:
    x_BxLxH = _token_states(
        self.cfg, input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, segment_ids, deterministic
    )
    del cls_positions  # every token is scored
    logits_BxLx2 = _head(self.cfg, 2, "qa_outputs")(x_BxLxH)
    logits_BxLx2 = logits_BxLx2.astype(jnp.float32)
    return logits_BxLx2[..., 0], logits_BxLx2[..., 1]


class BertForTokenClassification(nn.Module):
  """The NER head: dropout + dense from each token's last hidden state to `num_labels` tags.

  Packed rows: with `segment_ids` [B, L] (1..E for the sentences of a row, 0 padding) attention
  stays within each sentence; every token is tagged, so `cls_positions` is not needed."""

  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      segment_ids: Array | None = None,
      cls_positions: Array | None = None,
      deterministic: bool = True,
  ) -> Array:
    x_BxLxH = _token_states(
        self.cfg, input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, segment_ids, deterministic
    )
    del cls_positions  # every token is tagged
    x_BxLxH = ops.Dropout(self.cfg.hidden_dropout_rate)(x_BxLxH, deterministic=deterministic)
    logits_BxLxC = _head(self.cfg, self.num_labels, "classifier")(x_BxLxH)
    return logits_BxLxC.astype(jnp.float32)
