"""JAX's persistent compilation cache, on by default for every `bertjax` command.

A compiled step is written to disk keyed by its program, so the next process that compiles
the same program (a rerun, the next task or seed of a fine-tuning sweep launched as its own
command, a resumed pretraining run) loads it instead of compiling: on 2 CPU cores a BERT-mini
fine-tuning step takes ~10 s per shape to compile and well under a second to load.

  BERTJAX_COMPILE_CACHE unset   $XDG_CACHE_HOME/bertjax/xla (~/.cache/bertjax/xla)
  BERTJAX_COMPILE_CACHE=DIR     DIR (a local path or any path JAX's cache accepts, e.g. gs://)
  BERTJAX_COMPILE_CACHE=off     no cache

`JAX_COMPILATION_CACHE_DIR`, if set, wins. Only programs that took at least a second to
compile are cached (JAX's `jax_persistent_cache_min_compile_time_secs`), and the directory is
kept under 4 GiB, least recently used entries first (`JAX_COMPILATION_CACHE_MAX_SIZE` sets
another bound). This module imports
nothing heavy: `configure()` runs before JAX is imported and sets JAX's own environment
variable.
"""

from __future__ import annotations

import os

OFF = ("off", "0", "none", "false")
MAX_BYTES = 4 << 30


def cache_dir(environ=os.environ) -> str | None:
  """Where the cache goes for this environment, or None when it is off."""
  if environ.get("JAX_COMPILATION_CACHE_DIR"):
    return environ["JAX_COMPILATION_CACHE_DIR"]
  choice = environ.get("BERTJAX_COMPILE_CACHE", "").strip()
  if choice.lower() in OFF:
    return None
  if choice:
    return os.path.expanduser(choice)
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bertjax", "xla")


def configure(environ=os.environ) -> str | None:
  """Point JAX at the cache (before JAX is imported); returns the directory or None."""
  path = cache_dir(environ)
  if path is not None:
    environ["JAX_COMPILATION_CACHE_DIR"] = path
    environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(MAX_BYTES))
  return path
