"""shuffle.py: the external shuffle is a seeded permutation, also through re-scattered piles;
the writers deal documents round-robin into shards named by their global index."""

import pathlib
import random

from bertjax.data import records, shuffle


def _records(n: int) -> list[bytes]:
  return [records.frame_record(records.encode_document([[i, i + 1]])) for i in range(n)]


def _shuffle(tmp_path: pathlib.Path, seed: int, shuffle_bytes: int, n: int = 300):
  directory = tmp_path / f"s{seed}-{shuffle_bytes}"
  directory.mkdir()
  s = shuffle.Shuffler(directory, "train", 20 * n, shuffle_bytes, random.Random(seed))
  for i, record in enumerate(_records(n)):
    s.add(record, 1, i)
  out = [tokens for _, _, tokens in s.shuffled()]
  assert not list(directory.iterdir())  # the piles are deleted as they are read
  return out


def test_shuffle_is_a_seeded_permutation(tmp_path):
  order = _shuffle(tmp_path, 0, 1 << 20)
  assert sorted(order) == list(range(300)) and order != list(range(300))
  assert _shuffle(tmp_path, 0, 1 << 21) == order  # same seed, same piles: same order
  assert _shuffle(tmp_path, 1, 1 << 20) != order


def test_oversized_piles_are_scattered_again(tmp_path):
  # 64-byte piles hold about one record: every pile is scattered, records stay whole.
  order = _shuffle(tmp_path, 0, 64)
  assert sorted(order) == list(range(300))


def test_writers_deal_round_robin_with_global_shard_names(tmp_path):
  w = shuffle.Writers(tmp_path, {"train": 3, "eval": 1}, worker_index=1, num_workers=2)
  for i, record in enumerate(_records(7)):
    w.write(record, 1, 2, "eval" if i == 6 else "train")
  w.close()
  names = [s["file"] for s in w.shards]
  assert names == [
      records.shard_name("train", 3, 6),
      records.shard_name("train", 4, 6),
      records.shard_name("train", 5, 6),
      records.shard_name("eval", 1, 2),
  ]
  assert [s["documents"] for s in w.shards] == [2, 2, 2, 1]
  for s in w.shards:
    assert (tmp_path / s["file"]).stat().st_size == s["bytes"]
    assert len(list(records.read_records(str(tmp_path / s["file"])))) == s["documents"]
