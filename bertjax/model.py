"""BERT (Devlin et al. 2018) as a functional Flax linen encoder with logical sharding axes.

Shape letters used in array names throughout:
  B batch, L sequence length, H hidden size, N attention heads, D head size (H / N),
  F intermediate (MLP) size, P masked positions per sequence, V vocabulary, C classes.

Every parameter carries logical axis names (``nn.with_logical_partitioning``); activations are
constrained at block boundaries with ``nn.with_logical_constraint``. Which mesh axis a logical
axis lands on is decided in one table, ``bertjax.training.sharding.LOGICAL_AXIS_RULES``; no mesh axis
name appears in this file. Without a mesh the constraints are no-ops, so the model also runs
plainly on one device. The module imports only JAX, Flax and NumPy (no TensorFlow).

Logical axes: 'vocab', 'embed' (hidden), 'pos' (positions table), 'type' (segment table),
'qkv' (the fused query/key/value axis, size 3), 'heads', 'kv' (head size), 'mlp', 'layers'
(the stacked axis under ``scan_layers``), 'classes', and for activations 'batch', 'length',
'act_embed', 'act_heads', 'act_mlp', 'masked'.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.training import losses

Array = jax.Array
Dtype = Any

# name -> (num_layers, hidden_size, num_heads); intermediate is 4 * hidden as in BERT.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def gelu_erf(x: Array) -> Array:
  """Exact GELU as BERT and PyTorch write it, x/2 * (1 + erf(x/sqrt(2))).

  The same function as `jax.nn.gelu(approximate=False)`, which evaluates it through erfc for
  accuracy far in the negative tail (absolute differences there are below 1e-6); XLA's erf is
  a cheaper rational approximation than its erfc, which matters on CPU (~3% of a BERT-mini
  training step).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * (2.0 ** -0.5)).astype(x.dtype))


