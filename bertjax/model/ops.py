"""The backend-specific kernels of the BERT network, behind the names `bert.py` calls.

Each is the same function as its plain JAX counterpart (tests compare them bit for bit or to
float rounding); what differs is how XLA lowers it, measured on 2 CPU cores:

  flat_dot_general  `nn.Dense`'s product with the leading axes merged (the `dot_general` hook
                    of every dense layer): 4-6% of a BERT-mini training step
  Dropout           16 random bits per element from an unrolled threefry (`random_bits`):
                    flax's `nn.Dropout` was ~6% of a BERT-base step
  attention         the one attention hook: masks (padding, packed examples' segment ids, a
                    local window) and attention dropout go in, the backend's kernel comes out:
                    XLA over two interleaved batch slices on CPU (3-4% of a BERT-mini step),
                    cuDNN flash attention on GPUs, Pallas splash attention on TPUs
  gelu_erf          exact GELU through erf rather than erfc: ~3% of a BERT-mini step

The first, second and fourth lower to the same programs as the plain versions on TPUs and GPUs,
so they are CPU-only in motivation, not in effect; `attention` is where the backends differ.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

Array = jax.Array


def gelu_erf(x: Array) -> Array:
  """Exact GELU as BERT and PyTorch write it, x/2 * (1 + erf(x/sqrt(2))).

  The same function as `jax.nn.gelu(approximate=False)`, which evaluates it through erfc for
  accuracy far in the negative tail (absolute differences there are below 1e-6); XLA's erf is
  a cheaper rational approximation than its erfc, which matters on CPU (~3% of a BERT-mini
  training step).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * (2.0**-0.5)).astype(x.dtype))


def flat_dot_general(
    lhs: Array, rhs: Array, dimension_numbers, precision=None, preferred_element_type=None
) -> Array:
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
  if lhs.ndim <= 2 or lhs_contract != (lhs.ndim - 1,) or rhs_contract != (0,) or any(batch_dims):
    return jax.lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
  out = jax.lax.dot_general(
      lhs.reshape(-1, lhs.shape[-1]),
      rhs,
      (((1,), (0,)), ((), ())),
      precision=precision,
      preferred_element_type=preferred_element_type,
  )
  return out.reshape(lhs.shape[:-1] + rhs.shape[1:])


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
  """Threefry-2x32, 20 rounds (Salmon et al. 2011), written out round by round.

  The same function as JAX's `threefry2x32` primitive, which on CPU is lowered as a rolled
  5-iteration loop; XLA's CPU backend then writes both words to memory after every iteration.
  Written out, the whole hash is one elementwise fusion that stays in registers.
  """
  rotl = lambda v, r: jax.lax.shift_left(v, np.uint32(r)) | jax.lax.shift_right_logical(
      v, np.uint32(32 - r)
  )
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
  if (
      str(jax.random.key_impl(key)) != "threefry2x32"
      or not jax.config.jax_threefry_partitionable
      or size >= 2**32
      or len(shape) == 0
  ):
    return jax.random.bits(key, shape, jnp.uint32)
  words = jax.random.key_data(key)
  counts = jax.lax.iota(jnp.uint32, size).reshape(shape)
  y0, y1 = _threefry2x32(words[0], words[1], jnp.zeros_like(counts), counts)
  return y0 ^ y1


