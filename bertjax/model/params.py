"""Parameter trees of the BERT network: the scanned and unscanned layouts, counts, dummy inputs."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def _is_layer_key(k: str) -> bool:
  return k.startswith("layer_") and k[len("layer_") :].isdigit()


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
  return any(
      isinstance(x, nn.Partitioned)
      for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  )


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(nn.unbox(params)))


def dummy_inputs(batch: int = 1, seq_len: int = 8, num_masked: int = 2) -> dict[str, Array]:
  """Zero inputs of the right shapes, for `init` and `jax.eval_shape`."""
  z = jnp.zeros((batch, seq_len), jnp.int32)
  return dict(
      input_ids=z,
      token_type_ids=z,
      attention_mask=jnp.ones_like(z),
      masked_positions=jnp.zeros((batch, num_masked), jnp.int32),
  )
