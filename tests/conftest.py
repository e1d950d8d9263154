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

import pathlib  # noqa: E402  (after the environment above, which must come first)
import socket  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def prepare_austen():
  """prepare_austen(out, max_chars, **PrepareConfig fields) -> str: the first whole chapters
  of the bundled corpus, up to `max_chars`, prepared with the bundled tokenizer into `out`."""
  from bertjax.data import prepare as prepare_lib

  def make(out: pathlib.Path, max_chars: int, **kw) -> str:
    docs = (REPO / "data" / "austen.txt").read_text().split("\n\n")
    sizes = np.cumsum([len(d) for d in docs])
    corpus = out / "corpus.txt"
    corpus.write_text("\n\n".join(docs[:int(np.searchsorted(sizes, max_chars))]) + "\n")
    prepare_lib.prepare(prepare_lib.PrepareConfig(
        output=str(out), tokenizer=str(REPO / "data" / "tokenizer.model"),
        inputs=(str(corpus),), processes=1, progress=False, **kw))
    return str(out)

  return make


@pytest.fixture
def free_port():
  """free_port() -> int: a localhost TCP port that nothing is bound to right now."""
  def pick() -> int:
    with socket.socket() as s:
      s.bind(("localhost", 0))
      return s.getsockname()[1]
  return pick
