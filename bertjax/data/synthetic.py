"""Random pretraining batches with the real features, in pure numpy (no TensorFlow).

Row r of the global batch at step s is a function of (seed, s, r) only, so a host computes just
its own rows and the global batch is the same for any number of hosts. Lengths, segment split,
labels and masking follow the same rules as the prepared source (`short_seq_prob`, pair modes,
15% masking with 80/10/10), so the statistics of `bertjax data stats` hold here too.
"""

from __future__ import annotations

import numpy as np

from bertjax.data import masking
from bertjax.data.tokenizer import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID

# Purposes of the per-row hashes.
_SHORT, _LENGTH, _SPLIT, _LABEL, _TOKEN, _MASK = 11, 12, 13, 14, 15, 16


def word_start_table(vocab_size: int) -> np.ndarray:
  """A fixed pseudo-vocabulary where two pieces in three start a word."""
  table = np.arange(vocab_size) % 3 != 0
  table[:NUM_SPECIAL] = False
  return table


def synthetic_batch(
    *,
    seed: int,
    step: int,
    rows: np.ndarray,
    seq_len: int,
    pair_mode: str,
    short_seq_prob: float,
    spec: masking.MaskSpec,
) -> dict[str, np.ndarray]:
  """Rows `rows` (global row numbers) of the global batch at `step`."""
  row_key_B = masking.key(seed, step, rows)
  B, L = len(rows), seq_len
  max_tokens = L - (2 if pair_mode == "none" else 3)
  short_B = masking.uniform(masking.key(row_key_B, _SHORT)) < short_seq_prob
  n_B = np.where(
      short_B, 2 + masking.key(row_key_B, _LENGTH) % np.uint64(max_tokens - 1), max_tokens
  ).astype(np.int64)
  if pair_mode == "none":
    la_B, lb_B = n_B, np.zeros_like(n_B)
    label_B = np.zeros(B, np.int64)
  else:
    la_B = 1 + (masking.key(row_key_B, _SPLIT) % (n_B - 1).astype(np.uint64)).astype(np.int64)
    lb_B = n_B - la_B
    label_B = (masking.key(row_key_B, _LABEL) & np.uint64(1)).astype(np.int64)
  pos_BxL = np.broadcast_to(np.arange(L), (B, L))
  tokens_BxL = NUM_SPECIAL + (
      masking.key(row_key_B[:, None], _TOKEN, np.arange(L))
      % np.uint64(spec.vocab_size - NUM_SPECIAL)
  ).astype(np.int64)
  la, lb = la_B[:, None], lb_B[:, None]
  sep_a = pos_BxL == la + 1
  sep_b = (lb > 0) & (pos_BxL == la + lb + 2)
  end = np.where(lb > 0, la + lb + 3, la + 2)  # one past the last real token
  ids = np.where(pos_BxL == 0, CLS_ID, np.where(sep_a | sep_b, SEP_ID, tokens_BxL))
  ids = np.where(pos_BxL < end, ids, PAD_ID)
  token_type = ((pos_BxL > la + 1) & (pos_BxL < end)).astype(np.int32)
  masked = masking.mask_batch(ids, masking.key(row_key_B, _MASK), spec)
  return {
      **masked,
      "attention_mask": (pos_BxL < end).astype(np.int32),
      "token_type_ids": token_type,
      "nsp_labels": label_B.astype(np.int32),
  }
