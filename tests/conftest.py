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


@pytest.fixture(scope="session")
def bert_reference():
  """bert_reference(name) -> module: google-research/bert's `bert/<name>.py`, as shipped in the
  `bert-tensorflow` sdist on PyPI (a test dependency), imported and run under TF2's
  `tf.compat.v1` (which the 1.0.4 release already targets). Never copied into this repository.

  The reference scripts define absl flags at import (`vocab_file`, `do_lower_case`, ... in both
  run_squad and create_pretraining_data), so each load gets its own FlagValues, parsed at the
  defaults: loads never collide with each other or with bertjax's own flags. `modeling.py`
  imports `tensorflow.contrib`, which TF2 no longer has: a stub stands in for it, and only its
  `layer_norm` (unused by the pieces the tests call) would need it.
  """
  import contextlib
  import importlib
  import sys
  import types
  from unittest import mock

  from absl import flags as absl_flags
  tf = pytest.importorskip("tensorflow")
  pytest.importorskip("bert.optimization", reason="pip install bert-tensorflow")
  tf_flags = tf.compat.v1.flags
  cache = {}

  def load(name: str):
    if name in cache:
      return cache[name]
    values = absl_flags.FlagValues()
    contrib = types.ModuleType("tensorflow.contrib")
    contrib.layers = types.ModuleType("tensorflow.contrib.layers")
    defines = {a: getattr(absl_flags, a) for a in dir(absl_flags) if a.startswith("DEFINE")}
    with contextlib.ExitStack() as stack:
      for module in (absl_flags, tf_flags):
        stack.enter_context(mock.patch.object(module, "FLAGS", values))
        for attr, define in defines.items():
          stack.enter_context(mock.patch.object(
              module, attr, lambda *a, _define=define, **k: _define(*a, flag_values=values, **k)))
      stack.enter_context(mock.patch.dict(sys.modules, {
          "tensorflow.contrib": contrib, "tensorflow.contrib.layers": contrib.layers}))
      for key in [k for k in sys.modules if k == "bert" or k.startswith("bert.")]:
        del sys.modules[key]
      module = importlib.import_module(f"bert.{name}")
      for key in [k for k in sys.modules if k.startswith("bert.")]:
        del sys.modules[key]
    values(["bert-reference"])
    cache[name] = module
    return module

  return load
