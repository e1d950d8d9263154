"""coverage.py: every character when they fit, else the most frequent ones within the share of
the vocabulary, and never below SentencePiece's lowest coverage."""

import collections

import pytest

from bertjax import errors
from bertjax.data import coverage


def _counts(n_chars: int, skew: float = 1.0) -> collections.Counter:
  # Character i occurs about 1e6 / (i + 1)**skew times: a few frequent, a long tail.
  return collections.Counter(
      {chr(0x4E00 + i): int(1_000_000 / (i + 1) ** skew) + 1 for i in range(n_chars)}
  )


def test_every_character_fits_coverage_one():
  counts = _counts(100)
  assert coverage.choose_character_coverage(counts, 1000) == (1.0, 100)


def test_a_long_tail_gets_a_coverage_below_one_within_the_share():
  counts = _counts(3000, skew=1.5)
  cov, kept = coverage.choose_character_coverage(counts, 2500)
  budget = int(coverage.CHARACTER_SHARE * (2500 - 261))
  assert coverage.MIN_COVERAGE <= cov < 1.0 and kept == budget
  total = sum(counts.values())
  assert sum(n for _, n in counts.most_common(kept)) / total >= cov  # those kept cover it


def test_a_vocabulary_too_small_for_the_lowest_coverage_names_the_size_needed():
  with pytest.raises(
      errors.ConfigError, match=r"TrainOptions.vocab_size=2500 is too small .* >= 4000"
  ):
    coverage.choose_character_coverage(_counts(3000), 2500)


def test_count_characters_normalises_and_ignores_whitespace(tmp_path):
  (tmp_path / "a.txt").write_text("ＡＢ a\tb\n", encoding="utf-8")  # full-width letters: NFKC
  assert coverage.count_characters([str(tmp_path / "a.txt")]) == {"A": 1, "B": 1, "a": 1, "b": 1}
