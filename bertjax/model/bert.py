"""BERT (Devlin et al. 2018) as a functional Flax linen encoder with logical sharding axes.

Shape letters used in array names throughout:
  B batch, L sequence length, H hidden size, N attention heads, D head size (H / N),
  F intermediate (MLP) size, P masked positions per sequence, V vocabulary, C classes.

Every parameter carries logical axis names (``nn.with_logical_partitioning``); activations are
constrained at block boundaries with ``nn.with_logical_constraint``. Which mesh axis a logical
axis lands on is decided in one table, ``bertjax.training.sharding.LOGICAL_AXIS_RULES``; no
mesh axis name appears in this file. Without a mesh the constraints are no-ops, so the model
also runs plainly on one device. The package imports only JAX and Flax (no TensorFlow).

The network reads as the paper's; how XLA should lower its dense products, dropout and
attention is `ops.py`'s business, and the task heads are in `heads.py`.

Logical axes: 'vocab', 'embed' (hidden), 'pos' (positions table), 'type' (segment table),
'qkv' (the fused query/key/value axis, size 3), 'heads', 'kv' (head size), 'mlp', 'layers'
(the stacked axis under ``scan_layers``), 'classes', and for activations 'batch', 'length',
'act_embed', 'act_heads', 'act_mlp', 'masked'.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertjax.model import ops
from bertjax.model.config import ACTIVATIONS, BertConfig

Array = jax.Array


def _init(cfg: BertConfig, names: tuple[str | None, ...]):
  # BERT's tf.truncated_normal_initializer: N(0, range²) redrawn outside ±2·range (so the
  # drawn values' std is 0.88·range); jax's truncated_normal is the same distribution.
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range, lower=-2.0, upper=2.0), names
  )


def _zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_eps,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype,
      scale_init=_ones(("embed",)),
      bias_init=_zeros(("embed",)),
      name=name,
  )


def dense(cfg: BertConfig, features: int, axes: tuple[str, str], name: str | None = None):
  """BERT's dense layer: `nn.Dense` with logical axes (kernel `axes`, bias `axes[1]`)."""
  return nn.Dense(
      features,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype,
      kernel_init=_init(cfg, axes),
      bias_init=_zeros((axes[1],)),
      dot_general=ops.flat_dot_general,
      name=name,
  )


def _constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


