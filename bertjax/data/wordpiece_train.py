"""Training a WordPiece vocabulary (`bertjax tokenizer train --kind wordpiece`): a BERT
vocab.txt, read by `bertjax.data.wordpiece.WordPieceTokenizer`. Its inputs are checked as
SentencePiece training checks them (tokenizer_train.py).
"""

from __future__ import annotations

import collections
import heapq
import json
import sys
from typing import Sequence

from etils import epath

from bertjax import errors
from bertjax.data import wordpiece
from bertjax.data.tokenizer import NUM_SPECIAL, SPECIAL_PIECES
from bertjax.data.tokenizer_train import DEFAULT_VOCAB_SIZE, expand_inputs, text_files
from bertjax.runtime import fs, outputs

WORDPIECE_CONFIG = "tokenizer_config.json"


def _check_wordpiece_output(output_dir: str, overwrite: bool) -> None:
  """`output_dir` is (or can become) a directory, and holds no vocab.txt (unless overwrite)."""
  out = fs.path(output_dir)
  if out.exists() and not out.is_dir():
    raise errors.ConfigError(
        f"output_dir {output_dir}: is a file — give a directory (vocab.txt and "
        f"{WORDPIECE_CONFIG} are written in it)"
    )
  if (out / "vocab.txt").exists() and not overwrite:
    raise errors.OutputExistsError(
        f"output_dir {output_dir}: {epath.Path(output_dir) / 'vocab.txt'} already exists — "
        "pass overwrite=True to replace it, or choose another output_dir"
    )
  outputs.missing_dirs(output_dir, "output_dir")


WORDPIECE_MIN_COUNT = 2  # a merge seen once is a memorised word, not a piece


def _merge_pieces(words: dict[tuple[str, ...], int], target: int, have: set[str]) -> list[str]:
  """New pieces, in order, from merging adjacent pieces of `words` (word as its pieces ->
  count): always the pair seen most often (ties: the smallest pair in code-point order, so the
  result depends on the corpus only), until `have` plus the new pieces reach `target`, or no pair
  is seen WORDPIECE_MIN_COUNT times. As `tokenizers`' WordPieceTrainer merges, without its
  order of ties, which varies from run to run."""
  symbols = [list(w) for w in words]
  counts = list(words.values())
  pairs: dict[tuple[str, str], int] = collections.Counter()
  where: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
  for i, (w, n) in enumerate(zip(symbols, counts)):
    for pair in zip(w, w[1:]):
      pairs[pair] += n
      where[pair].add(i)
  heap = [(-n, pair) for pair, n in pairs.items()]
  heapq.heapify(heap)
  new: list[str] = []
  while heap and len(have) < target:
    n, pair = heapq.heappop(heap)
    if -n != pairs.get(pair, 0):
      continue  # a stale count: the pair's current one is also on the heap
    if -n < WORDPIECE_MIN_COUNT:
      break
    a, b = pair
    merged = a + b[len(wordpiece.SUFFIX) :]
    if merged not in have:
      have.add(merged)
      new.append(merged)
    touched = set()
    for i in sorted(where.pop(pair)):
      w, c = symbols[i], counts[i]
      for old in zip(w, w[1:]):
        pairs[old] -= c
        touched.add(old)
      out, j = [], 0
      while j < len(w):
        if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
          out.append(merged)
          j += 2
        else:
          out.append(w[j])
          j += 1
      symbols[i] = out
      for fresh in zip(out, out[1:]):
        pairs[fresh] += c
        where[fresh].add(i)
        touched.add(fresh)
    for t in touched:
      if pairs[t] > 0:
        heapq.heappush(heap, (-pairs[t], t))
      else:
        pairs.pop(t, None)
        where.pop(t, None)
  return new


