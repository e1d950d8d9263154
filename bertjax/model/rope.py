"""Rotary position embeddings (Su et al. 2021) as ModernBERT and transformers apply them.

The head dimension is rotated in two halves ("rotate_half"): channel c and channel c + D/2 form
one pair, turned by the angle position * theta^(-2c/D). Queries and keys are rotated, values are
not, so a query-key product depends on positions only through their difference.

Shape letters as in `bert.py` (B batch, L length, N heads, D head size).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
  """[D/2] float32 angles per position of each channel pair: theta^(-2c/D)."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def rotate(x_BxLxNxD: Array, position_ids_BxL: Array, theta: float) -> Array:
  """`x` rotated by its tokens' positions (`position_ids`, which restart at each packed example),
  computed in float32 and returned in `x`'s dtype."""
  head_dim = x_BxLxNxD.shape[-1]
  angles_BxLxD2 = position_ids_BxL[..., None].astype(jnp.float32) * inverse_frequencies(
      head_dim, theta
  )
  angles_BxLx1xD = jnp.concatenate([angles_BxLxD2, angles_BxLxD2], axis=-1)[:, :, None, :]
  x = x_BxLxNxD.astype(jnp.float32)
  first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
  rotated_BxLxNxD = jnp.concatenate([-second, first], axis=-1)
  out = x * jnp.cos(angles_BxLx1xD) + rotated_BxLxNxD * jnp.sin(angles_BxLx1xD)
  return out.astype(x_BxLxNxD.dtype)