_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": gelu_erf,  # exact erf GELU, as BERT
    "gelu_new": functools.partial(nn.gelu, approximate=True),  # tanh approximation
    "relu": nn.relu,
}

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture and numerics of one BERT model. Defaults are BERT-base."""

  vocab_size: int = 30522  # WordPiece vocabulary of the released English models
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072  # 4 * hidden_size
  max_position_embeddings: int = 512  # learned absolute positions
  type_vocab_size: int = 2  # segment A / segment B
  hidden_act: str = "gelu"  # exact erf GELU; see _ACTIVATIONS for the alternatives
  hidden_dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1  # > 0 in training uses the einsum path (see Attention)
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02  # std of the normal, truncated at ±2 std, as BERT
  dtype: str = "float32"  # compute dtype: "bfloat16" for mixed precision
  param_dtype: str = "float32"  # parameters (and optimizer state) stay in float32
  remat: str = "none"  # "none" | "full" | "dots" (save matmul outputs): activation memory vs FLOPs
  scan_layers: bool = False  # stack layers under nn.scan: one compiled layer, fast compile
  # Attention computed as this many independent slices of the batch (see `over_batch_chunks`);
  # 0 picks 2 on XLA's CPU backend and 1 elsewhere. The same function for every value.
  attention_batch_chunks: int = 0

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
                       f"num_heads={self.num_heads}")
    if self.hidden_act not in _ACTIVATIONS:
      raise ValueError(f"BertConfig: hidden_act={self.hidden_act!r}; valid: {sorted(_ACTIVATIONS)}")
    for field in ("dtype", "param_dtype"):
      if getattr(self, field) not in _DTYPES:
        raise ValueError(f"BertConfig: {field}={getattr(self, field)!r}; valid: {sorted(_DTYPES)}")
    if self.remat not in ("none", "full", "dots"):
      raise ValueError(f"BertConfig: remat={self.remat!r}; valid: 'none', 'full', 'dots'")
    if self.attention_batch_chunks < 0:
      raise ValueError(f"BertConfig: attention_batch_chunks={self.attention_batch_chunks}; "
                       "valid: 0 (automatic) or a positive count")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> Dtype:
    return _DTYPES[self.dtype]

  @property
  def params_dtype(self) -> Dtype:
    return _DTYPES[self.param_dtype]

  def replace(self, **changes) -> "BertConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "BertConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"BertConfig: unknown fields {unknown}; valid: {sorted(known)}")
    return cls(**d)

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "BertConfig":
    if name not in PRESETS:
      raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    layers, hidden, heads = PRESETS[name]
    base = dict(num_layers=layers, hidden_size=hidden, num_heads=heads,
                intermediate_size=4 * hidden)
    base.update(overrides)
    return cls(**base)


def from_preset(name: str, **overrides) -> BertConfig:
  """`BertConfig.from_preset`: e.g. ``from_preset("tiny", vocab_size=8000)``."""
  return BertConfig.from_preset(name, **overrides)


def _init(cfg: BertConfig, names: tuple[str | None, ...]):
  # BERT's tf.truncated_normal_initializer: N(0, range²) redrawn outside ±2·range (so the
  # drawn values' std is 0.88·range); jax's truncated_normal is the same distribution.
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range, lower=-2.0, upper=2.0), names)


def _zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                      param_dtype=cfg.params_dtype, scale_init=_ones(("embed",)),
                      bias_init=_zeros(("embed",)), name=name)


def flat_dot_general(lhs: Array, rhs: Array, dimension_numbers, precision=None,
                     preferred_element_type=None) -> Array:
  """`nn.Dense`'s product with the input's leading axes merged first: [B, L, H] -> [B·L, H].

  The same function as `lax.dot_general` on the rank-3 input. The difference is the weight
  gradient: autodiff of the rank-3 product contracts two axes (batch and length), which XLA's
  CPU backend lowers as a transposed copy of the output gradient ([F, B·L], written every step)
  followed by a product of two transposed operands; from the rank-2 product it is a plain
  [B·L, H]^T [B·L, F] product with no copy: 4-6% of a BERT-mini and 3-5% of a BERT-base
  training step on 2 CPU cores. Merging leading axes is a bitcast in XLA's row-major layouts,
  and the batch axis stays the major one, so its sharding carries over.
  """
  (lhs_contract, rhs_contract), batch_dims = dimension_numbers
  if (lhs.ndim <= 2 or lhs_contract != (lhs.ndim - 1,) or rhs_contract != (0,)
      or any(batch_dims)):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  out = jax.lax.dot_general(lhs.reshape(-1, lhs.shape[-1]), rhs, (((1,), (0,)), ((), ())),
                            precision=precision, preferred_element_type=preferred_element_type)
  return out.reshape(lhs.shape[:-1] + rhs.shape[1:])


def _dense(cfg: BertConfig, features: int, axes: tuple[str, str], name: str | None = None):
  """BERT's dense layer: `nn.Dense` with logical axes (kernel `axes`, bias `axes[1]`)."""
  return nn.Dense(features, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                  kernel_init=_init(cfg, axes), bias_init=_zeros((axes[1],)),
                  dot_general=flat_dot_general, name=name)


def _constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
  """Threefry-2x32, 20 rounds (Salmon et al. 2011), written out round by round.

  The same function as JAX's `threefry2x32` primitive, which on CPU is lowered as a rolled
  5-iteration loop; XLA's CPU backend then writes both words to memory after every iteration.
  Written out, the whole hash is one elementwise fusion that stays in registers.
  """
  rotl = lambda v, r: jax.lax.shift_left(v, np.uint32(r)) | jax.lax.shift_right_logical(
      v, np.uint32(32 - r))
  ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for i in range(5):
    for r in _THREEFRY_ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = x0 ^ rotl(x1, r)
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x0, x1


def random_bits(key: Array, shape: tuple[int, ...]) -> Array:
  """`jax.random.bits(key, shape, uint32)`, bit for bit, with the hash unrolled on every backend.

  Applies to threefry keys (typed or raw) under `jax_threefry_partitionable` (JAX's default),
  where element i is the xor of the two output words of threefry(key, (i >> 32, i & 0xFFFFFFFF));
  other key implementations, and arrays of 2**32 elements or more, go to `jax.random.bits`.
  """
  size = math.prod(shape)
  if (str(jax.random.key_impl(key)) != "threefry2x32" or not jax.config.jax_threefry_partitionable
      or size >= 2**32 or len(shape) == 0):
    return jax.random.bits(key, shape, jnp.uint32)
  words = jax.random.key_data(key)
  counts = jax.lax.iota(jnp.uint32, size).reshape(shape)
  y0, y1 = _threefry2x32(words[0], words[1], jnp.zeros_like(counts), counts)
  return y0 ^ y1


