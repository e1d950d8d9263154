"""Task heads on the BERT encoder: sequence classification (GLUE), SQuAD spans, token tags.

Each head is new on restore; the encoder underneath is `bert.BertModel` under the name "bert",
so the pretrained "bert" subtree loads into any of them.
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
  """A task head's dense layer from the hidden size to `num_outputs` logits (new on restore)."""
  return dense(cfg, num_outputs, ("embed", "classes"), name)


class BertForSequenceClassification(nn.Module):
  """The GLUE head: dropout + dense on the pooled [CLS]; num_labels == 1 is regression."""

  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      deterministic: bool = True,
  ) -> Array:
    enc = BertModel(self.cfg, name="bert")(
        input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic
    )
    x_BxH = ops.Dropout(self.cfg.hidden_dropout_rate)(
        enc.pooled_output, deterministic=deterministic
    )
    logits_BxC = _head(self.cfg, self.num_labels, "classifier")(x_BxH)
    return logits_BxC.astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
  """google-research/bert's SQuAD head: one dense layer from each token to (start, end)."""

  cfg: BertConfig

  @nn.compact
  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      deterministic: bool = True,
  ) -> tuple[Array, Array]:
    enc = BertModel(self.cfg, name="bert")(
        input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic
    )
    logits_BxLx2 = _head(self.cfg, 2, "qa_outputs")(enc.sequence_output)
    logits_BxLx2 = logits_BxLx2.astype(jnp.float32)
    return logits_BxLx2[..., 0], logits_BxLx2[..., 1]


class BertForTokenClassification(nn.Module):
  """The NER head: dropout + dense from each token's last hidden state to `num_labels` tags."""

  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      deterministic: bool = True,
  ) -> Array:
    enc = BertModel(self.cfg, name="bert")(
        input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic
    )
    x_BxLxH = ops.Dropout(self.cfg.hidden_dropout_rate)(
        enc.sequence_output, deterministic=deterministic
    )
    logits_BxLxC = _head(self.cfg, self.num_labels, "classifier")(x_BxLxH)
    return logits_BxLxC.astype(jnp.float32)