def keep_mask(key: Array, rate: float, shape: tuple[int, ...]) -> tuple[Array, float]:
  """Which elements of an array of `shape` survive dropout at `rate`, and the survivors' scale.

  Each uint32 of `random_bits` decides two elements, from its low and high halves: the keep
  probability is quantised to 1/65536 (0.9 -> 0.899994) and the scale uses the exact value, so
  dropout stays unbiased.
  """
  threshold = max(1, min(65536, round((1.0 - rate) * 65536)))
  n = shape[-1]
  bits = random_bits(key, tuple(shape[:-1]) + ((n + 1) // 2,))
  keep = jnp.concatenate([(bits & 0xFFFF) < threshold, (bits >> 16) < threshold], axis=-1)[..., :n]
  return keep, 65536.0 / threshold


class Dropout(nn.Module):
  """Inverted dropout that draws 16 random bits per element instead of 32 (`keep_mask`).

  Same contract as `nn.Dropout` (RNG stream 'dropout', identity when deterministic); the bits
  come from `random_bits` (threefry written out; JAX's rolled CPU lowering took twice as long).
  With flax's `nn.Dropout`, dropout was about 6% of a BERT-base training step on CPU (BERT
  applies it at four places per layer), most of it generating the random bits.
  """

  rate: float

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    keep, scale = keep_mask(self.make_rng("dropout"), self.rate, x.shape)
    return jnp.where(keep, x * scale, 0.0).astype(x.dtype)


# ------------------------------------------------------------------------------ attention

# Splash attention's query and key blocks (its defaults); sequence lengths it runs on are
# multiples of this, as its segment-id path requires.
SPLASH_BLOCK = 128


def platform() -> str:
  """The platform a program is being built for: that of the mesh in context (`jax.set_mesh`),
  which is a TPU slice when `bertjax compile` compiles for one from a CPU host, else JAX's
  default backend ('cpu', 'gpu', 'tpu')."""
  device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
  return device.platform if device is not None else jax.default_backend()


def attention_chunks(configured: int, batch: int, backend: str | None = None) -> int:
  """How many batch slices attention runs as on `backend` (default: `platform()`): 2 on XLA's
  CPU backend and 1 elsewhere, unless `configured` > 0 says otherwise; 1 when the count does
  not divide `batch`."""
  chunks = configured or (2 if (backend or platform()) == "cpu" else 1)
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


def segment_mask(segment_ids_BxL: Array) -> Array:
  """[B, 1, L, L]: query i may attend to key j when both belong to the same example (the same
  segment id; padding, id 0, attends to padding only, so no row is empty)."""
  return segment_ids_BxL[:, None, :, None] == segment_ids_BxL[:, None, None, :]


def window_mask(length: int, window: int) -> np.ndarray:
  """[1, 1, L, L]: query i may attend to key j when |i - j| <= window // 2."""
  i = np.arange(length)
  return (np.abs(i[:, None] - i[None, :]) <= window // 2)[None, None]


def einsum_attention(
    q_BxLxNxD: Array,
    k_BxLxNxD: Array,
    v_BxLxNxD: Array,
    mask_Bx1x1xL: Array,
    keep_BxNxLxL: Array | None = None,
    keep_scale: float = 1.0,
) -> Array:
  """Plain softmax attention; the reference that `jax.nn.dot_product_attention` must match.

  `mask_Bx1x1xL` is any boolean mask broadcastable to [B, N, L, L] (True: may attend). With
  `keep_BxNxLxL` (from `keep_mask`), dropout on the attention probabilities: dropped entries are
  zeroed and the kept ones multiplied by `keep_scale`.
  """
  scale = q_BxLxNxD.shape[-1] ** -0.5
  logits_BxNxLxL = jnp.einsum("bqnd,bknd->bnqk", q_BxLxNxD, k_BxLxNxD).astype(jnp.float32) * scale
  big_neg = jnp.finfo(jnp.float32).min
  logits_BxNxLxL = jnp.where(mask_Bx1x1xL, logits_BxNxLxL, big_neg)
  probs_BxNxLxL = jax.nn.softmax(logits_BxNxLxL, axis=-1).astype(v_BxLxNxD.dtype)
  if keep_BxNxLxL is not None:
    probs_BxNxLxL = jnp.where(keep_BxNxLxL, probs_BxNxLxL * keep_scale, 0.0).astype(v_BxLxNxD.dtype)
  return jnp.einsum("bnqk,bknd->bqnd", probs_BxNxLxL, v_BxLxNxD)


def attention(
    q_BxLxNxD: Array,
    k_BxLxNxD: Array,
    v_BxLxNxD: Array,
    *,
    segment_ids: Array | None = None,
    mask: Array | None = None,
    window: int | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    backend: str | None = None,
    batch_chunks: int = 0,
) -> Array:
  """Softmax self-attention of every head, [B, L, N, D] in and out: the one attention hook.

  Who may attend to whom is the AND of what is given: `segment_ids` [B, L] (int: the examples
  packed in a row, 1..k, with 0 for padding; a token sees its own example only), `mask` (bool,
  rank 4, broadcastable to [B, N, L, L], e.g. `bert.attention_mask_bias`'s [B, 1, 1, L] key
  mask) and `window` (|i - j| <= window // 2, the local attention of ModernBERT-style layers).
  Unless `deterministic`, the probabilities are dropped out at `dropout_rate`, with the mask
  drawn here from `dropout_rng` for the whole batch (`keep_mask`).

  The kernel follows `backend` (default: `platform()`):
    cpu  XLA: `jax.nn.dot_product_attention`, or `einsum_attention` with dropout, over
         `batch_chunks` interleaved batch slices (0: two where they divide the batch; see
         `over_batch_chunks`). The same function for any slice count.
    gpu  cuDNN's flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`)
         when `cudnn_refusal` has no objection: no attention dropout, bfloat16/float16, a
         head dim that is a multiple of 8 up to 128, an even L, and cuDNN installed. The
         masks (key padding, packed examples' segments, a local window) go in as one boolean
         [B|1, 1, L, L] mask, which JAX hands to cuDNN as an additive bias (jax 0.10's cuDNN
         call takes no segment ids, and its windows are causal only). Otherwise the XLA calls of the
         CPU path, unsliced (`implementation=None` is XLA's in jax 0.10: JAX does not pick
         cuDNN on its own).
    tpu  Pallas splash attention (`splash_attention`) when the probabilities are not dropped
         out, L is a multiple of SPLASH_BLOCK and `mask` is None or a [B, 1, 1, L] key mask
         (turned into segment ids); XLA as on GPUs otherwise, e.g. in training with BERT's
         attention dropout, which splash attention does not implement.
  Rows of padding queries (segment 0, or a masked key position) may differ between the
  kernels; real tokens' outputs are the same function on every backend.
  """
  batch, length, heads, _ = q_BxLxNxD.shape
  dropping = not deterministic and dropout_rate > 0.0
  if dropping and dropout_rng is None:
    raise ValueError("attention: dropout_rate > 0 and deterministic=False need a dropout_rng")
  if mask is not None and mask.ndim != 4:
    raise ValueError(
        f"attention: mask has shape {mask.shape}; it must be rank 4, [B|1, N|1, L|1, L]"
    )
  if (backend or platform()) == "tpu" and _splash_applies(q_BxLxNxD, mask, dropping):
    if mask is not None:  # a key the mask hides joins the padding (segment 0)
      ids = 1 if segment_ids is None else segment_ids
      segment_ids = jnp.where(mask[:, 0, 0, :], ids, 0)
    return splash_attention(q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, segment_ids, window=window)
  masks = [] if mask is None else [mask]
  if segment_ids is not None:
    masks.append(segment_mask(segment_ids))
  if window is not None:
    masks.append(jnp.asarray(window_mask(length, window)))
  if (backend or platform()) == "gpu" and cudnn_refusal(q_BxLxNxD, dropping) is None:
    out = _cudnn_attention(q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, masks)
    if out is not None:
      return out
  keep_BxNxLxL, keep_scale = None, 1.0
  if dropping:
    keep_BxNxLxL, keep_scale = keep_mask(dropout_rng, dropout_rate, (batch, heads, length, length))
  chunks = attention_chunks(batch_chunks, batch, backend)
  return _xla_attention(q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, masks, keep_BxNxLxL, keep_scale, chunks)


def cudnn_refusal(q_BxLxNxD, dropping: bool) -> str | None:
  """None when cuDNN's flash attention (through `jax.nn.dot_product_attention`) takes this
  call on a GPU, else why the XLA path runs instead (what jax 0.10 accepts for cuDNN)."""
  length, head_dim = q_BxLxNxD.shape[1], q_BxLxNxD.shape[-1]
  if dropping:
    return (
        "attention dropout (config.model.attention_dropout_rate > 0): cuDNN's kernel has no "
        "dropout through jax.nn.dot_product_attention"
    )
  if jnp.dtype(q_BxLxNxD.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return (
        f"{jnp.dtype(q_BxLxNxD.dtype).name} compute (config.model.dtype): cuDNN's flash "
        "attention takes bfloat16 or float16"
    )
  if head_dim % 8 or head_dim > 128:
    return f"head dim {head_dim}: cuDNN's flash attention takes a multiple of 8 up to 128"
  if length % 2:
    return f"sequence length {length}: cuDNN's masked flash attention trains on even lengths"
  return None


def _cudnn_attention(q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, masks: list[Array]) -> Array | None:
  """cuDNN's flash attention under the AND of `masks`, or None when JAX refuses the call
  (cuDNN not installed, or a shape its checks reject)."""
  mask = None
  if masks:  # cuDNN's bias is [B|1, N|1, L, L]: a key mask [B, 1, 1, L] spreads over queries
    mask = functools.reduce(jnp.logical_and, masks)
    length = q_BxLxNxD.shape[1]
    mask = jnp.broadcast_to(mask, mask.shape[:2] + (length, length))
  try:
    return jax.nn.dot_product_attention(
        q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, mask=mask, implementation="cudnn"
    )
  except (RuntimeError, NotImplementedError, ValueError):  # raised while tracing, before any op
    return None


def _splash_applies(q_BxLxNxD: Array, mask: Array | None, dropping: bool) -> bool:
  """Splash attention has no dropout, works in whole blocks and takes a mask only as segment
  ids, which a [B, 1, 1, L] key mask can be."""
  batch, length = q_BxLxNxD.shape[:2]
  key_mask = mask is None or (mask.shape[0] == batch and mask.shape[1:3] == (1, 1))
  return not dropping and length % SPLASH_BLOCK == 0 and key_mask


def _xla_attention(
    q_BxLxNxD: Array,
    k_BxLxNxD: Array,
    v_BxLxNxD: Array,
    masks: list[Array],
    keep_BxNxLxL: Array | None,
    keep_scale: float,
    chunks: int,
) -> Array:
  """XLA's attention under the AND of `masks`, over `chunks` interleaved batch slices.

  The dropout mask `keep_BxNxLxL` is drawn for the whole batch before slicing, so the numbers
  do not depend on `chunks`; it needs the explicit `einsum_attention`, and without it
  `jax.nn.dot_product_attention` computes the same function.
  """
  batch = q_BxLxNxD.shape[0]
  arrays = [q_BxLxNxD, k_BxLxNxD, v_BxLxNxD]
  if masks:
    mask = functools.reduce(jnp.logical_and, masks)
    arrays.append(jnp.broadcast_to(mask, (batch,) + mask.shape[1:]))  # sliceable by batch
  if keep_BxNxLxL is not None:
    arrays.append(keep_BxNxLxL)

  def attend(q, k, v, *rest):
    m = rest[0] if masks else None
    if keep_BxNxLxL is not None:
      return einsum_attention(q, k, v, True if m is None else m, rest[-1], keep_scale)
    return jax.nn.dot_product_attention(q, k, v, mask=m, implementation=None)

  return over_batch_chunks(attend, chunks, *arrays)


def splash_attention(
    q_BxLxNxD: Array,
    k_BxLxNxD: Array,
    v_BxLxNxD: Array,
    segment_ids_BxL: Array | None,
    *,
    window: int | None = None,
    interpret: bool = False,
) -> Array:
  """TPU: Pallas splash attention (`make_splash_mha`) with `SegmentIds`, a `FullMask` or a
  `LocalMask` for `window`; `interpret` runs the kernel in Pallas' interpreter (any backend).

  The kernel sees one device's data: under a mesh it runs per shard in `jax.shard_map`, with the
  batch and the heads split as the logical axis rules in context split 'batch' and 'act_heads'
  (the model's activation constraints), and the length whole on every shard.
  """
  local = functools.partial(_splash_local, window=window, interpret=interpret)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.are_all_axes_manual:  # one device, or already inside a shard_map
    return local(q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, segment_ids_BxL)
  batch_axes = _mesh_axes("batch", q_BxLxNxD.shape[0], mesh)
  head_axes = _mesh_axes("act_heads", q_BxLxNxD.shape[2], mesh)
  qkv = P(batch_axes, None, head_axes, None)
  segments = None if segment_ids_BxL is None else P(batch_axes, None)
  sharded = jax.shard_map(
      local, mesh=mesh, in_specs=(qkv, qkv, qkv, segments), out_specs=qkv, check_vma=False
  )
  return sharded(q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, segment_ids_BxL)


def _mesh_axes(logical: str, size: int, mesh) -> tuple[str, ...] | None:
  """The mesh axes the rules in context give `logical`, if they split `size` evenly (else
  None: the dimension is whole on every shard, as `sharding.logical_to_spec` replicates it)."""
  axes = nn.logical_to_mesh_axes((logical,))[0]
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  axes = tuple(a for a in axes if a in mesh.shape and a not in mesh.manual_axes)
  ways = math.prod(mesh.shape[a] for a in axes)
  return axes if axes and size % ways == 0 else None


def _splash_local(
    q_BxLxNxD: Array,
    k_BxLxNxD: Array,
    v_BxLxNxD: Array,
    segment_ids_BxL: Array | None,
    *,
    window: int | None,
    interpret: bool,
) -> Array:
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # TPU path only

  _, length, heads, head_dim = q_BxLxNxD.shape
  if window is None:
    head_mask = splash.FullMask((length, length))
  else:
    head_mask = splash.LocalMask((length, length), (window // 2, window // 2), offset=0)
  kernel = splash.make_splash_mha(
      splash.MultiHeadMask([head_mask] * heads), head_shards=1, q_seq_shards=1, interpret=interpret
  )
  # The kernel is per example, heads first, and does not scale the logits.
  q_BxNxLxD = jnp.swapaxes(q_BxLxNxD * jnp.asarray(head_dim**-0.5, q_BxLxNxD.dtype), 1, 2)
  k_BxNxLxD, v_BxNxLxD = jnp.swapaxes(k_BxLxNxD, 1, 2), jnp.swapaxes(v_BxLxNxD, 1, 2)
  if segment_ids_BxL is None:
    out_BxNxLxD = jax.vmap(kernel)(q_BxNxLxD, k_BxNxLxD, v_BxNxLxD)
  else:
    ids_BxL = segment_ids_BxL.astype(jnp.int32)
    segments = splash.SegmentIds(q=ids_BxL, kv=ids_BxL)
    out_BxNxLxD = jax.vmap(kernel)(q_BxNxLxD, k_BxNxLxD, v_BxNxLxD, segments)
  return jnp.swapaxes(out_BxNxLxD, 1, 2)