class Dropout(nn.Module):
  """Inverted dropout that draws 16 random bits per element instead of 32.

  Same contract as `nn.Dropout` (RNG stream 'dropout', identity when deterministic), but each
  uint32 decides two elements, from its low and high halves, and the bits come from
  `random_bits` (threefry written out; JAX's rolled CPU lowering took twice as long). With
  flax's `nn.Dropout`, dropout was about 6% of a BERT-base training step on CPU (BERT applies it
  at four places per layer), most of it generating the random bits. The keep probability is
  quantised to 1/65536 (0.9 -> 0.899994) and the scale uses the exact value, so the layer stays
  unbiased.
  """

  rate: float

  def keep_mask(self, shape: tuple[int, ...]) -> tuple[Array, float]:
    """Draw which elements of an array of `shape` survive, and the scale for the survivors.

    `__call__` is `where(keep, x * scale, 0)`; attention draws the mask of the whole batch
    here and applies it slice by slice, so the result does not depend on the slicing.
    """
    threshold = max(1, min(65536, round((1.0 - self.rate) * 65536)))
    n = shape[-1]
    bits = random_bits(self.make_rng("dropout"), tuple(shape[:-1]) + ((n + 1) // 2,))
    keep = jnp.concatenate([(bits & 0xFFFF) < threshold, (bits >> 16) < threshold],
                           axis=-1)[..., :n]
    return keep, 65536.0 / threshold

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    keep, scale = self.keep_mask(x.shape)
    return jnp.where(keep, x * scale, 0.0).astype(x.dtype)


class Embeddings(nn.Module):
  """Word + learned position + segment embeddings, then LayerNorm and dropout."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.word_embeddings = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype,
                                    param_dtype=cfg.params_dtype,
                                    embedding_init=_init(cfg, ("vocab", "embed")))
    self.position_embeddings = nn.Embed(cfg.max_position_embeddings, cfg.hidden_size,
                                        dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                                        embedding_init=_init(cfg, ("pos", "embed")))
    self.token_type_embeddings = nn.Embed(cfg.type_vocab_size, cfg.hidden_size,
                                          dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                                          embedding_init=_init(cfg, ("type", "embed")))
    self.layer_norm = _layer_norm(cfg, "layer_norm")
    self.dropout = Dropout(cfg.hidden_dropout_rate)

  def __call__(self, input_ids_BxL: Array, token_type_ids_BxL: Array, deterministic: bool) -> Array:
    seq_len = input_ids_BxL.shape[1]
    if seq_len > self.cfg.max_position_embeddings:
      raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings="
                       f"{self.cfg.max_position_embeddings}")
    positions_1xL = jnp.arange(seq_len)[None, :]
    x_BxLxH = (self.word_embeddings(input_ids_BxL) + self.position_embeddings(positions_1xL)
               + self.token_type_embeddings(token_type_ids_BxL))
    x_BxLxH = self.layer_norm(x_BxLxH)
    x_BxLxH = self.dropout(x_BxLxH, deterministic=deterministic)
    return _constrain(x_BxLxH, ("batch", "length", "act_embed"))

  def attend(self, x_BxPxH: Array) -> Array:
    """Logits against the word-embedding table (the MLM decoder is tied to it)."""
    return self.word_embeddings.attend(x_BxPxH)


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
    kernel = self.param("kernel", _init(cfg, self.kernel_axes), self.kernel_shape,
                        cfg.params_dtype)
    bias = self.param("bias", _zeros(bias_axes), bias_shape, cfg.params_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.compute_dtype)
    return jnp.einsum(self.equation, x, kernel) + bias


class Attention(nn.Module):
  """Multi-head self-attention with a fused QKV projection.

  Deterministic calls (eval, and training with attention_dropout_rate == 0) go through
  `jax.nn.dot_product_attention`, which XLA lowers to cuDNN fused attention on GPUs.
  Training with attention-probability dropout (BERT's 0.1) needs the probabilities, so it
  uses the explicit einsum/softmax path; both paths compute the same function. Either runs
  over `attention_chunks(cfg, batch)` slices of the batch (`over_batch_chunks`).
  """

  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxH: Array, mask_Bx1x1xL: Array) -> Array:
    cfg = self.cfg
    qkv_BxLx3xNxD = Projection(cfg, "blh,hcnd->blcnd",
                               (cfg.hidden_size, 3, cfg.num_heads, cfg.head_dim),
                               ("embed", "qkv", "heads", "kv"), name="qkv")(x_BxLxH)
    q_BxLxNxD, k_BxLxNxD, v_BxLxNxD = (qkv_BxLx3xNxD[:, :, i] for i in range(3))
    batch, length = x_BxLxH.shape[:2]
    chunks = attention_chunks(cfg, batch)
    use_dropout = not self.deterministic and cfg.attention_dropout_rate > 0.0
    if use_dropout:
      # One mask for the whole batch, drawn before slicing: the same numbers for any `chunks`.
      keep_BxNxLxL, scale = Dropout(cfg.attention_dropout_rate).keep_mask(
          (batch, cfg.num_heads, length, length))
      attend = lambda q, k, v, m, keep: einsum_attention(q, k, v, m, keep, scale)
      out_BxLxNxD = over_batch_chunks(attend, chunks, q_BxLxNxD, k_BxLxNxD, v_BxLxNxD,
                                      mask_Bx1x1xL, keep_BxNxLxL)
    else:
      attend = lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m)
      out_BxLxNxD = over_batch_chunks(attend, chunks, q_BxLxNxD, k_BxLxNxD, v_BxLxNxD,
                                      mask_Bx1x1xL)
    out_BxLxNxD = _constrain(out_BxLxNxD, ("batch", "length", "act_heads", "kv"))
    return Projection(cfg, "blnd,ndh->blh", (cfg.num_heads, cfg.head_dim, cfg.hidden_size),
                      ("heads", "kv", "embed"), name="out")(out_BxLxNxD)


def attention_chunks(cfg: BertConfig, batch: int) -> int:
  """How many batch slices attention runs as: `cfg.attention_batch_chunks`, where 0 means 2 on
  XLA's CPU backend and 1 elsewhere; 1 when the count does not divide `batch`."""
  chunks = cfg.attention_batch_chunks or (2 if jax.default_backend() == "cpu" else 1)
  return chunks if batch % chunks == 0 else 1


def over_batch_chunks(fn: Callable[..., Array], chunks: int, *arrays_B: Array) -> Array:
  """`fn(*arrays_B)` for a `fn` that treats batch rows independently, computed as `chunks`
  independent calls on interleaved slices (rows i, i + chunks, i + 2·chunks, ...).

  Why: XLA's CPU runtime runs each batched matmul of attention (B·N products of L×L×D) on one
  thread, while the dense layers use every core. Independent slices give the scheduler
  independent products to run side by side; on 2 CPU cores this takes 3-4% off a BERT-mini
  training step and up to 2% off BERT-base. Interleaved rather than contiguous slices keep each
  device's rows on that device when the batch is sharded (when every device's share of the batch
  is a multiple of `chunks`), so slicing moves no data between devices.
  """
  if chunks == 1:
    return fn(*arrays_B)
  batch = arrays_B[0].shape[0]
  split = [a.reshape((batch // chunks, chunks) + a.shape[1:]) for a in arrays_B]
  outs = [fn(*(a[:, i] for a in split)) for i in range(chunks)]
  out = jnp.stack(outs, axis=1)
  return out.reshape((batch,) + out.shape[2:])


def einsum_attention(q_BxLxNxD: Array, k_BxLxNxD: Array, v_BxLxNxD: Array, mask_Bx1x1xL: Array,
                     keep_BxNxLxL: Array | None = None, keep_scale: float = 1.0) -> Array:
  """Plain softmax attention; the reference that `jax.nn.dot_product_attention` must match.

  With `keep_BxNxLxL` (from `Dropout.keep_mask`), dropout on the attention probabilities:
  dropped entries are zeroed and the kept ones multiplied by `keep_scale`.
  """
  scale = q_BxLxNxD.shape[-1] ** -0.5
  logits_BxNxLxL = jnp.einsum("bqnd,bknd->bnqk", q_BxLxNxD, k_BxLxNxD).astype(jnp.float32) * scale
  big_neg = jnp.finfo(jnp.float32).min
  logits_BxNxLxL = jnp.where(mask_Bx1x1xL, logits_BxNxLxL, big_neg)
  probs_BxNxLxL = jax.nn.softmax(logits_BxNxLxL, axis=-1).astype(v_BxLxNxD.dtype)
  if keep_BxNxLxL is not None:
    probs_BxNxLxL = jnp.where(keep_BxNxLxL, probs_BxNxLxL * keep_scale, 0.0).astype(
        v_BxLxNxD.dtype)
  return jnp.einsum("bnqk,bknd->bqnd", probs_BxNxLxL, v_BxLxNxD)


class Layer(nn.Module):
  """One post-LayerNorm Transformer block, as in the original BERT."""

  cfg: BertConfig
  deterministic: bool
  collect_hidden: bool = False  # under scan: also emit this layer's output as a scan output

  @nn.compact
  def __call__(self, x_BxLxH: Array, mask_Bx1x1xL: Array):
    cfg = self.cfg
    dropout = Dropout(cfg.hidden_dropout_rate)
    attn_BxLxH = Attention(cfg, self.deterministic, name="attention")(x_BxLxH, mask_Bx1x1xL)
    attn_BxLxH = dropout(attn_BxLxH, deterministic=self.deterministic)
    x_BxLxH = _layer_norm(cfg, "attention_layer_norm")(x_BxLxH + attn_BxLxH)

    h_BxLxF = _dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x_BxLxH)
    h_BxLxF = _ACTIVATIONS[cfg.hidden_act](h_BxLxF)
    h_BxLxF = _constrain(h_BxLxF, ("batch", "length", "act_mlp"))
    h_BxLxH = _dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h_BxLxF)
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


class Encoder(nn.Module):
  """The stack of layers: a Python loop (`layer_0`, `layer_1`, ...) or one `nn.scan` (`layers`).

  Both give the same function; `stack_layer_params` / `unstack_layer_params` convert the
  parameter trees.
  """

  cfg: BertConfig

  @nn.compact
  def __call__(self, x_BxLxH: Array, mask_Bx1x1xL: Array, deterministic: bool,
               output_hidden_states: bool = False) -> tuple[Array, list[Array]]:
    cfg = self.cfg
    layer_cls = Layer
    if cfg.remat != "none":
      layer_cls = nn.remat(Layer, policy=_remat_policy(cfg.remat), prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={"params": 0},
                        split_rngs={"params": True, "dropout": True},
                        in_axes=nn.broadcast, length=cfg.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      x_BxLxH, hidden_SxBxLxH = scanned(cfg, deterministic, output_hidden_states,
                                        name="layers")(x_BxLxH, mask_Bx1x1xL)
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
    self.encoder = Encoder(cfg)
    self.pooler = _dense(cfg, cfg.hidden_size, ("embed", "embed_out"))

  def __call__(self, input_ids_BxL: Array, token_type_ids_BxL: Array | None = None,
               attention_mask_BxL: Array | None = None, *, deterministic: bool = True,
               output_hidden_states: bool = False) -> EncoderOutput:
    if token_type_ids_BxL is None:
      token_type_ids_BxL = jnp.zeros_like(input_ids_BxL)
    if attention_mask_BxL is None:
      attention_mask_BxL = jnp.ones_like(input_ids_BxL)
    emb_BxLxH = self.embeddings(input_ids_BxL, token_type_ids_BxL, deterministic)
    x_BxLxH, hidden = self.encoder(emb_BxLxH, attention_mask_bias(attention_mask_BxL),
                                   deterministic, output_hidden_states)
    pooled_BxH = jnp.tanh(self.pooler(x_BxLxH[:, 0]))
    hidden_states = tuple([emb_BxLxH] + hidden) if output_hidden_states else ()
    return EncoderOutput(sequence_output=x_BxLxH, pooled_output=pooled_BxH,
                         hidden_states=hidden_states)


@flax.struct.dataclass
class PretrainingOutput:
  mlm_logits: Array | None  # [B, P, V] float32, at masked_positions; None when given masked_ids
  nsp_logits: Array  # [B, 2] float32 (IsNext = 0, NotNext = 1; SOP uses the same head)
  sequence_output: Array  # [B, L, H]
  pooled_output: Array  # [B, H]
  mlm_nll: Array | None = None  # [B, P] float32 MLM loss per position, only given masked_ids
  mlm_correct: Array | None = None  # [B, P] float32 1.0 where the top logit is the label


def gather_positions(x_BxLxH: Array, positions_BxP: Array) -> Array:
  """x[b, positions[b, p]] for every b, p: the rows the MLM head scores."""
  return jnp.take_along_axis(x_BxLxH, positions_BxP[:, :, None].astype(jnp.int32), axis=1)


class BertForPreTraining(nn.Module):
  """BERT with the MLM head (tied decoder, scored only at masked positions) and the NSP head."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    self.bert = BertModel(cfg)
    self.mlm_transform = _dense(cfg, cfg.hidden_size, ("embed", "embed_out"))
    self.mlm_layer_norm = _layer_norm(cfg, "mlm_layer_norm")
    self.mlm_bias = self.param("mlm_bias", _zeros(("vocab",)), (cfg.vocab_size,),
                               cfg.params_dtype)
    self.nsp = _dense(cfg, 2, ("embed", "classes"))

  def __call__(self, input_ids_BxL: Array, token_type_ids_BxL: Array | None = None,
               attention_mask_BxL: Array | None = None, masked_positions_BxP: Array | None = None,
               masked_ids_BxP: Array | None = None, *,
               deterministic: bool = True) -> PretrainingOutput:
    """With `masked_ids_BxP` (the labels) the MLM loss is computed fused with the decoder
    (`losses.mlm_cross_entropy`): `mlm_nll` / `mlm_correct` are set and `mlm_logits` is None;
    this is what training and evaluation use. Without it, `mlm_logits` are returned."""
    enc = self.bert(input_ids_BxL, token_type_ids_BxL, attention_mask_BxL,
                    deterministic=deterministic)
    x_BxLxH = enc.sequence_output
    # Score the vocabulary only where a token was masked: at seq 128 with 20 predictions this
    # skips ~85% of the decoder's FLOPs, the largest single cost of a small model.
    x_BxPxH = x_BxLxH if masked_positions_BxP is None else gather_positions(
        x_BxLxH, masked_positions_BxP)
    x_BxPxH = _ACTIVATIONS[self.cfg.hidden_act](self.mlm_transform(x_BxPxH))
    x_BxPxH = self.mlm_layer_norm(x_BxPxH)
    nsp_Bx2 = self.nsp(enc.pooled_output).astype(jnp.float32)
    if masked_ids_BxP is not None:
      table_VxH = self.bert.embeddings.word_embeddings.embedding.astype(x_BxPxH.dtype)
      nll_BxP, correct_BxP = losses.mlm_cross_entropy(x_BxPxH, table_VxH, self.mlm_bias,
                                                      masked_ids_BxP)
      return PretrainingOutput(mlm_logits=None, nsp_logits=nsp_Bx2, sequence_output=x_BxLxH,
                               pooled_output=enc.pooled_output, mlm_nll=nll_BxP,
                               mlm_correct=correct_BxP)
    logits_BxPxV = self.bert.embeddings.attend(x_BxPxH).astype(jnp.float32)
    logits_BxPxV = logits_BxPxV + self.mlm_bias.astype(jnp.float32)
    return PretrainingOutput(mlm_logits=logits_BxPxV, nsp_logits=nsp_Bx2,
                             sequence_output=x_BxLxH, pooled_output=enc.pooled_output)


def _head(cfg: BertConfig, num_outputs: int, name: str) -> nn.Dense:
  """A task head's dense layer from the hidden size to `num_outputs` logits (new on restore)."""
  return _dense(cfg, num_outputs, ("embed", "classes"), name)


class BertForSequenceClassification(nn.Module):
  """The GLUE head: dropout + dense on the pooled [CLS]; num_labels == 1 is regression."""

  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids_BxL: Array, token_type_ids_BxL: Array | None = None,
               attention_mask_BxL: Array | None = None, *, deterministic: bool = True) -> Array:
    enc = BertModel(self.cfg, name="bert")(input_ids_BxL, token_type_ids_BxL, attention_mask_BxL,
                                           deterministic=deterministic)
    x_BxH = Dropout(self.cfg.hidden_dropout_rate)(enc.pooled_output, deterministic=deterministic)
    logits_BxC = _head(self.cfg, self.num_labels, "classifier")(x_BxH)
    return logits_BxC.astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
  """google-research/bert's SQuAD head: one dense layer from each token to (start, end)."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, input_ids_BxL: Array, token_type_ids_BxL: Array | None = None,
               attention_mask_BxL: Array | None = None, *,
               deterministic: bool = True) -> tuple[Array, Array]:
    enc = BertModel(self.cfg, name="bert")(input_ids_BxL, token_type_ids_BxL, attention_mask_BxL,
                                           deterministic=deterministic)
    logits_BxLx2 = _head(self.cfg, 2, "qa_outputs")(enc.sequence_output)
    logits_BxLx2 = logits_BxLx2.astype(jnp.float32)
    return logits_BxLx2[..., 0], logits_BxLx2[..., 1]


class BertForTokenClassification(nn.Module):
  """The NER head: dropout + dense from each token's last hidden state to `num_labels` tags."""

  cfg: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids_BxL: Array, token_type_ids_BxL: Array | None = None,
               attention_mask_BxL: Array | None = None, *, deterministic: bool = True) -> Array:
    enc = BertModel(self.cfg, name="bert")(input_ids_BxL, token_type_ids_BxL, attention_mask_BxL,
                                           deterministic=deterministic)
    x_BxLxH = Dropout(self.cfg.hidden_dropout_rate)(enc.sequence_output,
                                                    deterministic=deterministic)
    logits_BxLxC = _head(self.cfg, self.num_labels, "classifier")(x_BxLxH)
    return logits_BxLxC.astype(jnp.float32)


# ----------------------------------------------------------------------------- parameter trees


def _is_layer_key(k: str) -> bool:
  return k.startswith("layer_") and k[len("layer_"):].isdigit()


def stack_layer_params(params: dict, num_layers: int) -> dict:
  """Convert a tree with `encoder/layer_{i}` subtrees into the `scan_layers` layout."""
  def walk(tree):
    if not isinstance(tree, dict):
      return tree
    if "layer_0" in tree and all(_is_layer_key(k) for k in tree):
      layers = [tree[f"layer_{i}"] for i in range(num_layers)]
      return {"layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}
    return {k: walk(v) for k, v in tree.items()}
  return walk(nn.unbox(params) if _has_boxes(params) else params)


def unstack_layer_params(params: dict) -> dict:
  """Inverse of `stack_layer_params`: `encoder/layers` (leading layer axis) -> `layer_{i}`."""
  def walk(tree):
    if not isinstance(tree, dict):
      return tree
    if set(tree) == {"layers"} and isinstance(tree["layers"], dict):
      leaves = jax.tree.leaves(tree["layers"])
      n = leaves[0].shape[0]
      return {f"layer_{i}": jax.tree.map(lambda x: x[i], tree["layers"]) for i in range(n)}
    return {k: walk(v) for k, v in tree.items()}
  return walk(nn.unbox(params) if _has_boxes(params) else params)


def _has_boxes(tree) -> bool:
  return any(isinstance(x, nn.Partitioned)
             for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nn.Partitioned)))


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(nn.unbox(params)))


def dummy_inputs(batch: int = 1, seq_len: int = 8, num_masked: int = 2) -> dict[str, Array]:
  """Zero inputs of the right shapes, for `init` and `jax.eval_shape`."""
  z = jnp.zeros((batch, seq_len), jnp.int32)
  return dict(input_ids=z, token_type_ids=z, attention_mask=jnp.ones_like(z),
              masked_positions=jnp.zeros((batch, num_masked), jnp.int32))
