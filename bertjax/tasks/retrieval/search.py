"""Exact search: the top k documents of every query by the model's similarity, over the whole
corpus, one block of documents at a time.

The scores of a block of queries against a block of documents ([Q, B], never queries × corpus)
are cut to their top k on the device and merged with the best k so far, so memory holds
[Q, B] and [Q, k] only. Document blocks are sharded over the mesh's batch axes; queries and
the running best are replicated. Cosine similarity is the dot product of unit vectors.

Shape letters: Q queries (a block of them), B documents (a block), D embedding size, K kept.
"""

from __future__ import annotations

import functools
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.training import sharding

# Documents scored per step, and queries per step: a [Q, B] float32 block is 64 MiB.
DOC_BLOCK = 16384
QUERY_BLOCK = 1024


def unit(x_NxD: np.ndarray) -> np.ndarray:
  return x_NxD / np.maximum(np.linalg.norm(x_NxD, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames="k")
def _merge(best_s_QxK, best_i_QxK, q_QxD, d_BxD, first, valid, *, k):
  """The best k of (best so far) and (this block's documents first..first+valid)."""
  s_QxB = jnp.dot(q_QxD, d_BxD.T, precision=jax.lax.Precision.HIGHEST)
  b = d_BxD.shape[0]
  ids_B = first + jnp.arange(b)
  s_QxB = jnp.where(jnp.arange(b)[None, :] < valid, s_QxB, -jnp.inf)
  top_s_QxK, top_j_QxK = jax.lax.top_k(s_QxB, min(k, b))
  s_QxM = jnp.concatenate([best_s_QxK, top_s_QxK], axis=1)
  i_QxM = jnp.concatenate([best_i_QxK, ids_B[top_j_QxK]], axis=1)
  keep_s_QxK, at_QxK = jax.lax.top_k(s_QxM, k)
  return keep_s_QxK, jnp.take_along_axis(i_QxM, at_QxK, axis=1)


def top_k(
    queries_QxD: np.ndarray,
    doc_blocks: Iterable[np.ndarray],
    k: int,
    mesh: jax.sharding.Mesh | None = None,
    block: int = DOC_BLOCK,
) -> tuple[np.ndarray, np.ndarray]:
  """(scores [Q, k] best first, document indexes [Q, k]; -1 where the corpus has fewer than
  k) of every query against the documents of `doc_blocks` (consecutive [b, D] arrays, b <=
  `block`, indexed from 0 in order), by dot product."""
  n_q = len(queries_QxD)
  best_s = np.full((n_q, k), -np.inf, np.float32)
  best_i = np.full((n_q, k), -1, np.int32)
  if mesh is not None:
    shards = sharding.num_batch_shards(mesh)
    block = -(-block // shards) * shards
  first = 0
  for docs in doc_blocks:
    n = len(docs)
    d_BxD = np.zeros((block, docs.shape[1]), np.float32)
    d_BxD[:n] = docs
    if mesh is not None:
      d_BxD = jax.device_put(d_BxD, sharding.batch_sharding(mesh))
    for q0 in range(0, n_q, QUERY_BLOCK):
      q = slice(q0, q0 + QUERY_BLOCK)
      s, i = _merge(best_s[q], best_i[q], queries_QxD[q].astype(np.float32), d_BxD, first, n, k=k)
      best_s[q], best_i[q] = np.asarray(s), np.asarray(i)
    first += n
  best_i[~np.isfinite(best_s)] = -1
  return best_s, best_i
