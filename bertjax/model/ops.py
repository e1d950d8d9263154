"""The backend-specific kernels of the BERT network, behind the names `bert.py` calls.

Each is the same function as its plain JAX counterpart (tests compare them bit for bit or to
float rounding); what differs is how XLA lowers it, measured on 2 CPU cores:

  flat_dot_general  `nn.Dense`'s product with the leading axes merged (the `dot_general` hook
                    of every dense layer): 4-6% of a BERT-mini training step
  Dropout           16 random bits per element from an unrolled threefry (`random_bits`):
                    flax's `nn.Dropout` was ~6% of a BERT-base step
  attention         softmax attention over interleaved batch slices (`over_batch_chunks`), with
                    `jax.nn.dot_product_attention` (cuDNN on GPUs) when there is no dropout:
                    3-4% of a BERT-mini step
  gelu_erf          exact GELU through erf rather than erfc: ~3% of a BERT-mini step

On TPUs and GPUs they lower to the same programs as the plain versions (attention runs as one
slice there), so nothing here is CPU-only in effect, only in motivation.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

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
    keep = jnp.concatenate([(bits & 0xFFFF) < threshold, (bits >> 16) < threshold], axis=-1)[
        ..., :n
    ]
    return keep, 65536.0 / threshold

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    keep, scale = self.keep_mask(x.shape)
    return jnp.where(keep, x * scale, 0.0).astype(x.dtype)


def attention_chunks(configured: int, batch: int) -> int:
  """How many batch slices attention runs as: `configured` (`attention_batch_chunks`), where 0
  means 2 on XLA's CPU backend and 1 elsewhere; 1 when the count does not divide `batch`."""
  chunks = configured or (2 if jax.default_backend() == "cpu" else 1)
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


def einsum_attention(
    q_BxLxNxD: Array,
    k_BxLxNxD: Array,
    v_BxLxNxD: Array,
    mask_Bx1x1xL: Array,
    keep_BxNxLxL: Array | None = None,
    keep_scale: float = 1.0,
) -> Array:
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
    probs_BxNxLxL = jnp.where(keep_BxNxLxL, probs_BxNxLxL * keep_scale, 0.0).astype(v_BxLxNxD.dtype)
  return jnp.einsum("bnqk,bknd->bqnd", probs_BxNxLxL, v_BxLxNxD)


def attention(
    q_BxLxNxD: Array,
    k_BxLxNxD: Array,
    v_BxLxNxD: Array,
    mask_Bx1x1xL: Array,
    chunks: int,
    keep_BxNxLxL: Array | None = None,
    keep_scale: float = 1.0,
) -> Array:
  """Softmax attention of every head, run as `chunks` interleaved batch slices.

  With `keep_BxNxLxL` (from `Dropout.keep_mask`, drawn for the whole batch before slicing, so
  the numbers do not depend on `chunks`) the probabilities are dropped out, which needs the
  explicit `einsum_attention`; without it `jax.nn.dot_product_attention` computes the same
  function (and is cuDNN's fused attention on GPUs).
  """
  if keep_BxNxLxL is not None:
    attend = lambda q, k, v, m, keep: einsum_attention(q, k, v, m, keep, keep_scale)
    return over_batch_chunks(
        attend, chunks, q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, mask_Bx1x1xL, keep_BxNxLxL
    )
  attend = lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m)
  return over_batch_chunks(attend, chunks, q_BxLxNxD, k_BxLxNxD, v_BxLxNxD, mask_Bx1x1xL)
