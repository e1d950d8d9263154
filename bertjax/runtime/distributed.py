"""Multi-host start-up: one process per host (or several per machine on CPU), one global mesh.

    distributed.initialize()                          # TPU pod slice / SLURM: auto-detected
    distributed.initialize("10.0.0.1:1234", 4, 2)     # anything else: explicit
    python -m ... --coordinator_address=localhost:1234 --num_processes=2 --process_id=0

`jax.distributed.initialize()` must run before anything touches a device. On CPU, cross-process
collectives go through gloo (jax's default since 0.4.3x; set explicitly so older versions and
a user's `JAX_CPU_COLLECTIVES_IMPLEMENTATION` cannot silently leave them unimplemented).
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any
import threading

import jax
from jax.experimental import multihost_utils
import numpy as np

from bertjax.runtime import host_malloc

_initialized = False


def _auto_detected() -> str | None:
  """Which multi-host environment we are in, if jax can configure itself there."""
  if os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1:
    return "TPU pod slice"
  if os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "multi-slice TPU"
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ:
    return "SLURM"
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    return "JAX_COORDINATOR_ADDRESS"
  # A Cloud TPU VM (one host or a slice created with gcloud): jax then reads the slice's hosts
  # from the metadata server.
  if host_malloc.tpu_device_files_present():
    return "Cloud TPU VM"
  return None


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
  """Join the distributed system; returns True if this run is multi-process.

  Explicit arguments win; otherwise jax's cluster detection is used where one is present
  (TPU VMs, SLURM); otherwise this is a single-process run and nothing happens.
  """
  global _initialized
  if _initialized:
    return jax.process_count() > 1
  explicit = coordinator_address is not None or (num_processes or 1) > 1
  where = None if explicit else _auto_detected()
  if not explicit and where is None:
    return False
  if explicit and (coordinator_address is None or num_processes is None or process_id is None):
    raise ValueError(
        "multi-host: give all of --coordinator_address, --num_processes and "
        f"--process_id (got {coordinator_address!r}, {num_processes!r}, "
        f"{process_id!r})"
    )
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # affects CPU devices only
  if explicit:
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  else:
    jax.distributed.initialize()
  _initialized = True
  return jax.process_count() > 1


class PreemptionWatcher:
  """True once this run should save and exit: SIGTERM, or all hosts at jax's sync point.

  Single process: our own SIGTERM handler sets a flag. Multi-process: jax's preemption service
  (which owns SIGTERM under `jax.distributed`) agrees on one step for every host, so all of
  them save the same step; `reached_preemption_sync_point` must be called at every step.
  """

  def __init__(self):
    self._flag = threading.Event()
    self._multi = jax.process_count() > 1
    if not self._multi and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, lambda *_: self._flag.set())

  def should_stop(self, step: int) -> bool:
    if self._multi:
      try:
        return multihost_utils.reached_preemption_sync_point(step)
      except RuntimeError:  # preemption service disabled
        return False
    return self._flag.is_set()


def gather_json(obj: Any) -> list:
  """Every process's JSON-serialisable `obj`, in process order (a collective: all must call)."""
  if jax.process_count() == 1:
    return [obj]

  raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  lengths = multihost_utils.process_allgather(np.asarray([raw.size], np.int32))
  padded = np.zeros(int(np.max(lengths)), np.uint8)
  padded[: raw.size] = raw
  allb = multihost_utils.process_allgather(padded)
  return [
      json.loads(bytes(allb[i][: int(lengths[i][0])]).decode()) for i in range(jax.process_count())
  ]
