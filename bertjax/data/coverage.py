"""Character coverage: which characters of a corpus get their own SentencePiece piece.

SentencePiece gives each character of `character_coverage` of the text's character occurrences a
piece of its own; the rest become UTF-8 byte pieces (byte fallback) or [UNK]. An alphabetic
script fits whole (coverage 1.0); Chinese or Japanese may not: `choose_character_coverage`
then keeps the most frequent characters within CHARACTER_SHARE of the vocabulary, so that
multi-character pieces keep the rest. SentencePiece accepts coverages in [MIN_COVERAGE, 1].
"""

from __future__ import annotations

import collections
import unicodedata
from typing import Sequence

from bertjax import errors
from bertjax.data import wordpiece
from bertjax.runtime import fs

NUM_SPECIAL = len(wordpiece.SPECIAL_PIECES)  # [PAD] [UNK] [CLS] [SEP] [MASK], in every vocabulary

# With an automatic coverage, characters take at most this share of the vocabulary left after
# the special and byte pieces; the rest goes to multi-character pieces.
CHARACTER_SHARE = 0.7
MIN_COVERAGE = 0.98  # SentencePiece's lower bound on character_coverage
# Characters counted for the automatic coverage (the head of the corpus; SentencePiece itself
# samples `input_sentence_size` sentences).
_COUNT_CHARS = 200_000_000


def count_characters(files: Sequence[str], limit: int = _COUNT_CHARS) -> collections.Counter:
  """Occurrences of each non-space character (NFKC, as SentencePiece normalises) in `files`."""
  counts: collections.Counter = collections.Counter()
  seen = 0
  for path in files:
    with fs.open_text(path) as f:
      for line in f:
        line = unicodedata.normalize("NFKC", line)
        counts.update(line)
        seen += len(line)
        if seen >= limit:
          break
    if seen >= limit:
      break
  for ch in (" ", "\t", "\n", "\r"):
    counts.pop(ch, None)
  return counts


def choose_character_coverage(
    counts: collections.Counter, vocab_size: int, byte_fallback: bool = True
) -> tuple[float, int]:
  """(coverage, characters kept): 1.0 if every character fits, else the largest coverage
  whose most frequent characters fill at most CHARACTER_SHARE of the free vocabulary.

  SentencePiece accepts coverages in [MIN_COVERAGE, 1]: a vocabulary too small for the
  characters of MIN_COVERAGE of the text is an error that gives the size needed.
  """
  reserved = NUM_SPECIAL + (256 if byte_fallback else 0)
  free = vocab_size - reserved
  budget = int(CHARACTER_SHARE * free)
  if len(counts) <= budget:
    return 1.0, len(counts)
  total = sum(counts.values())
  ranked = [n for _, n in counts.most_common()]
  need, covered = 0, 0
  while covered < MIN_COVERAGE * total:  # characters SentencePiece keeps at MIN_COVERAGE
    covered += ranked[need]
    need += 1
  if need >= free:
    raise errors.ConfigError(
        f"TrainOptions.vocab_size={vocab_size} is too small for this corpus: SentencePiece "
        f"keeps every character of {MIN_COVERAGE:.0%} of the text ({need} distinct ones here) "
        f"plus {reserved} special/byte pieces — use TrainOptions.vocab_size >= "
        f"{-(-int((need + reserved) / CHARACTER_SHARE) // 1000) * 1000}"
    )
  budget = max(budget, need)
  covered = sum(ranked[:budget])
  # Rounded down to 4 digits: SentencePiece then keeps at most `budget` characters.
  return max(int(covered / total * 1e4) / 1e4, MIN_COVERAGE), budget
