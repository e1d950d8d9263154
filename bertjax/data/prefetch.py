"""Host batches to global device arrays: `global_batch`, and `prefetch_to_device`, which builds
them ahead in a background thread so that the host's input work overlaps the device's step.

    for batch in prefetch_to_device(stream, sharding):   # global jax.Arrays on `sharding`
      state = train_step(state, batch)

`Prefetcher.get_state()` is the stream's state after the batches handed out, not after those
built ahead: what a checkpoint stores to resume exactly.
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import time
from typing import Callable, Iterator

import jax
import numpy as np


def _feature_sharding(sharding, name: str, ndim: int):
  """Per-feature sharding: a dict, or one NamedSharding whose first axis is the batch."""
  if isinstance(sharding, dict):
    return sharding[name]

  if isinstance(sharding, jax.sharding.NamedSharding):
    batch_axis = sharding.spec[0] if len(sharding.spec) else None
    spec = jax.sharding.PartitionSpec(batch_axis, *([None] * (ndim - 1)))
    return jax.sharding.NamedSharding(sharding.mesh, spec)
  return sharding


def global_batch(batch: dict[str, np.ndarray], sharding) -> dict:
  """Host-local rows -> global jax.Arrays of global_batch_size rows on `sharding`."""
  out = {}
  for name, local in batch.items():
    global_shape = (local.shape[0] * jax.process_count(),) + local.shape[1:]
    out[name] = jax.make_array_from_process_local_data(
        _feature_sharding(sharding, name, local.ndim), local, global_shape
    )
  return out


class Prefetcher:
  """Iterator of global batches, `size` ahead, built by a background thread.

  The thread draws host batches and starts their transfer while the device runs the current
  step. `get_state()` is the input state *after the last batch handed out* (not after the
  ones prefetched), which is what a checkpoint must store.
  """

  def __init__(self, iterator, sharding, size: int = 2):
    self._it, self._sharding = iterator, sharding
    self._queue: queue.Queue = queue.Queue(maxsize=max(1, size))
    self._state = iterator.get_state() if hasattr(iterator, "get_state") else None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._produce, daemon=True)
    self._thread.start()

  def _produce(self) -> None:
    try:
      for host_batch in self._it:
        state = self._it.get_state() if hasattr(self._it, "get_state") else None
        item = (global_batch(host_batch, self._sharding), state, None)
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
        if self._stop.is_set():
          return
    except BaseException as e:  # surfaced in the consumer, not lost in the thread
      self._queue.put((None, None, e))
      return
    self._queue.put((None, None, StopIteration()))

  def __iter__(self) -> "Prefetcher":
    return self

  def __next__(self) -> dict:
    batch, state, error = self._queue.get()
    if error is not None:
      raise error
    self._state = state
    return batch

  def get_state(self) -> dict | None:
    return self._state

  def close(self, timeout: float = 60.0) -> None:
    """Stop the producer and wait for it.

    A daemon thread still inside TensorFlow or XLA when the interpreter exits aborts the
    process ("terminate called ... exception not rethrown"), so the thread is joined here.
    """
    self._stop.set()
    deadline = time.monotonic() + timeout
    while self._thread.is_alive() and time.monotonic() < deadline:
      try:  # make room for a producer blocked on a full queue
        self._queue.get_nowait()
      except queue.Empty:
        pass
      self._thread.join(timeout=0.1)
    if not self._thread.is_alive():
      close(self._it)  # the stream's worker processes, if any
    if self._thread.is_alive():
      print(
          f"warning: the input prefetch thread did not stop within {timeout:.0f} s", file=sys.stderr
      )


def prefetch_to_device(iterator, sharding, size: int = 2) -> Prefetcher:
  """Global jax.Array batches from a host-batch iterator, overlapping host and device."""
  return Prefetcher(iterator, sharding, size)


# ------------------------------------------------------------------ blocks on worker processes

# Blocks a worker builds ahead of the consumer. Grain's mp_prefetch hands out the elements in
# order (worker w computes elements w, w + k, ...), so k workers hold k * (this + 1) blocks.
BLOCKS_AHEAD_PER_WORKER = 1
_ENDLESS = 1 << 62  # blocks of an endless stream: Grain's ranges are lazy


def map_blocks(build: Callable[[int], dict], first: int, workers: int) -> Iterator[dict]:
  """build(first), build(first + 1), ... in order: here when `workers` <= 1, else on that many
  Grain worker processes. `build` must be a picklable pure function of its argument, so the
  results do not depend on `workers`."""
  if workers <= 1:
    return map(build, itertools.count(first))
  import grain  # here: only a stream with workers needs it
  from absl import flags

  # Grain reads this absl flag when its workers start, which fails in a program that has not
  # parsed absl flags (a library caller, a test): take its default, as an unparsed flag has.
  flag = flags.FLAGS["grain_enable_multiprocess_worker_profiling"]
  flag.present = flag.present or not flags.FLAGS.is_parsed()

  # Each worker builds its blocks one at a time. Grain's default read options run 16 builds
  # at once on threads of every worker, buffering up to 500 blocks: a builder keeps its open
  # reader from one block to the next (`BlockBuilder.documents`), so concurrent builds race
  # on it ("generator already executing" with 2 threads), and the threads fight the other
  # workers and the training step for the cores and make closing wait for their builds.
  sequential = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  ds = grain.MapDataset.range(first, _ENDLESS).map(build).to_iter_dataset(sequential)
  options = grain.MultiprocessingOptions(
      num_workers=workers, per_worker_buffer_size=BLOCKS_AHEAD_PER_WORKER
  )
  return iter(ds.mp_prefetch(options))


def close(blocks: Iterator | None) -> None:
  """Stops the worker processes of a `map_blocks` iterator (nothing to do for the in-process one)."""
  stop = getattr(blocks, "close", None)
  if stop is not None:
    stop()
