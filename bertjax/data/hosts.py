"""Which blocks each host takes, and the stream that cuts them into batches.

A prepared stream's blocks are a pure function of their number t (`blocks.BlockBuilder`);
this module decides which t each host builds (`HostPlan`), cuts their rows into this host's
batches (`PreparedStream`), and carries the hosts' saved positions over to another host count
(`resume_states`). `pretraining.make_stream` builds the stream; the module docstring there has
the whole design.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from bertjax import errors
from bertjax.data import mixture, prefetch
from bertjax.data.blocks import BlockBuilder
from bertjax.data.input_config import InputConfig

# What must agree between the states of the hosts of one run to carry them to another host count.
_SHARED = ("source", "split", "seed", "seq_len", "pair_mode", "global_batch_size", "packing")


@dataclasses.dataclass(frozen=True)
class HostPlan:
  """The blocks one host takes, in order, from a saved position on: a pure function of i.

  The schedule is the `leftover` items, then blocks t = `untouched_from`, +1, ... counted across
  epochs, endlessly; an item is (epoch, block, first row): a block that other hosts left partly
  used (first row > 0) or untouched. Host h of H takes positions h, h+H, ... of it in turn,
  from `position` on. A fresh stream's schedule is blocks 0, 1, 2, ...: with one host, the
  blocks in order; with H, block t is host t mod H's.
  """

  blocks_per_epoch: int  # B
  hosts: int  # H: hosts sharing the schedule
  leftover: tuple[tuple[int, int, int], ...]
  untouched_from: int  # t of the first block after `leftover`
  position: int  # the host's current position in the schedule

  def item(self, q: int) -> tuple[int, int, int]:
    """Item q of the schedule: (epoch, block, first row)."""
    if q < len(self.leftover):
      return tuple(self.leftover[q])
    return divmod(self.untouched_from + q - len(self.leftover), self.blocks_per_epoch) + (0,)

  def __call__(self, i: int) -> tuple[int, tuple[int, int, int]]:
    """The host's i-th item from `position` on: (position in the schedule, item)."""
    q = self.position + i * self.hosts
    return q, self.item(q)


class _HostBlocks:
  """i -> the rows of the host's i-th block (picklable, for the worker processes)."""

  def __init__(self, builder: BlockBuilder, plan: HostPlan):
    self.builder, self.plan = builder, plan

  def __call__(self, i: int) -> dict[str, np.ndarray]:
    _, (epoch, block, _) = self.plan(i)
    return self.builder(epoch * self.builder.blocks_per_epoch + block)


