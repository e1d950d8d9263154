"""glibc allocator settings for XLA's CPU runtime, applied by re-executing the CLI once.

XLA's CPU executable allocates the temporaries of each run of a program as one buffer, with
`posix_memalign` from one of its worker threads (about 0.7 GB for BERT-mini's train step at
batch 32 x 128, about 2.4 GB for BERT-base's at 16 x 128). glibc serves a request that large
from a thread arena with a fresh `mmap` and unmaps it again on `free`, so on every step the
kernel faults in and zeroes the whole buffer once more: on a 2-core machine, 605,000 minor page
faults and 1.1-1.5 s of system time per BERT-base step. With a single arena, no `mmap` and a
trim threshold above the buffer, the freed buffer stays in the heap and the next step reuses it:
no page faults, and the step takes 7-12% less time (docs/performance.md).

These are `GLIBC_TUNABLES`, which glibc reads only when a process starts, so `bertjax` sets
them and re-executes itself once, before anything is imported. It does so only on Linux with
glibc, when the environment does not set `GLIBC_TUNABLES` already (the user's own settings win),
and, by default, only when JAX will run on the CPU (no GPU/TPU device files, or `JAX_PLATFORMS`
starting with `cpu`): accelerators allocate their buffers elsewhere, and one arena would make
a busy multi-threaded host slower for nothing. `BERTJAX_MALLOC_TUNING=0` turns it off, `=1`
applies it on any machine. Code that imports bertjax as a library can export the same
`GLIBC_TUNABLES` value (`TUNABLES` below) itself.
"""

from __future__ import annotations

import glob
import os
import platform
import sys
from typing import Mapping

TUNABLES = (
    "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:" "glibc.malloc.trim_threshold=68719476736"
)  # 64 GiB
ENV_SWITCH = "BERTJAX_MALLOC_TUNING"  # auto (default) | 0 | 1
# Commands that run XLA programs; the data-only commands keep glibc's defaults.
XLA_COMMANDS = frozenset(
    {"demo", "pretrain", "compile", "glue", "squad", "ner", "extract", "bench"}
)


def runs_xla(command: str, args: list[str]) -> bool:
  """Whether `bertjax COMMAND ARGS...` runs XLA programs (`bench input` times tf.data only)."""
  return command in XLA_COMMANDS and not (command == "bench" and args[:1] == ["input"])


def tpu_device_files_present() -> bool:
  """A Cloud TPU VM exposes its chips as /dev/accel* or /dev/vfio/* (checked without jax)."""
  return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def _accelerator_present() -> bool:
  return bool(glob.glob("/dev/nvidia[0-9]*")) or tpu_device_files_present()


def decide(
    environ: Mapping[str, str], *, system: str, libc: str, accelerator_present: bool
) -> tuple[bool, str]:
  """(apply?, why) for one process start; pure, so every branch is testable."""
  switch = environ.get(ENV_SWITCH, "auto").strip().lower()
  if switch in ("0", "off", "false", "no"):
    return False, f"{ENV_SWITCH}={environ[ENV_SWITCH]}"
  if switch not in ("auto", "1", "on", "true", "yes"):
    raise ValueError(f"{ENV_SWITCH}={environ[ENV_SWITCH]!r}; valid: auto, 0, 1")
  if system != "Linux" or libc != "glibc":
    return False, f"not Linux with glibc ({system}, {libc or 'unknown libc'})"
  if "GLIBC_TUNABLES" in environ:
    return False, "GLIBC_TUNABLES is set already"
  if switch == "auto":
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
      if platforms.split(",")[0] != "cpu":
        return False, f"JAX_PLATFORMS={environ['JAX_PLATFORMS']}"
    elif accelerator_present:
      return False, "a GPU/TPU device is present"
  return True, "XLA runs on the CPU"


def maybe_reexec(command: str, args: list[str]) -> None:
  """Re-executes this process with `TUNABLES` when `decide` says so; returns otherwise.

  Only for the process's own entry point (the console script or `python -m bertjax.cli`):
  `sys.orig_argv` is replayed exactly, so the new process runs the same command.
  """
  if not runs_xla(command, args):
    return
  apply, _ = decide(
      os.environ,
      system=platform.system(),
      libc=platform.libc_ver()[0],
      accelerator_present=_accelerator_present(),
  )
  if not apply:
    return
  os.environ["GLIBC_TUNABLES"] = TUNABLES
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
