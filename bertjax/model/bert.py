"""BERT (Devlin et al. 2018) as a functional Flax linen encoder with logical sharding axes.

Shape letters used in array names throughout:
  B batch, L sequence length, H hidden size, N attention heads, D head size (H / N),
  F intermediate (MLP) size, P masked positions per sequence, V vocabulary, C classes,
  E examples per row (packed rows).

A row is one example padded with `attention_mask`, or several complete examples packed
together: `segment_ids` (1..k, 0 for padding) keep attention inside each example,
`position_ids` restart at each example and `cls_positions` point the pooler and the NSP head at
each example's [CLS]. Nothing else in the network knows about packing.

Every parameter carries logical axis names (``nn.with_logical_partitioning``); activations are
constrained at block boundaries with ``nn.with_logical_constraint``. Which mesh axis a logical
axis lands on is decided in one table, ``bertjax.training.sharding.LOGICAL_AXIS_RULES``; no
mesh axis name appears in this file. Without a mesh the constraints are no-ops, so the model
also runs plainly on one device. The package imports only JAX and Flax (no TensorFlow).

The network reads as the paper's; how XLA should lower its dense products, dropout and
attention is `ops.py`'s business, and the task heads are in `heads.py`.

ModernBERT (Warner et al. 2024) is the same network with a short list of departures, each a
`BertConfig` switch whose default is BERT's, each visible where it happens below: pre-LN with a
final norm and no attention norm in layer 0 (`norm_placement`), GeGLU (`mlp_type`), rotary
positions with a global and a local theta (`position_embedding`, `rope.py`), no biases
(`use_bias`), no token types (`type_vocab_size=0`) and local attention in all layers but every
`global_every`-th (`local_attention`, a mask like a segment, through `ops.attention`).

Logical axes: 'vocab', 'embed' (hidden), 'pos' (positions table), 'type' (segment table),
'qkv' (the fused query/key/value axis, size 3), 'heads', 'kv' (head size), 'mlp', 'glu' (the
GLU's input/gate axis, size 2), 'layers'
(the stacked axis under ``scan_layers``), 'classes', and for activations 'batch', 'length',
'act_embed', 'act_heads', 'act_mlp', 'masked'.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertjax.model import ops, rope
from bertjax.model.config import ACTIVATIONS, BertConfig

Array = jax.Array


# The building blocks (`layers`), under the names this module uses.
from bertjax.model.layers import (  # noqa: F401
    constrain as _constrain,
    dense,
    embedding as _embedding,
    init as _init,
    layer_norm as _layer_norm,
    zeros as _zeros,
)


class Embeddings(nn.Module):
  """Word + learned position + segment embeddings, then LayerNorm and dropout, [B, L, E].

  E is the hidden size H, or ELECTRA's smaller `embedding_size`, which `BertModel` projects
  to H (`embeddings_project`).

  With rotary positions there is no position table (attention rotates queries and keys); with
  `type_vocab_size=0` no segment table, and token types passed in are ignored (ModernBERT).
  """

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.word_embeddings = _embedding(cfg, cfg.vocab_size, "vocab")
    if cfg.position_embedding == "learned":
      self.position_embeddings = _embedding(cfg, cfg.max_position_embeddings, "pos")
    if cfg.type_vocab_size:
      self.token_type_embeddings = _embedding(cfg, cfg.type_vocab_size, "type")
    self.layer_norm = _layer_norm(cfg, "layer_norm")
    self.dropout = ops.Dropout(cfg.hidden_dropout_rate)

  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array,
      deterministic: bool,
      position_ids_BxL: Array | None = None,
  ) -> Array:
    cfg = self.cfg
    seq_len = input_ids_BxL.shape[1]
    if seq_len > cfg.max_seq_len:
      raise ValueError(
          f"sequence length {seq_len} exceeds max_position_embeddings="
          f"{cfg.max_position_embeddings}"
          + (f" less position_offset={cfg.position_offset}" if cfg.position_offset else "")
      )
    if position_ids_BxL is None:
      position_ids_BxL = jnp.arange(seq_len)[None, :]
    x_BxLxE = self.word_embeddings(input_ids_BxL)
    if cfg.position_embedding == "learned":  # RoBERTa's table starts position 0 at row 2
      x_BxLxE = x_BxLxE + self.position_embeddings(position_ids_BxL + cfg.position_offset)
    if cfg.type_vocab_size == 1:  # RoBERTa: one type, whatever types the inputs carry
      token_type_ids_BxL = jnp.zeros_like(token_type_ids_BxL)
    if cfg.type_vocab_size:
      x_BxLxE = x_BxLxE + self.token_type_embeddings(token_type_ids_BxL)
    x_BxLxE = self.layer_norm(x_BxLxE)
    x_BxLxE = self.dropout(x_BxLxE, deterministic=deterministic)
    return _constrain(x_BxLxE, ("batch", "length", "act_embed"))


def attention_mask_bias(attention_mask_BxL: Array) -> Array:
  """Boolean [B, 1, 1, L] mask: a query may attend to every real (non-padding) key."""
  return attention_mask_BxL.astype(bool)[:, None, None, :]


def packed_position_ids(segment_ids_BxL: Array) -> Array:
  """[B, L] positions that restart at 0 where the segment id changes: each packed example's
  own positions (padding counts on from its own start, harmlessly)."""
  length = segment_ids_BxL.shape[1]
  index_BxL = jnp.broadcast_to(jnp.arange(length), segment_ids_BxL.shape)
  starts_BxL = jnp.concatenate(
      [
          jnp.ones_like(segment_ids_BxL[:, :1], bool),
          segment_ids_BxL[:, 1:] != segment_ids_BxL[:, :-1],
      ],
      axis=1,
  )
  return index_BxL - jax.lax.cummax(jnp.where(starts_BxL, index_BxL, 0), axis=1)


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
    if not cfg.use_bias:
      x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=cfg.compute_dtype)
      return jnp.einsum(self.equation, x, kernel)
    bias = self.param("bias", _zeros(bias_axes), bias_shape, cfg.params_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.compute_dtype)
    return jnp.einsum(self.equation, x, kernel) + bias


class Attention(nn.Module):
  """Multi-head self-attention with a fused QKV projection.

  The softmax attention itself, with its masks and its dropout (BERT's 0.1 on the
  probabilities), is `ops.attention`, which picks the backend's kernel. A local layer
  (`is_global` False) sees keys within `cfg.local_attention // 2` tokens: one more mask there.
  """

  cfg: BertConfig
  deterministic: bool
  is_global: bool = True

  @nn.compact
  def __call__(
      self,
      x_BxLxH: Array,
      mask_Bx1x1xL: Array | None,
      segment_ids_BxL: Array | None,
      position_ids_BxL: Array | None = None,
  ) -> Array:
    cfg = self.cfg
    qkv_BxLx3xNxD = Projection(
        cfg,
        "blh,hcnd->blcnd",
        (cfg.hidden_size, 3, cfg.num_heads, cfg.head_dim),
        ("embed", "qkv", "heads", "kv"),
        name="qkv",
    )(x_BxLxH)
    q_BxLxNxD, k_BxLxNxD, v_BxLxNxD = (qkv_BxLx3xNxD[:, :, i] for i in range(3))
    if cfg.position_embedding == "rope":  # ModernBERT: rotary positions, a theta per layer kind
      theta = cfg.rope_theta if self.is_global else cfg.local_rope_theta
      q_BxLxNxD = rope.rotate(q_BxLxNxD, position_ids_BxL, theta)
      k_BxLxNxD = rope.rotate(k_BxLxNxD, position_ids_BxL, theta)
    dropout_rng = None
    if not self.deterministic and cfg.attention_dropout_rate > 0.0:
      # The key of a `Dropout` child's scope, where attention's mask has always been drawn: the
      # same seed gives the same masks as before attention moved behind `ops.attention`.
      dropout_rng = ops.Dropout(cfg.attention_dropout_rate).make_rng("dropout")
    out_BxLxNxD = ops.attention(
        q_BxLxNxD,
        k_BxLxNxD,
        v_BxLxNxD,
        segment_ids=segment_ids_BxL,
        mask=mask_Bx1x1xL,
        window=None if self.is_global else cfg.local_attention,
        dropout_rate=cfg.attention_dropout_rate,
        dropout_rng=dropout_rng,
        deterministic=self.deterministic,
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
  """One Transformer block: post-LayerNorm as in the original BERT, or pre-LayerNorm."""

  cfg: BertConfig
  deterministic: bool
  collect_hidden: bool = False  # under scan: also emit this layer's output as a scan output
  index: int = 0  # the layer's place in the stack (which layers are local, layer 0's norm)

  @nn.compact
  def __call__(
      self,
      x_BxLxH: Array,
      mask_Bx1x1xL: Array | None,
      segment_ids_BxL: Array | None,
      position_ids_BxL: Array | None = None,
  ):
    cfg = self.cfg
    dropout = ops.Dropout(cfg.hidden_dropout_rate)
    is_global = cfg.local_attention == 0 or self.index % cfg.global_every == 0
    attend = Attention(cfg, self.deterministic, is_global, name="attention")

    def attention(h_BxLxH):
      attn_BxLxH = attend(h_BxLxH, mask_Bx1x1xL, segment_ids_BxL, position_ids_BxL)
      return dropout(attn_BxLxH, deterministic=self.deterministic)

    def mlp(h_BxLxH):
      h_BxLxH = _mlp(cfg, h_BxLxH)
      return dropout(h_BxLxH, deterministic=self.deterministic)

    if cfg.norm_placement == "pre":  # ModernBERT: normalise each sublayer's input
      # Layer 0's input is the embeddings' LayerNorm output already: no attention norm there.
      h_BxLxH = x_BxLxH if self.index == 0 else _layer_norm(cfg, "attention_layer_norm")(x_BxLxH)
      x_BxLxH = x_BxLxH + attention(h_BxLxH)
      x_BxLxH = x_BxLxH + mlp(_layer_norm(cfg, "mlp_layer_norm")(x_BxLxH))
    else:  # BERT: normalise each residual sum
      x_BxLxH = _layer_norm(cfg, "attention_layer_norm")(x_BxLxH + attention(x_BxLxH))
      x_BxLxH = _layer_norm(cfg, "output_layer_norm")(x_BxLxH + mlp(x_BxLxH))
    x_BxLxH = _constrain(x_BxLxH, ("batch", "length", "act_embed"))
    return x_BxLxH, (x_BxLxH if self.collect_hidden else None)


def _mlp(cfg: BertConfig, x_BxLxH: Array) -> Array:
  """BERT's act(x W1) W2, or ModernBERT's GLU act(x W_in) * (x W_gate), then W_out; called
  inside `Layer.__call__`, so its layers are the layer's `intermediate` and `output` (a
  function, not a method: the profile's op names stay `layer_N/intermediate/...`)."""
  act = ACTIVATIONS[cfg.hidden_act]
  if cfg.mlp_type == "glu":
    h_BxLx2xF = Projection(
        cfg,
        "blh,hgf->blgf",
        (cfg.hidden_size, 2, cfg.intermediate_size),
        ("embed", "glu", "mlp"),
        name="intermediate",
    )(x_BxLxH)
    h_BxLxF = act(h_BxLx2xF[:, :, 0]) * h_BxLx2xF[:, :, 1]
  else:
    h_BxLxF = act(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x_BxLxH))
  h_BxLxF = _constrain(h_BxLxF, ("batch", "length", "act_mlp"))
  return dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h_BxLxF)


