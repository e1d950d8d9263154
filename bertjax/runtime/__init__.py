"""Process-level services every command may use: multi-host start, malloc tuning, workdir locks.

distributed.py  `jax.distributed.initialize` from flags or the environment
host_malloc.py  glibc malloc settings for long runs (set before JAX starts)
workdir_lock.py one writer per workdir or output directory
fs.py           the one file API for user paths (etils.epath; local or gs://)
"""