class Embeddings(nn.Module):
  """Word + learned position + segment embeddings, then LayerNorm and dropout."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.word_embeddings = nn.Embed(
        cfg.vocab_size,
        cfg.hidden_size,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        embedding_init=_init(cfg, ("vocab", "embed")),
    )
    self.position_embeddings = nn.Embed(
        cfg.max_position_embeddings,
        cfg.hidden_size,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        embedding_init=_init(cfg, ("pos", "embed")),
    )
    self.token_type_embeddings = nn.Embed(
        cfg.type_vocab_size,
        cfg.hidden_size,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        embedding_init=_init(cfg, ("type", "embed")),
    )
    self.layer_norm = _layer_norm(cfg, "layer_norm")
    self.dropout = ops.Dropout(cfg.hidden_dropout_rate)

  def __call__(self, input_ids_BxL: Array, token_type_ids_BxL: Array, deterministic: bool) -> Array:
    seq_len = input_ids_BxL.shape[1]
    if seq_len > self.cfg.max_position_embeddings:
      raise ValueError(
          f"sequence length {seq_len} exceeds max_position_embeddings="
          f"{self.cfg.max_position_embeddings}"
      )
    positions_1xL = jnp.arange(seq_len)[None, :]
    x_BxLxH = (
        self.word_embeddings(input_ids_BxL)
        + self.position_embeddings(positions_1xL)
        + self.token_type_embeddings(token_type_ids_BxL)
    )
    x_BxLxH = self.layer_norm(x_BxLxH)
    x_BxLxH = self.dropout(x_BxLxH, deterministic=deterministic)
    return _constrain(x_BxLxH, ("batch", "length", "act_embed"))


def attention_mask_bias(attention_mask_BxL: Array) -> Array:
  """Boolean [B, 1, 1, L] mask: a query may attend to every real (non-padding) key."""
  return attention_mask_BxL.astype(bool)[:, None, None, :]


class Projection(nn.Module):
  """A dense layer whose kernel keeps its full multi-axis shape, e.g. [H, 3, N, D].

  `nn.DenseGeneral` creates such kernels flattened and reshapes them, so logical names of the
  full rank cannot be applied under a mesh; here each axis is named and shardable as created.
  """

  cfg: BertConfig
  equation: str  # einsum from input and kernel to output
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]  # logical names, one per kernel axis

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.cfg
    kernel_letters, out_letters = self.equation.split(",")[1].split("->")
    keep = [i for i, c in enumerate(kernel_letters) if c in out_letters]  # the output's axes
    bias_shape = tuple(self.kernel_shape[i] for i in keep)
    bias_axes = tuple(self.kernel_axes[i] for i in keep)
    kernel = self.param("kernel", _init(cfg, self.kernel_axes), self.kernel_shape, cfg.params_dtype)
    bias = self.param("bias", _zeros(bias_axes), bias_shape, cfg.params_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.compute_dtype)
    return jnp.einsum(self.equation, x, kernel) + bias


class Attention(nn.Module):
  """Multi-head self-attention with a fused QKV projection.

  Training with attention dropout (BERT's 0.1) drops out the probabilities; `ops.attention`
  computes it (and the deterministic case through `jax.nn.dot_product_attention`).
  """

  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxH: Array, mask_Bx1x1xL: Array) -> Array:
    cfg = self.cfg
    qkv_BxLx3xNxD = Projection(
        cfg,
        "blh,hcnd->blcnd",
        (cfg.hidden_size, 3, cfg.num_heads, cfg.head_dim),
        ("embed", "qkv", "heads", "kv"),
        name="qkv",
    )(x_BxLxH)
    q_BxLxNxD, k_BxLxNxD, v_BxLxNxD = (qkv_BxLx3xNxD[:, :, i] for i in range(3))
    batch, length = x_BxLxH.shape[:2]
    keep_BxNxLxL, keep_scale = None, 1.0
    if not self.deterministic and cfg.attention_dropout_rate > 0.0:
      keep_BxNxLxL, keep_scale = ops.Dropout(cfg.attention_dropout_rate).keep_mask(
          (batch, cfg.num_heads, length, length)
      )
    out_BxLxNxD = ops.attention(
        q_BxLxNxD,
        k_BxLxNxD,
        v_BxLxNxD,
        mask_Bx1x1xL,
        ops.attention_chunks(cfg.attention_batch_chunks, batch),
        keep_BxNxLxL,
        keep_scale,
    )
    out_BxLxNxD = _constrain(out_BxLxNxD, ("batch", "length", "act_heads", "kv"))
    return Projection(
        cfg,
        "blnd,ndh->blh",
        (cfg.num_heads, cfg.head_dim, cfg.hidden_size),
        ("heads", "kv", "embed"),
        name="out",
    )(out_BxLxNxD)


class Layer(nn.Module):
  """One post-LayerNorm Transformer block, as in the original BERT."""

  cfg: BertConfig
  deterministic: bool
  collect_hidden: bool = False  # under scan: also emit this layer's output as a scan output

  @nn.compact
  def __call__(self, x_BxLxH: Array, mask_Bx1x1xL: Array):
    cfg = self.cfg
    dropout = ops.Dropout(cfg.hidden_dropout_rate)
    attn_BxLxH = Attention(cfg, self.deterministic, name="attention")(x_BxLxH, mask_Bx1x1xL)
    attn_BxLxH = dropout(attn_BxLxH, deterministic=self.deterministic)
    x_BxLxH = _layer_norm(cfg, "attention_layer_norm")(x_BxLxH + attn_BxLxH)

    h_BxLxF = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x_BxLxH)
    h_BxLxF = ACTIVATIONS[cfg.hidden_act](h_BxLxF)
    h_BxLxF = _constrain(h_BxLxF, ("batch", "length", "act_mlp"))
    h_BxLxH = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h_BxLxF)
    h_BxLxH = dropout(h_BxLxH, deterministic=self.deterministic)
    x_BxLxH = _layer_norm(cfg, "output_layer_norm")(x_BxLxH + h_BxLxH)
    x_BxLxH = _constrain(x_BxLxH, ("batch", "length", "act_embed"))
    return x_BxLxH, (x_BxLxH if self.collect_hidden else None)


def _remat_policy(name: str):
  if name == "full":
    return None  # save nothing: recompute the whole layer in the backward pass
  if name == "dots":
    return jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
  raise ValueError(f"remat={name!r}")


class LayerStack(nn.Module):
  """The stack of layers: a Python loop (`layer_0`, `layer_1`, ...) or one `nn.scan` (`layers`).

  Both give the same function; `stack_layer_params` / `unstack_layer_params` convert the
  parameter trees.
  """

  cfg: BertConfig

  @nn.compact
  def __call__(
      self,
      x_BxLxH: Array,
      mask_Bx1x1xL: Array,
      deterministic: bool,
      output_hidden_states: bool = False,
  ) -> tuple[Array, list[Array]]:
    cfg = self.cfg
    layer_cls = Layer
    if cfg.remat != "none":
      layer_cls = nn.remat(Layer, policy=_remat_policy(cfg.remat), prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      scanned = nn.scan(
          layer_cls,
          variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=nn.broadcast,
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"},
      )
      x_BxLxH, hidden_SxBxLxH = scanned(cfg, deterministic, output_hidden_states, name="layers")(
          x_BxLxH, mask_Bx1x1xL
      )
      return x_BxLxH, (list(hidden_SxBxLxH) if output_hidden_states else [])
    hidden = []
    for i in range(cfg.num_layers):
      x_BxLxH, _ = layer_cls(cfg, deterministic, name=f"layer_{i}")(x_BxLxH, mask_Bx1x1xL)
      hidden.append(x_BxLxH)
    return x_BxLxH, (hidden if output_hidden_states else [])


@flax.struct.dataclass
class EncoderOutput:
  sequence_output: Array  # [B, L, H] last layer
  pooled_output: Array  # [B, H] tanh(dense([CLS]))
  hidden_states: tuple[Array, ...] = ()  # embeddings then each layer's [B, L, H], if requested


class BertModel(nn.Module):
  """The BERT encoder: embeddings, the layer stack and the pooler."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.embeddings = Embeddings(cfg)
    self.encoder = LayerStack(cfg)
    self.pooler = dense(cfg, cfg.hidden_size, ("embed", "embed_out"))

  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      deterministic: bool = True,
      output_hidden_states: bool = False,
  ) -> EncoderOutput:
    if token_type_ids_BxL is None:
      token_type_ids_BxL = jnp.zeros_like(input_ids_BxL)
    if attention_mask_BxL is None:
      attention_mask_BxL = jnp.ones_like(input_ids_BxL)
    emb_BxLxH = self.embeddings(input_ids_BxL, token_type_ids_BxL, deterministic)
    x_BxLxH, hidden = self.encoder(
        emb_BxLxH, attention_mask_bias(attention_mask_BxL), deterministic, output_hidden_states
    )
    pooled_BxH = jnp.tanh(self.pooler(x_BxLxH[:, 0]))
    hidden_states = tuple([emb_BxLxH] + hidden) if output_hidden_states else ()
    return EncoderOutput(
        sequence_output=x_BxLxH, pooled_output=pooled_BxH, hidden_states=hidden_states
    )


