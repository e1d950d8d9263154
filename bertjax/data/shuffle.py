"""`prepare`'s external shuffle of the documents and the round-robin shard writers.

Each document (a framed TFRecord) goes to a seeded-random pile file; then each pile, of about
`shuffle_bytes`, is read back, shuffled in memory and dealt round-robin into the shards.
Random piles in random order are a uniformly random permutation, so any run of consecutive
documents of a shard is a random sample of the corpus. Memory: one pile (a pile over
`shuffle_bytes`, e.g. from a TFDS corpus of unknown size, is first scattered again into
smaller ones); disk: the records twice, briefly. The directory is an `epath.Path` (`prepare`
gives a local one; any `bertjax.runtime.fs` path works).
"""

from __future__ import annotations

import contextlib
import random
import struct
from typing import Iterator

from etils import epath

from bertjax.data import corpus, records

MAX_PILES = 128  # pile files of one split open at once
_PILE_HEADER = struct.Struct("<IIQ")  # sentences, tokens, then the record's own length field


class Shuffler:
  """The external shuffle of one split (module docstring): piles, then each in memory."""

  def __init__(
      self,
      directory: epath.Path,
      split: str,
      expected_bytes: int,
      shuffle_bytes: int,
      rng: random.Random,
  ):
    self.dir, self.split, self.shuffle_bytes, self.rng = directory, split, shuffle_bytes, rng
    n = max(1, min(MAX_PILES, -(-expected_bytes // shuffle_bytes)))
    self.piles = [directory / f"{split}-{i:05d}.pile" for i in range(n)]
    self.counts = [0] * n
    self._open = contextlib.ExitStack()
    self._files = [self._open.enter_context(p.open("wb")) for p in self.piles]

  def add(self, record: bytes, sentences: int, tokens: int) -> None:
    """Appends one framed record to a random pile, with its sentence and token counts."""
    i = self.rng.randrange(len(self._files))
    self._files[i].write(struct.pack("<II", sentences, tokens) + record)
    self.counts[i] += 1

  def close(self) -> None:
    self._open.close()

  def shuffled(self) -> Iterator[tuple[bytes, int, int]]:
    """(framed record, sentences, tokens) of the split in shuffled order; deletes piles."""
    self.close()
    yield from self._drain(list(zip(self.piles, self.counts)))

  def _drain(self, piles: list[tuple[epath.Path, int]]) -> Iterator[tuple[bytes, int, int]]:
    for path, count in piles:
      size = corpus.file_size(path)
      if size > self.shuffle_bytes and count > 1:
        yield from self._drain(self._scatter(path, -(-size // self.shuffle_bytes)))
        continue
      with path.open("rb") as f:
        entries = list(_pile_entries(f))
      path.unlink()
      self.rng.shuffle(entries)
      yield from entries

  def _scatter(self, path: epath.Path, n: int) -> list[tuple[epath.Path, int]]:
    """Splits an oversized pile into `n` (2 to MAX_PILES) random smaller ones."""
    n = max(2, min(MAX_PILES, n))
    subs, counts = [path.with_name(f"{path.name}.{i:03d}") for i in range(n)], [0] * n
    with contextlib.ExitStack() as stack:
      outs = [stack.enter_context(p.open("wb")) for p in subs]
      with path.open("rb") as f:
        for record, sentences, tokens in _pile_entries(f):
          i = self.rng.randrange(n)
          outs[i].write(struct.pack("<II", sentences, tokens) + record)
          counts[i] += 1
    path.unlink()
    return list(zip(subs, counts))


def _pile_entries(f) -> Iterator[tuple[bytes, int, int]]:
  """(framed record, sentences, tokens) of a pile file, in file order."""
  while header := f.read(_PILE_HEADER.size + 4):
    sentences, tokens, n = _PILE_HEADER.unpack(header[: _PILE_HEADER.size])
    yield header[8:] + f.read(n + 4), sentences, tokens


class Writers:
  """Round-robin TFRecord writers for the train and eval splits, in `directory`.

  `counts` is the number of shards of each split for this worker (`worker_index` of
  `num_workers`); shard names carry their global index, so workers never collide.
  """

  def __init__(
      self, directory: epath.Path, counts: dict[str, int], worker_index: int, num_workers: int
  ):
    self.shards, self._writers, self._next = [], {}, {"train": 0, "eval": 0}
    self._open = contextlib.ExitStack()
    for split, n in counts.items():
      for i in range(n):
        name = records.shard_name(split, worker_index * n + i, num_workers * n)
        f = self._open.enter_context((directory / name).open("wb"))
        self._writers.setdefault(split, []).append(f)
        self.shards.append(
            {"file": name, "split": split, "documents": 0, "sentences": 0, "tokens": 0, "bytes": 0}
        )
    self._offset = {"train": 0, "eval": counts["train"]}

  def write(self, record: bytes, sentences: int, tokens: int, split: str) -> None:
    k = self._next[split]
    self._next[split] = (k + 1) % len(self._writers[split])
    self._writers[split][k].write(record)
    shard = self.shards[self._offset[split] + k]
    shard["documents"] += 1
    shard["bytes"] += len(record)
    shard["sentences"] += sentences
    shard["tokens"] += tokens

  def close(self) -> None:
    self._open.close()