def _remat_policy(name: str):
  if name == "full":
    return None  # save nothing: recompute the whole layer in the backward pass
  if name == "dots":
    return jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
  raise ValueError(f"remat={name!r}")


class LayerStack(nn.Module):
  """The stack of layers: a Python loop (`layer_0`, `layer_1`, ...) or one `nn.scan` (`layers`).

  Both give the same function; `stack_layer_params` / `unstack_layer_params` convert the
  parameter trees. A scan needs identical layers, which `BertConfig` checks: ModernBERT's
  (layer 0 without an attention norm, local and global layers) run as the loop.
  """

  cfg: BertConfig

  @nn.compact
  def __call__(
      self,
      x_BxLxH: Array,
      mask_Bx1x1xL: Array | None,
      segment_ids_BxL: Array | None,
      position_ids_BxL: Array | None,
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
          in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"},
      )
      x_BxLxH, hidden_SxBxLxH = scanned(cfg, deterministic, output_hidden_states, name="layers")(
          x_BxLxH, mask_Bx1x1xL, segment_ids_BxL, position_ids_BxL
      )
      return x_BxLxH, (list(hidden_SxBxLxH) if output_hidden_states else [])
    hidden = []
    for i in range(cfg.num_layers):
      layer = layer_cls(cfg, deterministic, index=i, name=f"layer_{i}")
      x_BxLxH, _ = layer(x_BxLxH, mask_Bx1x1xL, segment_ids_BxL, position_ids_BxL)
      hidden.append(x_BxLxH)
    return x_BxLxH, (hidden if output_hidden_states else [])


