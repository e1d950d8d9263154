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

import heapq

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


# ------------------------------------------------------------------------------ packed rows
# Several short examples share one row of the arrays' length L, at most E of them (a fixed
# count, so every batch has one shape): segment ids 1..k keep attention inside each example,
# positions restart at each (the model's default for segment ids) and `cls_positions` [R, E]
# point each example's classifier at its own [CLS]. "example" [R, E] (-1 absent) maps a slot
# back to its row of the arrays; it stays on the host.

PACKED_INPUTS = ("input_ids", "token_type_ids")  # laid into the rows (0 past the examples)


def example_lengths(mask_NxL: np.ndarray) -> np.ndarray:
  """[N] one past each row's last real token (at least 1): what the row takes in a pack."""
  max_len = mask_NxL.shape[1]
  return np.where(mask_NxL.any(axis=1), max_len - np.argmax(mask_NxL[:, ::-1] != 0, axis=1), 1)


def pack_examples(
    lengths_N: np.ndarray, capacity: int, max_per_row: int, order: np.ndarray | None = None
) -> list[list[int]]:
  """Rows of example indexes by first-fit-decreasing: examples by decreasing length (ties in
  `order`, default 0..N-1), each into the first row with room for it and fewer than
  `max_per_row` examples. The rows' count depends only on the lengths, not on `order`."""
  order = np.arange(len(lengths_N)) if order is None else np.asarray(order)
  order = order[np.argsort(-lengths_N[order], kind="stable")]
  rows: list[list[int]] = []
  # open[c]: a heap of the rows with c tokens free that can take another example; the first
  # row that fits is the smallest index over the heaps of c >= the example's length.
  open_rows: list[list[int]] = [[] for _ in range(capacity + 1)]
  for i in order.tolist():
    size = int(lengths_N[i])
    if size > capacity:
      raise ValueError(f"example {i} has {size} tokens, more than a row's {capacity}")
    row, free = len(rows), capacity
    for c in range(size, capacity + 1):
      if open_rows[c] and open_rows[c][0] < row:
        row, free = open_rows[c][0], c
    if row == len(rows):
      rows.append([])
    else:
      heapq.heappop(open_rows[free])
    rows[row].append(i)
    if len(rows[row]) < max_per_row and free - size > 0:
      heapq.heappush(open_rows[free - size], row)
  return rows


def packed_batch_rows(batch_size: int, n_examples: int, n_rows: int, shards: int) -> int:
  """Rows per packed training batch: about `batch_size` examples (the examples per row of the
  packing), a multiple of the batch `shards`; so an epoch takes about as many steps unpacked."""
  per = batch_size * n_rows / max(1, n_examples)
  return max(shards, int(-(-per // shards)) * shards)


def packed_epoch(
    lengths_N: np.ndarray,
    capacity: int,
    max_per_row: int,
    rows_per_batch: int,
    rng: np.random.Generator,
) -> list[list[list[int]]]:
  """One epoch's packed batches (each a list of rows of example indexes): the examples
  shuffled, packed first-fit-decreasing, the rows shuffled and cut into batches."""
  rows = pack_examples(lengths_N, capacity, max_per_row, rng.permutation(len(lengths_N)))
  rows = [rows[i] for i in rng.permutation(len(rows))]
  return [rows[i : i + rows_per_batch] for i in range(0, len(rows), rows_per_batch)]


def packed_batch(
    arrays: dict[str, np.ndarray],
    lengths_N: np.ndarray,
    rows: list[list[int]],
    max_per_row: int,
    n_rows: int,
) -> tuple[dict, np.ndarray]:
  """(batch, example_RxE): `n_rows` packed rows holding the examples of `rows` (the rest
  empty), and each slot's example index (-1 empty). Every other array of `arrays` comes along:
  one of [N, L, ...] (NER's token labels) is laid into the rows beside its example's tokens,
  -1 elsewhere; one of [N, ...] (GLUE's labels, SQuAD's start and end positions, which count
  from the example's own [CLS]) becomes [R, E, ...], a value per slot. "weights" [R, E] is 1
  for a present example, 0 for an empty slot."""
  max_len = arrays["input_ids"].shape[1]
  token_keys = list(PACKED_INPUTS) + [
      k
      for k, v in arrays.items()
      if k not in PACKED_INPUTS + ("attention_mask",) and v.ndim >= 2 and v.shape[1] == max_len
  ]
  out = {
      k: np.full((n_rows,) + arrays[k].shape[1:], 0 if k in PACKED_INPUTS else -1, arrays[k].dtype)
      for k in token_keys
  }
  seg_RxL = np.zeros((n_rows, max_len), np.int32)
  cls_RxE = np.full((n_rows, max_per_row), -1, np.int32)
  example_RxE = np.full((n_rows, max_per_row), -1, np.int64)
  for r, row in enumerate(rows):
    pos = 0
    for e, i in enumerate(row):
      n = int(lengths_N[i])
      for k in token_keys:
        out[k][r, pos : pos + n] = arrays[k][i, :n]
      seg_RxL[r, pos : pos + n] = e + 1
      cls_RxE[r, e], example_RxE[r, e] = pos, i
      pos += n
  present_RxE = example_RxE >= 0
  for k, v in arrays.items():
    if k not in token_keys and k != "attention_mask":
      out[k] = v[np.maximum(example_RxE, 0)]
  return (
      dict(
          out,
          segment_ids=seg_RxL,
          cls_positions=cls_RxE,
          weights=present_RxE.astype(np.float32),
      ),
      example_RxE,
  )


def unpack_outputs(
    x_RxS: np.ndarray,
    example_RxE: np.ndarray,
    cls_RxE: np.ndarray,
    lengths_N: np.ndarray,
    per_token: bool,
) -> tuple[np.ndarray, np.ndarray]:
  """(examples [P], their outputs [P, ...]) of a packed batch's output: one per slot [R, E,
  ...] (a classifier's logits), or per token [R, L, ...] (SQuAD's, NER's): each example's own
  tokens moved to the front, [P, L, ...], and padded with the dtype's minimum (never an argmax
  or top-n candidate) or 0, as `pad_length` pads an unpacked batch."""
  r_P, e_P = np.nonzero(example_RxE >= 0)
  example_P = example_RxE[r_P, e_P]
  if not per_token:
    return example_P, x_RxS[r_P, e_P]
  length = x_RxS.shape[1]
  j_L = np.arange(length)
  pos_PxL = np.minimum(cls_RxE[r_P, e_P][:, None] + j_L, length - 1)
  x_PxL = x_RxS[r_P[:, None], pos_PxL]
  fill = np.finfo(x_RxS.dtype).min if np.issubdtype(x_RxS.dtype, np.floating) else 0
  real_PxL = j_L < lengths_N[example_P][:, None]
  real_PxL = real_PxL.reshape(real_PxL.shape + (1,) * (x_PxL.ndim - 2))
  return example_P, np.where(real_PxL, x_PxL, fill)
