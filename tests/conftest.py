"""Test setup: 8 fake CPU devices, so sharding really splits arrays.

XLA reads the flag when jax initialises its backend, so it is set before anything imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow must never grab an accelerator or all host threads in tests.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