@flax.struct.dataclass
class EncoderOutput:
  sequence_output: Array  # [B, L, H] last layer
  pooled_output: Array | None  # [B, H] tanh(dense([CLS])); [B, E, H] with cls_positions; None
  #                              when called with pool=False (ELECTRA pretraining has no pooler)
  hidden_states: tuple[Array, ...] = ()  # embeddings then each layer's [B, L, H], if requested;
  #                                         the last is sequence_output (pre-LN: final-normed)


def encoder_inputs(
    input_ids_BxL: Array,
    attention_mask_BxL: Array | None,
    segment_ids_BxL: Array | None,
    position_ids_BxL: Array | None,
) -> tuple[Array | None, Array]:
  """(attention mask [B, 1, 1, L] or None, position ids [B, L] or [1, L]) of one batch: padded
  rows are masked by `attention_mask`, packed rows by their segment ids (`ops.attention`), each
  packed example counting its positions from 0."""
  mask_Bx1x1xL = None
  if segment_ids_BxL is None:  # one example per row, padded
    if attention_mask_BxL is None:
      attention_mask_BxL = jnp.ones_like(input_ids_BxL)
    mask_Bx1x1xL = attention_mask_bias(attention_mask_BxL)
  elif position_ids_BxL is None:  # packed: each example counts from 0
    position_ids_BxL = packed_position_ids(segment_ids_BxL)
  if position_ids_BxL is None:
    position_ids_BxL = jnp.arange(input_ids_BxL.shape[1])[None, :]
  return mask_Bx1x1xL, position_ids_BxL


