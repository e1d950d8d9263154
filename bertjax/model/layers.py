"""The building blocks every network of the package is made of: parameter initialisers with
logical axis names, LayerNorm, Dense, embedding tables and activation constraints.

Every parameter carries logical axis names (``nn.with_logical_partitioning``); which mesh axis
a name lands on is `bertjax.training.sharding.LOGICAL_AXIS_RULES`' business.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.model import ops
from bertjax.model.config import BertConfig

Array = jax.Array


def init(cfg: BertConfig, names: tuple[str | None, ...]):
  # BERT's tf.truncated_normal_initializer: N(0, range²) redrawn outside ±2·range (so the
  # drawn values' std is 0.88·range); jax's truncated_normal is the same distribution.
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range, lower=-2.0, upper=2.0), names
  )


def zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def layer_norm(cfg: BertConfig, name: str, axis: str = "embed") -> nn.LayerNorm:
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_eps,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype,
      use_bias=cfg.use_bias,
      scale_init=ones((axis,)),
      bias_init=zeros((axis,)),
      name=name,
  )


def dense(
    cfg: BertConfig,
    features: int,
    axes: tuple[str, str],
    name: str | None = None,
    use_bias: bool | None = None,
):
  """BERT's dense layer: `nn.Dense` with logical axes (kernel `axes`, bias `axes[1]`).

  The bias follows `cfg.use_bias` unless `use_bias` says otherwise: bertjax's own heads (the
  pooler, NSP and the task heads, which ModernBERT does not have) always keep theirs.
  """
  return nn.Dense(
      features,
      use_bias=cfg.use_bias if use_bias is None else use_bias,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype,
      kernel_init=init(cfg, axes),
      bias_init=zeros((axes[1],)),
      dot_general=ops.flat_dot_general,
      name=name,
  )


def constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


def embedding(cfg: BertConfig, rows: int, axis: str) -> nn.Embed:
  """A [rows, E] table whose rows are named `axis` ('vocab', 'pos' or 'type'); E is the
  embedding width, the hidden size unless `cfg.embedding_size` factorises the embeddings."""
  return nn.Embed(
      rows,
      cfg.embedding_width,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype,
      embedding_init=init(cfg, (axis, "embed")),
  )
