"""Word segmentation for whole-word masking in languages written without spaces (Chinese).

`prepare --word-segmenter jieba` segments each sentence of every document once, with the
tokenizer's own tokens, and stores beside the token ids how many tokens each word has
(`word_lengths` in the record, records.py). A token begins a word when the character it begins
with (after the whitespace of a "▁") begins a word of the segmenter; otherwise it continues the
word before it, so the pieces of one word, its "##" pieces and the byte pieces of one character
stay together. For a tokenizer that gives Chinese one token per character (BERT's WordPiece) a
word of tokens is exactly a word of the segmenter; a SentencePiece piece that spans the end of
a segmenter word joins that word to the next, so a word of tokens is then a run of whole
segmenter words. The stream masks these words whole (`InputConfig.whole_word_mask`), the same
way with any tokenizer, packed or not, in its worker processes too.

Segmenters: `jieba` (PyPI `jieba`, its default dictionary and HMM for unknown words), pure
Python with its dictionary in the package, so it installs and runs anywhere with nothing to
download. Chinese-BERT-wwm (Cui et al.) segmented with LTP, whose models are downloaded
separately; LTP and pkuseg are not offered here.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from bertjax import errors

SEGMENTERS = ("jieba",)


def check_name(name: str | None, field: str = "PrepareConfig.word_segmenter") -> None:
  if name is not None and name not in SEGMENTERS:
    raise errors.ConfigError(
        f"{field}={name!r}: valid options are " + ", ".join(repr(s) for s in SEGMENTERS)
    )


def version(name: str) -> str:
  return load(name).__version__ if name == "jieba" else ""


def load(name: str):
  """The segmenter's module, initialised (its dictionary loaded); a one-line error when the
  package is missing."""
  check_name(name)
  try:
    import jieba
  except ImportError:
    raise errors.ConfigError(
        f"--word-segmenter {name}: the `{name}` package is not installed — pip install "
        f"'bertjax[chinese]' (or {name}), or prepare without --word-segmenter"
    ) from None
  jieba.setLogLevel(logging.WARNING)  # not its "Building prefix dict" lines on every worker
  jieba.initialize()
  return jieba


def word_starts(segmenter, text: str) -> set[int]:
  """Indices in `text` of the characters that begin a word of the segmenter."""
  return {start for _, start, _ in segmenter.tokenize(text)}


def encode_words(tok, segmenter, text: str) -> tuple[list[int], list[int]]:
  """(token ids of `text`, tokens per word), the word lengths summing to the ids' count.

  `tok.encode_with_offsets` gives the character each token begins with: a token begins a
  word when that character begins a segmenter word and the token before began elsewhere (the
  "##" pieces of a word and the byte pieces of a character share their character)."""
  ids, offsets = tok.encode_with_offsets(text)
  starts = word_starts(segmenter, text) if ids else set()
  lengths: list[int] = []
  previous = None
  for offset in offsets:
    if not lengths or (offset != previous and offset in starts):
      lengths.append(1)
    else:
      lengths[-1] += 1
    previous = offset
  return ids, lengths


def encoder(tok, name: str) -> Callable[[str], tuple[list[int], list[int]]]:
  """`encode_words` with this tokenizer and segmenter, for `prepare`'s worker processes."""
  segmenter = load(name)
  return lambda text: encode_words(tok, segmenter, text)


def continuation_flags(word_lengths: np.ndarray, n_tokens: int) -> np.ndarray:
  """bool per token: it continues a word (not its first token). Lengths that do not add up to
  the tokens (a damaged record) are ignored: every token starts a word, as without them."""
  flags = np.zeros(n_tokens, bool)
  word_lengths = np.asarray(word_lengths, np.int64)
  if not len(word_lengths) or word_lengths.sum() != n_tokens or (word_lengths < 1).any():
    return flags
  flags[:] = True
  flags[np.cumsum(word_lengths)[:-1]] = False
  flags[0] = False
  return flags


def mark(tokens: np.ndarray, continues: np.ndarray) -> np.ndarray:
  """Token ids with every word-continuing token stored as ~id (negative), so that the word
  boundaries travel with the ids through pairing, truncation and packing; `unmark` undoes it."""
  return np.where(continues, ~tokens, tokens).astype(tokens.dtype)


def unmark(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(ids, bool: continues a word) of `mark`ed ids."""
  continues = ids < 0
  return np.where(continues, ~ids, ids).astype(ids.dtype), continues
