"""Counter-based randomness and vectorised MLM masking.

Every random choice about an example is a hash of (seed, example key, position, purpose), not a
draw from a stateful generator. The example key is itself a hash of (epoch, document identity,
instance index), so an example is masked identically whichever host, batch or run produces it
(ablations see the same tokens), and differently in every epoch (dynamic masking).

Letters: B = batch rows, L = sequence length, P = max_predictions_per_seq.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Purposes of the per-position hashes.
_SELECT, _ACTION, _RANDOM_TOKEN = 1, 2, 3


def mix(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: a bijective, well-spread uint64 -> uint64 hash."""
  x = np.asarray(x, dtype=np.uint64)
  with np.errstate(over="ignore"):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def key(*parts: int | np.ndarray) -> np.ndarray:
  """Hashes a tuple of integers (scalars or arrays, broadcast) into one uint64 key."""
  h = np.uint64(0)
  for p in parts:
    with np.errstate(over="ignore"):
      h = mix(np.asarray(h, np.uint64) * _GOLDEN + np.asarray(p).astype(np.uint64))
  return np.asarray(h, np.uint64)


def uniform(k: np.ndarray) -> np.ndarray:
  """uint64 keys -> float64 in [0, 1)."""
  return (k >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclasses.dataclass(frozen=True)
class MaskSpec:
  vocab_size: int
  max_predictions: int  # P
  mask_prob: float = 0.15
  mask_token_prob: float = 0.8  # of the chosen tokens: replaced by [MASK]
  random_token_prob: float = 0.1  # replaced by a random non-special token; rest unchanged
  whole_word: bool = False
  word_start: np.ndarray | None = None  # bool[vocab]: piece starts a word ("▁x" / not "##x")
  # The documents carry a segmenter's words (segment.py): whole_word masks those, not the
  # tokenizer's, and the builder passes mask_batch which tokens continue a word.
  segmented: bool = False
  # The tokenizer's special ids (SentencePiece: the constants; WordPiece: from its vocab).
  pad_id: int = PAD_ID
  cls_id: int = CLS_ID
  sep_id: int = SEP_ID
  mask_id: int = MASK_ID
  # Ids a random replacement is drawn from; None: [NUM_SPECIAL, vocab_size).
  random_ids: np.ndarray | None = None


def replacement_ids(vocab_size: int, special_ids: dict[str, int]) -> np.ndarray:
  """Every id but the five special ones (WordPiece's [unusedN] stay, as in google's code)."""
  return np.setdiff1d(np.arange(vocab_size), list(special_ids.values())).astype(np.int64)


def mask_batch(
    input_ids_BxL: np.ndarray,
    keys_B: np.ndarray,
    spec: MaskSpec,
    continues_BxL: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
  """Chooses and applies MLM masks; returns input_ids, masked_positions/ids/weights.

  As google-research/bert: n = min(P, max(1, round(tokens * mask_prob))) tokens (or whole
  words), where tokens counts [CLS] and [SEP]s but not padding, are chosen among the
  non-special ones in a random order of words; a word that would overflow n ends the choice,
  so whole-word masking can choose slightly fewer. `continues_BxL` (whole-word only): the
  tokens that continue a segmenter's word, instead of the tokenizer's word starts; such words
  (often of several tokens) are chosen as google-research/bert chooses whole words: one that
  would overflow n is passed over and later, shorter ones still fill the rest, so the share
  of masked tokens stays at mask_prob.
  """
  B, L = input_ids_BxL.shape
  ids = input_ids_BxL
  candidate = (ids != spec.pad_id) & (ids != spec.cls_id) & (ids != spec.sep_id)
  n_tokens_B = (ids != spec.pad_id).sum(axis=1)
  n_pred_B = np.minimum(
      spec.max_predictions, np.maximum(1, np.round(n_tokens_B * spec.mask_prob).astype(np.int64))
  )
  n_pred_B = np.where(candidate.any(axis=1), n_pred_B, 0)
  pos_L = np.arange(L, dtype=np.uint64)
  row_keys = keys_B.astype(np.uint64)[:, None]
  # Word starts: every token, or (whole-word) word-start pieces and tokens after a special one.
  if spec.whole_word:
    own = ~continues_BxL if continues_BxL is not None else spec.word_start[ids]
    starts = own | ~candidate | ~np.roll(candidate, 1, axis=1)
    starts[:, 0] = True
  else:
    starts = np.ones_like(candidate)
  start_pos = np.maximum.accumulate(np.where(starts, np.arange(L), 0), axis=1)
  word_score = uniform(key(row_keys, _SELECT, pos_L))
  score = np.take_along_axis(word_score, start_pos, axis=1)
  score = np.where(candidate, score, 2.0)  # non-candidates sort last
  order = np.lexsort((np.broadcast_to(np.arange(L), (B, L)), score), axis=1)
  taken = np.cumsum(np.take_along_axis(candidate, order, axis=1), axis=1)
  # A token is chosen if its whole word fits: the count at the word's last sorted token.
  sorted_start = np.take_along_axis(start_pos, order, axis=1)
  word_end = np.ones((B, L), bool)
  word_end[:, :-1] = sorted_start[:, 1:] != sorted_start[:, :-1]
  if continues_BxL is not None:
    chosen_sorted = _fill_with_words(
        sorted_start, np.take_along_axis(candidate, order, 1), n_pred_B
    )
  else:
    end_count = np.minimum.accumulate(np.where(word_end, taken, L + 1)[:, ::-1], axis=1)[:, ::-1]
    chosen_sorted = (end_count <= n_pred_B[:, None]) & np.take_along_axis(candidate, order, 1)
  chosen = np.zeros((B, L), bool)
  np.put_along_axis(chosen, order, chosen_sorted, axis=1)
  return _apply(ids, chosen, row_keys, pos_L, spec)


def _fill_with_words(
    sorted_start: np.ndarray, candidate_sorted: np.ndarray, n_pred_B: np.ndarray
) -> np.ndarray:
  """Chosen tokens, in the random order of words (`sorted_start`: each sorted token's word
  start), taking every word that still fits in n and passing over those that do not."""
  B, L = sorted_start.shape
  new_word = np.ones((B, L), bool)
  new_word[:, 1:] = sorted_start[:, 1:] != sorted_start[:, :-1]
  word = np.cumsum(new_word, axis=1) - 1  # the word's rank in the random order
  rows = np.broadcast_to(np.arange(B)[:, None], (B, L))
  size = np.zeros((B, L), np.int64)
  np.add.at(size, (rows, word), candidate_sorted)
  take = np.zeros((B, L), bool)
  have = np.zeros(B, np.int64)
  for k in range(int(word.max(initial=0)) + 1):
    if (have >= n_pred_B).all():
      break
    fits = (size[:, k] > 0) & (have + size[:, k] <= n_pred_B)
    take[:, k] = fits
    have += np.where(fits, size[:, k], 0)
  return take[rows, word] & candidate_sorted


def _apply(
    ids: np.ndarray, chosen: np.ndarray, row_keys: np.ndarray, pos_L: np.ndarray, spec: MaskSpec
) -> dict[str, np.ndarray]:
  B, L = ids.shape
  P = spec.max_predictions
  action = uniform(key(row_keys, _ACTION, pos_L))
  draw = key(row_keys, _RANDOM_TOKEN, pos_L)
  if spec.random_ids is None:
    random_ids = NUM_SPECIAL + (draw % np.uint64(spec.vocab_size - NUM_SPECIAL)).astype(np.int64)
  else:  # for SentencePiece the table is [NUM_SPECIAL, vocab): the same ids as above
    random_ids = spec.random_ids[(draw % np.uint64(len(spec.random_ids))).astype(np.int64)]
  replaced = np.where(
      action < spec.mask_token_prob,
      spec.mask_id,
      np.where(action < spec.mask_token_prob + spec.random_token_prob, random_ids, ids),
  )
  out_ids = np.where(chosen, replaced, ids).astype(np.int32)
  # Positions in increasing order, padded with 0 and weight 0.
  n_B = chosen.sum(axis=1)
  positions = np.argsort(~chosen, axis=1, kind="stable")[:, :P]
  valid = np.arange(P)[None, :] < n_B[:, None]
  positions = np.where(valid, positions, 0)
  masked_ids = np.where(valid, np.take_along_axis(ids, positions, axis=1), 0)
  return {
      "input_ids": out_ids,
      "masked_positions": positions.astype(np.int32),
      "masked_ids": masked_ids.astype(np.int32),
      "masked_weights": valid.astype(np.int32),
  }