@flax.struct.dataclass
class PretrainingOutput:
  """What the MLM loss needs, not the logits: scoring the vocabulary is fused with the loss
  (`bertjax.training.losses.mlm_cross_entropy`), so the [B, P, V] logits are never formed in
  training. `mlm_logits` computes them for inspection (fill-mask, conversions, tests)."""

  mlm_hidden: Array  # [B, P, H] MLM transform + LayerNorm at masked_positions (all positions
  #                    when none are given)
  mlm_table: Array  # [V, H] the word-embedding table the decoder is tied to, compute dtype
  mlm_bias: Array  # [V] the decoder's output bias
  nsp_logits: Array  # [B, 2] float32 (IsNext = 0, NotNext = 1; SOP uses the same head)
  sequence_output: Array  # [B, L, H]
  pooled_output: Array  # [B, H]

  @property
  def mlm_logits(self) -> Array:
    """[B, P, V] float32 logits of the tied decoder."""
    logits_BxPxV = jnp.dot(self.mlm_hidden, self.mlm_table.T).astype(jnp.float32)
    return logits_BxPxV + self.mlm_bias.astype(jnp.float32)


def gather_positions(x_BxLxH: Array, positions_BxP: Array) -> Array:
  """x[b, positions[b, p]] for every b, p: the rows the MLM head scores."""
  return jnp.take_along_axis(x_BxLxH, positions_BxP[:, :, None].astype(jnp.int32), axis=1)


class BertForPreTraining(nn.Module):
  """BERT with the MLM head (tied decoder, scored only at masked positions) and the NSP head."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.bert = BertModel(cfg)
    self.mlm_transform = dense(cfg, cfg.hidden_size, ("embed", "embed_out"))
    self.mlm_layer_norm = _layer_norm(cfg, "mlm_layer_norm")
    self.mlm_bias = self.param("mlm_bias", _zeros(("vocab",)), (cfg.vocab_size,), cfg.params_dtype)
    self.nsp = dense(cfg, 2, ("embed", "classes"))

  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      masked_positions_BxP: Array | None = None,
      *,
      deterministic: bool = True,
  ) -> PretrainingOutput:
    enc = self.bert(
        input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic
    )
    x_BxLxH = enc.sequence_output
    # Score the vocabulary only where a token was masked: at seq 128 with 20 predictions this
    # skips ~85% of the decoder's FLOPs, the largest single cost of a small model.
    x_BxPxH = (
        x_BxLxH if masked_positions_BxP is None else gather_positions(x_BxLxH, masked_positions_BxP)
    )
    x_BxPxH = ACTIVATIONS[self.cfg.hidden_act](self.mlm_transform(x_BxPxH))
    x_BxPxH = self.mlm_layer_norm(x_BxPxH)
    table_VxH = self.bert.embeddings.word_embeddings.embedding.astype(x_BxPxH.dtype)
    return PretrainingOutput(
        mlm_hidden=x_BxPxH,
        mlm_table=table_VxH,
        mlm_bias=self.mlm_bias,
        nsp_logits=self.nsp(enc.pooled_output).astype(jnp.float32),
        sequence_output=x_BxLxH,
        pooled_output=enc.pooled_output,
    )
