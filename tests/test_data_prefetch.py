"""prefetch.py: global batches keep the host values, on the batch sharding; the prefetcher's
state lags the batches built ahead; an error in its thread reaches the consumer."""

import itertools

import numpy as np
import pytest

from bertjax.data import prefetch, pretraining


def test_global_batch_and_prefetch_keep_values_and_state():
  import jax

  n = len(jax.devices())
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  cfg = pretraining.InputConfig(
      source="synthetic", vocab_size=300, seq_len=16, max_predictions_per_seq=4
  )
  make = lambda: pretraining.make_stream(
      cfg, global_batch_size=2 * n, process_index=0, process_count=1
  )
  host = list(itertools.islice(make(), 3))
  g = prefetch.global_batch(host[0], sharding)
  assert g["input_ids"].shape == (2 * n, 16) and g["nsp_labels"].shape == (2 * n,)
  assert g["input_ids"].sharding.spec == jax.sharding.PartitionSpec("data", None)
  prefetched = prefetch.prefetch_to_device(make(), sharding, size=2)
  for want in host:
    got = next(prefetched)
    for k in pretraining.FEATURES:
      np.testing.assert_array_equal(np.asarray(got[k]), want[k])
  # The state is that after the batches handed out, not after those prefetched.
  assert prefetched.get_state()["step"] == 3
  prefetched.close()


def test_an_error_in_the_stream_reaches_the_consumer():
  import jax

  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def stream():
    yield {"x": np.zeros((2, 3), np.int32)}
    raise RuntimeError("the reader broke")

  prefetched = prefetch.prefetch_to_device(stream(), sharding)
  assert next(prefetched)["x"].shape == (2, 3)
  with pytest.raises(RuntimeError, match="the reader broke"):
    next(prefetched)
  prefetched.close()


class _OneAtATime:
  """A block builder that fails when called while a call is running in its process: the
  stream's BlockBuilder keeps its open reader between calls and must not be entered twice."""

  def __init__(self):
    self.busy = False

  def __call__(self, i: int) -> dict:
    import time

    if self.busy:
      raise RuntimeError(f"block {i} built while another build ran in this worker")
    self.busy = True
    try:
      time.sleep(0.02)  # long enough for a second thread to come in
      return {"block": np.full((2,), i)}
    finally:
      self.busy = False


@pytest.mark.process
def test_each_worker_builds_one_block_at_a_time_and_closes_promptly():
  """On Grain workers, a worker never runs two builds at once (its default read options ran
  16 on threads, and the real builder raced on its reader), blocks come back in order, and
  closing does not wait for builds queued ahead."""
  import time

  blocks = prefetch.map_blocks(_OneAtATime(), 5, workers=2)
  try:
    got = [int(next(blocks)["block"][0]) for _ in range(12)]
  finally:
    start = time.perf_counter()
    prefetch.close(blocks)
    closing = time.perf_counter() - start
  assert got == list(range(5, 17))
  assert closing < 20  # Grain kills a worker that has not stopped after 25 s
