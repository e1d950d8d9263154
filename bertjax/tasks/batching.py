"""Length-aware batches for fine-tuning: each batch is cut to its rows' longest real length
rounded up to a bucket, with few distinct lengths (each one is a compiled step).

    padded_N = padded_lengths(mask_NxL, bucket=8, min_rows=4 * 32, max_lengths=8)
    for idx in epoch_batches(padded_N, 32, rng):
      batch = train_batch(arrays, idx, int(padded_N[idx].max()), 32)

Arrays are dicts of numpy arrays with the rows on the leading axis, as the task feature
builders write them. Every process holds the whole global batch (fine-tuning sets fit in host
memory); `process_rows` is the slice of rows it feeds. Pure numpy: no JAX here but the process
index.

Shape letters: N rows, L sequence length.
"""

from __future__ import annotations

import jax
import numpy as np


def padded_lengths(
    mask_NxL: np.ndarray,
    bucket: int,
    min_rows: int = 0,
    max_lengths: int = 0,
    compile_tokens: float = 0.0,
) -> np.ndarray:
  """[N] the length each row is padded to: its real tokens rounded up to a multiple of
  `bucket`, at most L (0: every row to L); a length with fewer than `min_rows` rows goes up to
  the next longer one (the longest, rare, takes the next shorter one in). Then the lengths
  kept are the ones that minimise the padded tokens plus `compile_tokens` per length kept
  (what a compile costs, in tokens; `fewest_padded_lengths`), at most `max_lengths` (> 0) of
  them: few compiled steps, each worth its compile."""
  n, max_len = mask_NxL.shape
  if bucket <= 0:
    return np.full(n, max_len, np.int64)
  # One past the last real token (not the mask's sum: a mask need not be a prefix).
  real_N = np.where(mask_NxL.any(axis=1), max_len - np.argmax(mask_NxL[:, ::-1] != 0, axis=1), 1)
  padded_N = np.minimum(-(-real_N // bucket) * bucket, max_len)
  lengths = np.unique(padded_N)
  for short, longer in zip(lengths[:-1], lengths[1:]):
    if np.sum(padded_N == short) < min_rows:
      padded_N[padded_N == short] = longer
  lengths = np.unique(padded_N)
  while len(lengths) > 1 and np.sum(padded_N == lengths[-1]) < min_rows:  # a rare longest
    padded_N[padded_N == lengths[-2]] = lengths[-1]  # length takes its neighbour in
    lengths = lengths[np.arange(len(lengths)) != len(lengths) - 2]
  if len(lengths) > 1 and (compile_tokens > 0 or 0 < max_lengths < len(lengths)):
    counts = np.array([np.sum(padded_N == v) for v in lengths])
    kept = fewest_padded_lengths(lengths, counts, max_lengths or len(lengths), compile_tokens)
    padded_N = kept[np.searchsorted(kept, padded_N)]
  return padded_N


def fewest_padded_lengths(
    lengths: np.ndarray, counts: np.ndarray, k: int, per_length: float = 0.0
) -> np.ndarray:
  """At most `k` of the sorted `lengths` (the longest always among them) that minimise the
  padded tokens, when each of `counts[i]` rows of length `lengths[i]` is padded up to the next
  kept length, plus `per_length` for each length kept: dynamic programming over (kept so
  far, last kept), O(k·n²) for n lengths."""
  n = len(lengths)
  k = min(k, n)
  rows_upto = np.concatenate([[0], np.cumsum(counts)])
  # cost[j][i]: fewest padded tokens of the rows of lengths[:i + 1] with j + 1 lengths kept,
  # lengths[i] the longest of them
  cost = np.full((k, n), np.inf)
  back = np.zeros((k, n), np.int64)
  cost[0] = rows_upto[1:] * lengths
  for j in range(1, k):
    for i in range(j, n):
      prev = cost[j - 1, :i] + (rows_upto[i + 1] - rows_upto[1 : i + 1]) * lengths[i]
      back[j, i] = int(np.argmin(prev))
      cost[j, i] = prev[back[j, i]]
  j = int(np.argmin(cost[:, n - 1] + per_length * np.arange(1, k + 1)))
  kept, i = [n - 1], n - 1
  while j > 0:
    i = back[j, i]
    kept.append(i)
    j -= 1
  return lengths[sorted(kept)]


def epoch_batches(
    padded_N: np.ndarray, batch_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
  """One epoch's batches of row indexes: rows shuffled, grouped by padded length (a stable
  sort keeps the shuffle within each length), cut into batches, the batches shuffled. Only the
  batches on a length's boundary mix lengths (padded to the longer), only the last is short:
  ceil(N / batch) steps, as without buckets."""
  order = rng.permutation(len(padded_N))
  order = order[np.argsort(padded_N[order], kind="stable")]
  chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
  return [chunks[i] for i in rng.permutation(len(chunks))]


def take(arrays: dict[str, np.ndarray], idx: np.ndarray, length: int, keys=None) -> dict:
  """Rows `idx` of `arrays` (of `keys`, default all), [N, L] arrays cut to `length`."""
  max_len = arrays["input_ids"].shape[1]
  out = {}
  for k in keys or arrays:
    v = arrays[k][idx]
    out[k] = v[:, :length] if v.ndim >= 2 and v.shape[1] == max_len else v
  return out


def train_batch(
    arrays: dict[str, np.ndarray], idx: np.ndarray, length: int, batch_size: int
) -> dict:
  """A training batch of rows `idx`, padded to `batch_size` by repeating rows of weight 0."""
  weights = np.zeros(batch_size, np.float32)
  weights[: len(idx)] = 1.0
  return dict(take(arrays, np.resize(idx, batch_size), length), weights=weights)


def pad_length(x_BxLx: np.ndarray, length: int) -> np.ndarray:
  """[B, L, ...] outputs of a batch cut to L, padded back to `length` with the dtype's minimum
  (never an argmax or top-n candidate) or 0."""
  if x_BxLx.shape[1] == length:
    return x_BxLx
  fill = np.finfo(x_BxLx.dtype).min if np.issubdtype(x_BxLx.dtype, np.floating) else 0
  width = [(0, 0), (0, length - x_BxLx.shape[1])] + [(0, 0)] * (x_BxLx.ndim - 2)
  return np.pad(x_BxLx, width, constant_values=fill)


def process_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's slice of the rows of a global batch that every process holds whole."""
  pi, pc = jax.process_index(), jax.process_count()
  per = len(next(iter(batch.values()))) // pc
  return {k: v[pi * per : (pi + 1) * per] for k, v in batch.items()}