class PreparedStream:
  """Batches built on the fly from the blocks this host takes; see the module docstring.

  Blocks are built by `BlockBuilder` in the order of `plan`, in this process or on `workers`
  processes (prefetch.map_blocks); this object only cuts their rows into batches.
  """

  def __init__(
      self,
      cfg: InputConfig,
      builder: BlockBuilder,
      rows: int,
      fingerprint: dict,
      state: dict,
  ):
    self.cfg, self.builder, self.rows, self.fingerprint = cfg, builder, rows, fingerprint
    self.spec, self.shards, self.reader = builder.spec, builder.shards, builder.reader
    B = builder.blocks_per_epoch
    # A state saved before the schedules (one host) holds the epoch and block of its position.
    position = state.get("epoch", 0) * B + state.get("block", 0)
    self.plan = HostPlan(
        blocks_per_epoch=B,
        hosts=fingerprint["process_count"],
        leftover=tuple(tuple(x) for x in state.get("leftover", ())),
        untouched_from=state.get("untouched_from", 0),
        position=state.get("position", position + fingerprint["process_index"]),
    )
    self.item = 0  # items of `plan` used up
    self.offset = state.get("offset", self.plan(0)[1][2])  # rows of the current block used
    self.step = state.get("step", 0)
    self._blocks: Iterator | None = None  # block features from the current block on
    self._current: dict[str, np.ndarray] | None = None  # the current block's rows

  def _read_from(self, epoch: int, first_doc: int) -> Iterator[tuple[int, int, list]]:
    """(shard id, record, sentences) of epoch `epoch` from document `first_doc` on."""
    for e, block in self.builder.read_blocks(epoch, first_doc, num_epochs=1):
      if e != epoch:
        return
      yield from block

  def _load_block(self) -> None:
    if self._blocks is None:
      self._blocks = prefetch.map_blocks(
          _HostBlocks(self.builder, self.plan), self.item, self.cfg.workers
      )
    self._current = next(self._blocks)

  def __iter__(self) -> "PreparedStream":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = self.take(self.rows)
    self.step += 1
    return batch

  def upcoming_real_tokens(self) -> float:
    """Mean real tokens per row of the current block (loaded if not yet): what a mixture
    expects of this source's rows before it has drawn any (mixture.py)."""
    if self._current is None:
      self._load_block()
    return float(self._current["attention_mask"].sum(1).mean())

  def take(self, rows: int) -> dict[str, np.ndarray]:
    """The next `rows` rows (a batch, or a mixture's share of one: mixture.py)."""
    parts, need = [], rows
    while need:
      if self._current is None:
        self._load_block()
      n = len(self._current["input_ids"])
      take = min(need, n - self.offset)
      parts.append({k: v[self.offset : self.offset + take] for k, v in self._current.items()})
      self.offset, need = self.offset + take, need - take
      if self.offset >= n:  # the block is used up: on to the host's next one
        self.item, self._current = self.item + 1, None
        self.offset = self.plan(self.item)[1][2]
    if len(parts) == 1:
      return {k: np.ascontiguousarray(v) for k, v in parts[0].items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def close(self) -> None:
    """Stops the worker processes, if any (the stream cannot go on after this)."""
    blocks, self._blocks = self._blocks, None
    prefetch.close(blocks)

  def get_state(self) -> dict:
    position, (epoch, block, _) = self.plan(self.item)
    return {
        **self.fingerprint,
        "epoch": epoch,
        "block": block,
        "offset": self.offset,
        "position": position,
        "leftover": [list(x) for x in self.plan.leftover],
        "untouched_from": self.plan.untouched_from,
        "blocks_per_epoch": self.builder.blocks_per_epoch,
        "step": self.step,
    }


def resume_states(saved: list[dict], process_count: int) -> tuple[list[dict], str]:
  """The states of a run's H hosts -> those of `process_count` hosts, and what was done.

  What the old hosts left of their shared schedule (`HostPlan`) -- the blocks they had partly
  used, to be finished from their offsets, the blocks some of them had not reached yet, then
  every block after those -- becomes the schedule the new hosts take in turns: within an epoch
  no document is used twice or skipped, across any number of such changes.
  """
  first = saved[0]
  if "sources" in first:  # a mixture: each source's stream carried over on its own
    return mixture.resume_states(saved, process_count, resume_states)
  agree = _SHARED + ("step", "blocks_per_epoch", "leftover", "untouched_from")
  differ = {k for s in saved for k in agree if s.get(k) != first.get(k)}
  if differ:
    raise errors.ConfigError(f"the saved input states of the hosts disagree on {sorted(differ)}")
  hosts = len(saved)
  common = {k: first[k] for k in _SHARED + ("max_examples_per_row", "step") if k in first}
  new = [
      {**common, "process_index": i, "process_count": process_count} for i in range(process_count)
  ]
  if first.get("source") == "synthetic":  # batch s is f(seed, s) for any host count
    return new, f"the synthetic stream goes on at step {first['step']}"
  if "blocks_per_epoch" not in first:
    raise errors.ConfigError(
        f"the input position of {hosts} host(s) was saved by an earlier version of the stream "
        "(which gave each host whole shard files) and cannot be shared out"
    )
  # All the hosts share one schedule; host h is at position p_h, offset o_h rows into it.
  B = first["blocks_per_epoch"]
  plan = HostPlan(
      blocks_per_epoch=B,
      hosts=hosts,
      leftover=tuple(tuple(x) for x in first["leftover"]),
      untouched_from=first["untouched_from"],
      position=0,
  )
  positions = [(s["position"], s["offset"]) for s in saved]
  # From `tail` on, every position is left and plain; before it, host h's positions from p_h.
  tail = max([len(plan.leftover)] + [p + 1 for p, _ in positions])
  items = []
  for q in range(min(p for p, _ in positions), tail):
    p, offset = positions[q % hosts]
    if q >= p:
      e, b, row = plan.item(q)
      items.append((e, b, offset if q == p else row))
  items = sorted(x for x in items if x[2] > 0) + sorted(x for x in items if x[2] == 0)
  untouched_from = plan.untouched_from + tail - len(plan.leftover)
  for s in new:
    h = s["process_index"]
    e, b, row = items[h] if h < len(items) else divmod(untouched_from + h - len(items), B) + (0,)
    s.update(
        epoch=e,
        block=b,
        offset=row,
        position=h,
        leftover=[list(x) for x in items],
        untouched_from=untouched_from,
        blocks_per_epoch=B,
    )
  partly = sum(x[2] > 0 for x in items)
  e, b = divmod(untouched_from, B)
  return new, (
      f"{partly} partly used and {len(items) - partly} skipped-over block(s) are shared out "
      f"among {process_count} host(s), then every block from block {b} of epoch {e} on"
  )