class BertModel(nn.Module):
  """The BERT encoder: embeddings, the layer stack (pre-LN: then a final LayerNorm) and the pooler.

  Packed rows (keyword-only, all optional): `segment_ids` [B, L] (int, 1..k for the examples in
  a row, 0 for padding; replaces `attention_mask` in attention), `position_ids` [B, L]
  (default: `packed_position_ids(segment_ids)` with segment ids, else 0..L-1) and
  `cls_positions` [B, E] (each example's [CLS] index; -1 for an absent example, which reads
  position 0: the loss masks it). Without them the model is BERT on one example per row.

  Factorised embeddings (`cfg.embedding_size`, ELECTRA): the embeddings are E wide and
  `embeddings_project` maps them to H. `embedded_BxLxE` hands in embeddings computed elsewhere
  (ELECTRA's generator reads the discriminator's tables, `electra.py`): this encoder then has
  no tables of its own. `pool=False` skips the pooler, which ELECTRA pretraining does not train.
  """

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.embeddings = Embeddings(cfg)
    if cfg.factorised_embeddings:  # ELECTRA: E -> H
      self.embeddings_project = dense(cfg, cfg.hidden_size, ("embed", "embed_out"))
    self.encoder = LayerStack(cfg)
    if cfg.norm_placement == "pre":  # the residual stream is never normalised inside the stack
      self.final_layer_norm = _layer_norm(cfg, "final_layer_norm")
    self.pooler = dense(cfg, cfg.hidden_size, ("embed", "embed_out"), use_bias=True)

  def embed(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      segment_ids: Array | None = None,
      position_ids: Array | None = None,
      deterministic: bool = True,
  ) -> Array:
    """The input embeddings [B, L, E] of a batch, before any projection: what `__call__` reads
    first, and what ELECTRA's generator reads of the discriminator (`embedded_BxLxE`)."""
    if token_type_ids_BxL is None:
      token_type_ids_BxL = jnp.zeros_like(input_ids_BxL)
    _, position_ids_BxL = encoder_inputs(
        input_ids_BxL, attention_mask_BxL, segment_ids, position_ids
    )
    return self.embeddings(input_ids_BxL, token_type_ids_BxL, deterministic, position_ids_BxL)

  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      segment_ids: Array | None = None,
      position_ids: Array | None = None,
      cls_positions: Array | None = None,
      deterministic: bool = True,
      output_hidden_states: bool = False,
      embedded_BxLxE: Array | None = None,
      pool: bool = True,
  ) -> EncoderOutput:
    segment_ids_BxL, cls_positions_BxE = segment_ids, cls_positions
    mask_Bx1x1xL, position_ids_BxL = encoder_inputs(
        input_ids_BxL, attention_mask_BxL, segment_ids_BxL, position_ids
    )
    emb_BxLxE = embedded_BxLxE
    if emb_BxLxE is None:
      emb_BxLxE = self.embed(
          input_ids_BxL,
          token_type_ids_BxL,
          attention_mask_BxL,
          segment_ids=segment_ids_BxL,
          position_ids=position_ids,
          deterministic=deterministic,
      )
    emb_BxLxH = emb_BxLxE
    if self.cfg.factorised_embeddings:
      emb_BxLxH = _constrain(self.embeddings_project(emb_BxLxE), ("batch", "length", "act_embed"))
    x_BxLxH, hidden = self.encoder(
        emb_BxLxH,
        mask_Bx1x1xL,
        segment_ids_BxL,
        position_ids_BxL,
        deterministic,
        output_hidden_states,
    )
    if self.cfg.norm_placement == "pre":
      x_BxLxH = self.final_layer_norm(x_BxLxH)
      hidden = hidden[:-1] + [x_BxLxH] if hidden else hidden  # as transformers reports them
    pooled_BxH = None
    if pool:
      if cls_positions_BxE is None:
        cls_BxH = x_BxLxH[:, 0]
      else:  # each packed example's own [CLS]
        cls_BxH = gather_positions(x_BxLxH, jnp.maximum(cls_positions_BxE, 0))
      pooled_BxH = jnp.tanh(self.pooler(cls_BxH))
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
  nsp_logits: Array  # [B, 2] float32 (IsNext = 0, NotNext = 1; SOP uses the same head);
  #                    [B, E, 2] with cls_positions, one pair per packed example
  sequence_output: Array  # [B, L, H]
  pooled_output: Array  # [B, H]; [B, E, H] with cls_positions

  @property
  def mlm_logits(self) -> Array:
    """[B, P, V] float32 logits of the tied decoder."""
    logits_BxPxV = jnp.dot(self.mlm_hidden, self.mlm_table.T).astype(jnp.float32)
    return logits_BxPxV + self.mlm_bias.astype(jnp.float32)