def train_wordpiece(
    inputs: Sequence[str],
    output_dir: str,
    vocab_size: int | None = None,
    lower_case: bool = True,
    overwrite: bool = False,
) -> "wordpiece.WordPieceTokenizer":
  """Trains a BERT WordPiece vocabulary: `output_dir/vocab.txt` and, beside it,
  `tokenizer_config.json` (`do_lower_case`, read by `wordpiece.load_tokenizer` and by
  transformers' `BertTokenizer.from_pretrained(output_dir)`).

  Words are those of BERT's own basic tokenization (`wordpiece.basic_tokenize`: control
  characters dropped, every CJK ideograph a word of its own, lowercasing and accent stripping
  when `lower_case`, a split at whitespace and punctuation), so the vocabulary is built on the
  words `WordPieceTokenizer` will split. Every character of the corpus gets an entry (a "##"
  one too where it continues a word): every CJK ideograph is its own piece, as in
  `bert-base-chinese`. The rest is merged pieces, as `tokenizers`' WordPieceTrainer makes them
  (the most frequent adjacent pair first) but with ties broken by code point, so the same
  corpus gives the same file (that trainer's ties follow hash order: two runs on one corpus
  gave 566 to 570 entries in six runs). Ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK], as
  in a SentencePiece model here; then the characters, the "##" characters, the merges in order.

  `vocab_size` (None: DEFAULT_VOCAB_SIZE, or what the corpus gives) counts every entry; one
  too small for the corpus's characters, or more than the corpus supports, is an error naming
  the size that trains. Inputs are checked as `train_tokenizer` checks them.
  """
  if vocab_size is not None and vocab_size < NUM_SPECIAL + 1:
    raise errors.ConfigError(
        f"TrainOptions.vocab_size={vocab_size} is too small: it must be >= {NUM_SPECIAL + 1}"
    )
  named, skipped = text_files(expand_inputs(inputs))
  _check_wordpiece_output(output_dir, overwrite)
  target = vocab_size or DEFAULT_VOCAB_SIZE
  counts: collections.Counter = collections.Counter()
  for path in named:
    with fs.open_text(path) as f:
      for line in f:
        counts.update(wordpiece.basic_tokenize(line, lower_case))
  words: dict[tuple[str, ...], int] = {}
  for word, n in counts.items():
    if len(word) <= wordpiece.MAX_WORD_CHARS:  # longer ones are [UNK] whatever the vocab
      words[(word[0],) + tuple(wordpiece.SUFFIX + ch for ch in word[1:])] = n
  alphabet = sorted({w[0] for w in words}) + sorted({p for w in words for p in w[1:]})
  pieces = list(SPECIAL_PIECES) + [p for p in alphabet if p not in SPECIAL_PIECES]
  pieces += _merge_pieces(words, target, set(pieces))
  cjk = [p for p in pieces if len(p) == 1 and wordpiece.is_cjk(p)]
  if vocab_size is not None and len(pieces) != vocab_size:
    if len(pieces) > vocab_size:
      why = (
          f"is less than the {len(pieces)} entries the corpus's characters need (each character, "
          "and each that continues a word as a ## piece, has one)"
      )
      fix = f"TrainOptions.vocab_size >= {len(pieces)}"
    else:
      why = f"is more than this corpus supports: merging finds {len(pieces)} pieces"
      fix = f"TrainOptions.vocab_size <= {len(pieces)}, or train on more text"
    raise errors.ConfigError(f"TrainOptions.vocab_size={vocab_size} {why} — use {fix}")
  out = fs.path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  config = {
      "tokenizer_class": "BertTokenizer",
      "do_lower_case": lower_case,
      "tokenize_chinese_chars": True,
      "strip_accents": None,
      "unk_token": "[UNK]",
      "sep_token": "[SEP]",
      "pad_token": "[PAD]",
      "cls_token": "[CLS]",
      "mask_token": "[MASK]",
  }
  (out / WORDPIECE_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
  data = ("\n".join(pieces) + "\n").encode("utf-8")
  if fs.is_local(output_dir):  # as `_install`: never a half-written vocab.txt under its name
    tmp = out / "vocab.txt.tmp"
    tmp.write_bytes(data)
    tmp.replace(out / "vocab.txt")
  else:
    (out / "vocab.txt").write_bytes(data)
  for path, why in skipped:
    print(f"tokenizer: {path}: {why} (skipped)", file=sys.stderr)
  print(
      f"tokenizer: {len(pieces)} WordPiece entries, {len(cjk)} of them CJK ideographs "
      f"({'uncased' if lower_case else 'cased'})",
      file=sys.stderr,
  )
  if vocab_size is None and len(pieces) != target:
    more = "more text gives more" if len(pieces) < target else "each character needs an entry"
    print(
        f"tokenizer: {len(pieces)} entries instead of the default {target} ({more})",
        file=sys.stderr,
    )
  return wordpiece.WordPieceTokenizer(out / "vocab.txt", lower_case=lower_case)
