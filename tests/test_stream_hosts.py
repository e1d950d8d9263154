"""Resume on another host count: H hosts save, H' hosts go on, and within each epoch every row
(so every document) is used exactly once.

H hosts are simulated in one process: H streams with process_index 0..H-1, drawn in lockstep as
the hosts of one run draw one global batch per step.
"""

import collections
import json

import numpy as np
import pytest

from bertjax.data import pretraining, records

BATCH = 24  # global rows per step: divisible by 1, 2, 3 and 4 hosts


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, prepare_austen) -> str:
  return prepare_austen(tmp_path_factory.mktemp("austen"), 600_000, num_shards=5)


def _cfg(data_dir, packing: bool) -> pretraining.InputConfig:
  return pretraining.InputConfig(
      source="prepared", path=data_dir, seed=5, shuffle_buffer=3, packing=packing
  )


def _streams(cfg, hosts: int, states: list | None = None) -> list:
  return [
      pretraining.make_stream(
          cfg,
          global_batch_size=BATCH,
          process_index=h,
          process_count=hosts,
          state=states[h] if states else None,
      )
      for h in range(hosts)
  ]


def _rows(batch: dict) -> list[bytes]:
  """One key per row: all its features' bytes."""
  names = sorted(batch)
  return [b"".join(batch[k][r].tobytes() for k in names) for r in range(len(batch["input_ids"]))]


def _epoch_rows(cfg, epoch: int) -> collections.Counter:
  """Every row of the epoch, each as often as it is in the epoch's blocks."""
  builder = _streams(cfg, 1)[0].builder
  B = builder.blocks_per_epoch
  return collections.Counter(
      r for t in range(epoch * B, (epoch + 1) * B) for r in _rows(builder(t))
  )


def _saved(streams) -> list[dict]:
  return [json.loads(json.dumps(s.get_state())) for s in streams]  # as a checkpoint stores it


def _draw(streams, steps: int, seen: collections.Counter) -> None:
  for _ in range(steps):
    for s in streams:
      seen.update(_rows(next(s)))


def _run(cfg, chain: list[tuple[int, int | None]]) -> tuple[collections.Counter, list[str]]:
  """(hosts, steps) after (hosts, steps): each stage resumes the one before on its host count;
  steps None: until the hosts are in different epochs. The last stage runs until every host is
  two epochs on. Returns the rows drawn and what each carry-over said."""
  seen, said, states = collections.Counter(), [], None
  for i, (hosts, steps) in enumerate(chain):
    if states is not None and len(states) != hosts:
      states, message = pretraining.resume_states(states, hosts)
      said.append(message)
    streams = _streams(cfg, hosts, states)
    if i == len(chain) - 1:
      while any(
          s.get_state()["epoch"] < 2 or s.plan(s.item)[0] < len(s.plan.leftover) for s in streams
      ):
        _draw(streams, 1, seen)
    elif steps is None:
      while len({s.get_state()["epoch"] for s in streams}) == 1:
        _draw(streams, 1, seen)
    else:
      _draw(streams, steps, seen)
    states = _saved(streams)
  return seen, said


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize(
    "chain",
    [
        [(2, 37), (1, None)],
        [(1, 41), (2, None)],
        [(2, 29), (3, None)],
        [(3, 23), (2, 19), (4, None)],
        [(2, None), (3, 11), (1, None)],  # saved while the hosts were in different epochs
    ],
    ids=["2-1", "1-2", "2-3", "3-2-4", "2-3-1 across an epoch's end"],
)
def test_every_row_of_the_epoch_once_across_host_counts(data_dir, packing, chain):
  cfg = _cfg(data_dir, packing)
  seen, said = _run(cfg, chain)
  for epoch in (0, 1):
    want = _epoch_rows(cfg, epoch)
    got = collections.Counter({r: seen[r] for r in want})
    assert sum(want.values()) > 500
    assert got == want, (epoch, sum((got - want).values()), sum((want - got).values()))
  assert len(said) == sum(a[0] != b[0] for a, b in zip(chain, chain[1:]))
  assert all("shared out among" in m for m in said)


def test_the_blocks_hold_every_document_once(data_dir):
  cfg = _cfg(data_dir, False)
  builder = _streams(cfg, 1)[0].builder
  docs = [(s, r) for t in range(builder.blocks_per_epoch) for s, r, _ in builder.documents(t)]
  train = records.split_shards(records.load_metadata(data_dir), data_dir, "train")
  assert len(docs) == len(set(docs)) == sum(s["documents"] for s in train)


@pytest.mark.parametrize("packing", [False, True])
def test_same_host_count_resumes_exactly(data_dir, packing):
  cfg = _cfg(data_dir, packing)
  streams = _streams(cfg, 3)
  _draw(streams, 17, collections.Counter())
  resumed = _streams(cfg, 3, _saved(streams))
  for _ in range(40):
    for a, b in zip(streams, resumed):
      x, y = next(a), next(b)
      for k in x:
        np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_hosts_take_the_one_host_blocks_in_turns(data_dir):
  """Host h of H builds blocks h, h+H, ...: its first rows are those of block h."""
  cfg = _cfg(data_dir, False)
  builder = _streams(cfg, 1)[0].builder
  for h, s in enumerate(_streams(cfg, 3)):
    first = builder(h)
    batch = next(s)
    n = min(len(first["input_ids"]), BATCH // 3)
    for k in batch:
      np.testing.assert_array_equal(batch[k][:n], first[k][:n], err_msg=k)


def test_a_carry_over_keeps_the_state_small_and_the_settings_checked(data_dir):
  cfg = _cfg(data_dir, False)
  streams = _streams(cfg, 4)
  _draw(streams, 30, collections.Counter())
  states, _ = pretraining.resume_states(_saved(streams), 3)
  assert all(len(json.dumps(s)) < 1000 for s in states)
  assert [s["process_index"] for s in states] == [0, 1, 2]
  bad = _saved(streams)
  bad[1]["seed"] += 1
  with pytest.raises(ValueError, match=r"disagree on \['seed'\]"):
    pretraining.resume_states(bad, 3)
  old = [{k: v for k, v in s.items() if k not in ("leftover", "untouched_from")} for s in bad]
  with pytest.raises(ValueError, match="earlier version"):
    pretraining.make_stream(
        cfg, global_batch_size=BATCH, process_index=0, process_count=4, state=old[0]
    )