def gather_positions(x_BxLxH: Array, positions_BxP: Array) -> Array:
  """x[b, positions[b, p]] for every b, p: the rows the MLM head scores."""
  return jnp.take_along_axis(x_BxLxH, positions_BxP[:, :, None].astype(jnp.int32), axis=1)


class BertForPreTraining(nn.Module):
  """BERT with the MLM head (tied decoder, scored only at masked positions) and the NSP head.

  Packed rows take `BertModel`'s keyword arguments (`segment_ids`, `position_ids`,
  `cls_positions`); `masked_positions` are row positions either way.
  """

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.bert = BertModel(cfg)
    # H -> E: to the tied decoder's width (H, unless the embeddings are factorised)
    self.mlm_transform = dense(cfg, cfg.embedding_width, ("embed", "embed_out"))
    self.mlm_layer_norm = _layer_norm(cfg, "mlm_layer_norm")
    self.mlm_bias = self.param("mlm_bias", _zeros(("vocab",)), (cfg.vocab_size,), cfg.params_dtype)
    self.nsp = dense(cfg, 2, ("embed", "classes"), use_bias=True)

  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      masked_positions_BxP: Array | None = None,
      *,
      segment_ids: Array | None = None,
      position_ids: Array | None = None,
      cls_positions: Array | None = None,
      deterministic: bool = True,
  ) -> PretrainingOutput:
    enc = self.bert(
        input_ids_BxL,
        token_type_ids_BxL,
        attention_mask_BxL,
        segment_ids=segment_ids,
        position_ids=position_ids,
        cls_positions=cls_positions,
        deterministic=deterministic,
    )
    x_BxLxH = enc.sequence_output
    # Score the vocabulary only where a token was masked: at seq 128 with 20 predictions this
    # skips ~85% of the decoder's FLOPs, the largest single cost of a small model.
    x_BxPxH = (
        x_BxLxH if masked_positions_BxP is None else gather_positions(x_BxLxH, masked_positions_BxP)
    )
    x_BxPxH = ACTIVATIONS[self.cfg.hidden_act](self.mlm_transform(x_BxPxH))
    x_BxPxH = self.mlm_layer_norm(x_BxPxH)
    # Batch-sharded like every block boundary. Besides, without it XLA's SPMD partitioner
    # (jax 0.10.2, Shardy and GSPMD alike) computes a wrong gradient of this head on a
    # data x fsdp x tensor mesh with all three axes > 1 when B·P is about 1-3x the hidden
    # size (tests/test_sharding.py compares the gradient with a data-parallel mesh).
    x_BxPxH = _constrain(x_BxPxH, ("batch", "masked", "act_embed"))
    table_VxH = self.bert.embeddings.word_embeddings.embedding.astype(x_BxPxH.dtype)
    return PretrainingOutput(
        mlm_hidden=x_BxPxH,
        mlm_table=table_VxH,
        mlm_bias=self.mlm_bias,
        nsp_logits=self.nsp(enc.pooled_output).astype(jnp.float32),
        sequence_output=x_BxLxH,
        pooled_output=enc.pooled_output,
    )
