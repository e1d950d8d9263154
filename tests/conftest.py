"""Test setup: 8 fake CPU devices, so sharding really splits arrays.

XLA reads the flag when jax initialises its backend, so it is set before anything imports jax.
"""

import os

# The CPU backend compiles the tests' programs without LLVM's costly optimisations: the suite
# runs hundreds of tiny programs once each, so compiling is most of its time (a third less CPU
# time on the 8-device training tests), and what the tests check (equal losses and gradients
# across meshes, exact resumes, parity within tolerances) does not depend on how fast the
# machine code is. `bertjax` commands run at XLA's default level; set BERTJAX_TEST_XLA_OPT=1
# to test at it too.
_fast_compile = (
    ""
    if os.environ.get("BERTJAX_TEST_XLA_OPT")
    else " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
)
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8" + _fast_compile
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow must never grab an accelerator or all host threads in tests.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# One compilation cache per test run, never the user's: a program tests compile again (a run
# and its resume, the reference run a test compares with, the same tiny step in another module
# or in a command a test starts) is compiled once and read back after, as `bertjax` commands do
# by default (bertjax.runtime.compile_cache). pytest-xdist's controller imports this file before
# it starts its workers, so they, and the processes tests start, inherit the one directory; the
# process that made it removes it at exit.
if not os.environ.get("BERTJAX_TEST_XLA_CACHE"):
  import atexit, shutil, tempfile  # noqa: E401

  os.environ["BERTJAX_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="bertjax-tests-xla-")
  atexit.register(shutil.rmtree, os.environ["BERTJAX_TEST_XLA_CACHE"], ignore_errors=True)
os.environ["BERTJAX_COMPILE_CACHE"] = os.environ["BERTJAX_TEST_XLA_CACHE"]
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["BERTJAX_TEST_XLA_CACHE"]
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))  # shared under a lock
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")  # the steps, not ops

import json  # noqa: E402  (after the environment above, which must come first)
import pathlib  # noqa: E402
import socket  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from gcs_fake import gcs  # noqa: E402,F401  (the local Cloud Storage fixture)

REPO = pathlib.Path(__file__).resolve().parents[1]


# The unit tier (`make test-fast`: -m "not slow and not multihost and not process") promises
# that no process is started. Every test outside those marks is watched: a process it starts
# (subprocess, a multiprocessing or Grain worker, a fork) fails it at teardown, so the marks
# stay true.
_SPAWN_MARKS = ("slow", "multihost", "process")


def pytest_collection_modifyitems(items):
  """The files with a test marked `long` first, each file's tests together and in order:
  pytest-xdist hands tests out in this order as workers free up, so the long ones start early
  and the suite ends on short files. Files stay whole: a file split in two would build its
  module fixtures twice (a run measured with the long tests alone moved first: 23 min 3 s,
  module fixtures rebuilt and module teardowns of 19-34 s)."""
  has_long = {item.module.__name__ for item in items if item.get_closest_marker("long")}
  items.sort(key=lambda item: item.module.__name__ not in has_long)


@pytest.fixture(autouse=True)
def _unmarked_tests_spawn_nothing(request, monkeypatch):
  if any(request.node.get_closest_marker(m) for m in _SPAWN_MARKS):
    yield
    return
  import multiprocessing.util
  import subprocess

  spawned = []

  def watch(owner, name, what):
    real = getattr(owner, name)

    def wrapper(*a, **kw):
      said = what(*a)
      if said:
        spawned.append(said)
      return real(*a, **kw)

    monkeypatch.setattr(owner, name, wrapper)

  def command(self, args, *_):  # importing TensorFlow runs `uname -p` (h5py): not the test's
    return None if list(args)[:1] == ["uname"] else f"subprocess {args!r:.80}"

  watch(subprocess.Popen, "_execute_child", command)
  watch(multiprocessing.util, "spawnv_passfds", lambda path, args, *_: f"process {args!r:.80}")
  watch(os, "fork", lambda: "os.fork()")
  watch(os, "posix_spawn", lambda path, *_: f"posix_spawn {path}")
  yield
  if spawned:
    pytest.fail(
        f"started {len(spawned)} process(es), first: {spawned[0]}; mark the test "
        "@pytest.mark.process (or slow, multihost): the unit tier starts none",
        pytrace=False,
    )


@pytest.fixture(autouse=True, scope="module")
def _freeze_what_outlives_a_module():
  """After each module, what is still alive (modules, compiled programs and their caches) moves
  to the collector's permanent generation (`gc.freeze`), so later full collections walk only
  newer objects. Without it a worker's heap grows to millions of tracked objects across the
  suite and every automatic full collection walks them all: single tests stalled for 40-100 s
  late in a run (a 4 s test took 100 s; one explicit `gc.collect()` took 23 s)."""
  import gc

  yield
  gc.collect()
  gc.freeze()


@pytest.fixture(scope="session")
def prepare_austen():
  """prepare_austen(out, max_chars, **PrepareConfig fields) -> str: the first whole chapters
  of the bundled corpus, up to `max_chars`, prepared with the bundled tokenizer into `out`."""
  from bertjax.data import prepare as prepare_lib

  def make(out: pathlib.Path, max_chars: int, **kw) -> str:
    docs = (REPO / "data" / "austen.txt").read_text().split("\n\n")
    sizes = np.cumsum([len(d) for d in docs])
    corpus = out / "corpus.txt"
    corpus.write_text("\n\n".join(docs[: int(np.searchsorted(sizes, max_chars))]) + "\n")
    prepare_lib.prepare(
        prepare_lib.PrepareConfig(
            output=str(out),
            tokenizer=str(REPO / "data" / "tokenizer.model"),
            inputs=(str(corpus),),
            processes=1,
            progress=False,
            **kw,
        )
    )
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
          stack.enter_context(
              mock.patch.object(
                  module, attr, lambda *a, _define=define, **k: _define(*a, flag_values=values, **k)
              )
          )
      stack.enter_context(
          mock.patch.dict(
              sys.modules,
              {"tensorflow.contrib": contrib, "tensorflow.contrib.layers": contrib.layers},
          )
      )
      for key in [k for k in sys.modules if k == "bert" or k.startswith("bert.")]:
        del sys.modules[key]
      module = importlib.import_module(f"bert.{name}")
      for key in [k for k in sys.modules if k.startswith("bert.")]:
        del sys.modules[key]
    values(["bert-reference"])
    cache[name] = module
    return module

  return load


# ------------------------------------------------------------------ helpers shared by test files
# Test modules import these (`from conftest import tiny_config`); no test module imports another.
# TensorFlow, torch and transformers are imported inside the helpers that need them, so the
# suite still collects without them.

HF_CONFIG = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    hidden_act="gelu",
    type_vocab_size=2,
)


def tiny_config(**train_overrides):
  """The tiny recipe on the synthetic source, small enough for a step in a test."""
  from experiments import pretrain

  c = pretrain.get_config("tiny")
  c.model.vocab_size = 1000
  c.data.source = "synthetic"
  c.data.seq_len, c.data.max_predictions_per_seq = 32, 5
  c.train.batch_size = 16
  for k, v in train_overrides.items():
    c.train[k] = v
  return c


def synthetic_batch(c, mesh, step=0, pair_mode=None):
  """Step `step`'s global batch of the synthetic stream for `c` (`tiny_config`) on `mesh`."""
  from bertjax.data import pretraining
  from bertjax.training import sharding

  cfg = pretraining.InputConfig(
      source="synthetic",
      seq_len=c.data.seq_len,
      max_predictions_per_seq=c.data.max_predictions_per_seq,
      vocab_size=c.model.vocab_size,
      pair_mode=pair_mode or c.data.pair_mode,
      seed=0,
  )
  stream = pretraining.make_stream(
      cfg,
      global_batch_size=c.train.batch_size,
      process_index=0,
      process_count=1,
      state={"step": step},
  )
  return pretraining.global_batch(next(stream), sharding.batch_sharding(mesh))


def loop_config(steps, **kw):
  """`tiny_config` for a whole loop: log every step, checkpoint/eval every 3; `kw` sets
  dotted fields ("eval.every_steps": 0)."""
  c = tiny_config(steps=steps, warmup_steps=2)
  c.log_every_steps = 1
  c.tensorboard = False
  c.checkpoint.every_steps = 3
  c.eval.every_steps, c.eval.steps, c.eval.batch_size = 3, 1, 16
  for k, v in kw.items():
    node, _, leaf = k.rpartition(".")
    (c[node] if node else c)[leaf] = v
  return c


def metrics_rows(workdir):
  """metrics.jsonl of a run: ({step: train row}, [eval rows])."""
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r for r in rows if "loss" in r}, [r for r in rows if "eval_loss" in r]


def run_until(c, workdir, stop_step):
  """Run `c` but stop (as a preemption would) right after `stop_step`."""
  from bertjax.runtime import distributed
  from bertjax.training import loop

  orig = distributed.PreemptionWatcher.should_stop
  distributed.PreemptionWatcher.should_stop = lambda self, step: step >= stop_step
  try:
    assert loop.train_and_evaluate(c, str(workdir)) == 0
  finally:
    distributed.PreemptionWatcher.should_stop = orig
  assert (workdir / "checkpoints" / str(stop_step)).exists()


def tiny_pretrain_argv(workdir) -> list[str]:
  """`bertjax pretrain` of the tiny recipe into `workdir`, as a subprocess argv to extend."""
  import sys

  recipe = str(REPO / "experiments" / "pretrain.py") + ":tiny"
  return [
      sys.executable,
      "-m",
      "bertjax.cli",
      "pretrain",
      "--config",
      recipe,
      "--workdir",
      str(workdir),
  ]


def pretrain_cmd(workdir, steps):
  """`bertjax pretrain` of the tiny recipe on synthetic data, as a subprocess argv."""
  return tiny_pretrain_argv(workdir) + [
      "--config.data.source=synthetic",
      "--config.model.vocab_size=1000",
      "--config.data.seq_len=32",
      "--config.data.max_predictions_per_seq=5",
      "--config.train.batch_size=16",
      f"--config.train.steps={steps}",
      "--config.train.warmup_steps=2",
      "--config.log_every_steps=1",
      "--config.checkpoint.every_steps=4",
      "--config.eval.every_steps=0",
      "--config.tensorboard=false",
  ]


WORDS = (
    "the quick brown fox jump ##s ##ed over lazy dog . , ! un ##aff ##able caf ##e " "我 爱 北 京"
).split()


def write_vocab(path, size):
  """A WordPiece vocab.txt of `size` lines: BERT's specials, WORDS, then [unusedN]."""
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(WORDS)
  pieces += [f"[unused{i}]" for i in range(size - len(pieces))]
  path.write_text("\n".join(pieces) + "\n", encoding="utf-8")
  return path


def google_variables(sd: dict, num_layers: int) -> dict[str, np.ndarray]:
  """Google's variable names and layouts ([in, out] kernels) for a torch state dict."""
  t = lambda name: sd[name].numpy().T  # torch Linear [out, in] -> TF dense kernel [in, out]
  v = lambda name: sd[name].numpy()
  out = {
      "bert/embeddings/word_embeddings": v("bert.embeddings.word_embeddings.weight"),
      "bert/embeddings/position_embeddings": v("bert.embeddings.position_embeddings.weight"),
      "bert/embeddings/token_type_embeddings": v("bert.embeddings.token_type_embeddings.weight"),
      "bert/embeddings/LayerNorm/gamma": v("bert.embeddings.LayerNorm.weight"),
      "bert/embeddings/LayerNorm/beta": v("bert.embeddings.LayerNorm.bias"),
      "bert/pooler/dense/kernel": t("bert.pooler.dense.weight"),
      "bert/pooler/dense/bias": v("bert.pooler.dense.bias"),
      "cls/predictions/transform/dense/kernel": t("cls.predictions.transform.dense.weight"),
      "cls/predictions/transform/dense/bias": v("cls.predictions.transform.dense.bias"),
      "cls/predictions/transform/LayerNorm/gamma": v("cls.predictions.transform.LayerNorm.weight"),
      "cls/predictions/transform/LayerNorm/beta": v("cls.predictions.transform.LayerNorm.bias"),
      "cls/predictions/output_bias": v("cls.predictions.bias"),
      "cls/seq_relationship/output_weights": v("cls.seq_relationship.weight"),  # [2, H]
      "cls/seq_relationship/output_bias": v("cls.seq_relationship.bias"),
  }
  for i in range(num_layers):
    g, h = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
    for m in ("query", "key", "value"):
      out[f"{g}/attention/self/{m}/kernel"] = t(f"{h}.attention.self.{m}.weight")
      out[f"{g}/attention/self/{m}/bias"] = v(f"{h}.attention.self.{m}.bias")
    for gm, hm in (
        ("attention/output/dense", "attention.output.dense"),
        ("intermediate/dense", "intermediate.dense"),
        ("output/dense", "output.dense"),
    ):
      out[f"{g}/{gm}/kernel"] = t(f"{h}.{hm}.weight")
      out[f"{g}/{gm}/bias"] = v(f"{h}.{hm}.bias")
    for gm, hm in (
        ("attention/output/LayerNorm", "attention.output.LayerNorm"),
        ("output/LayerNorm", "output.LayerNorm"),
    ):
      out[f"{g}/{gm}/gamma"] = v(f"{h}.{hm}.weight")
      out[f"{g}/{gm}/beta"] = v(f"{h}.{hm}.bias")
  return out


def write_google_checkpoint(
    directory,
    variables: dict[str, np.ndarray],
    hf_config: dict,
    extra: dict[str, np.ndarray] | None = None,
) -> str:
  """A checkpoint as google-research/bert's Estimator wrote it: tf.compat.v1 Saver."""
  import tensorflow as tf

  directory.mkdir(parents=True, exist_ok=True)
  prefix = str(directory / "bert_model.ckpt")
  with tf.Graph().as_default():
    tf_vars = [
        tf.compat.v1.get_variable(name, initializer=tf.constant(value))
        for name, value in {**variables, **(extra or {})}.items()
    ]
    saver = tf.compat.v1.train.Saver(tf_vars)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, prefix, write_meta_graph=False)
  bert_config = {
      k: hf_config[k]
      for k in (
          "vocab_size",
          "hidden_size",
          "num_hidden_layers",
          "num_attention_heads",
          "intermediate_size",
          "max_position_embeddings",
          "hidden_act",
          "type_vocab_size",
      )
  }
  bert_config.update(
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02
  )
  (directory / "bert_config.json").write_text(json.dumps(bert_config))
  return prefix


def random_torch_model(seed: int = 0):
  """A transformers BertForPreTraining of HF_CONFIG with every weight moved off its init."""
  import torch
  import transformers

  torch.manual_seed(seed)
  m = transformers.BertForPreTraining(transformers.BertConfig(**HF_CONFIG)).eval()
  with torch.no_grad():  # move every weight off its init value (LayerNorm 1/0, zero biases)
    for p in m.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  return m


def hf_batch(vocab: int, seed: int = 0):
  """ids, segment ids, mask and masked positions of a [3, 12] batch (4 positions), one row
  padded."""
  B, L, P = 3, 12, 4
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[1, 8:] = 0
  ids[mask == 0] = 0
  types = np.zeros((B, L), np.int32)
  types[:, 5:] = 1
  types[mask == 0] = 0
  pos = np.stack([rng.choice(int(m.sum()), size=P, replace=False) for m in mask]).astype(np.int32)
  return ids, types, mask, pos


def torch_logits(m, ids, types, mask, pos):
  import torch

  with torch.no_grad():
    out = m(
        input_ids=torch.tensor(ids, dtype=torch.long),
        token_type_ids=torch.tensor(types, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
    )
  mlm = np.take_along_axis(out.prediction_logits.numpy(), pos[:, :, None], axis=1)
  return mlm, out.seq_relationship_logits.numpy()


def built_once(tmp_path_factory, name: str, build) -> pathlib.Path:
  """`build(directory)` run once per test run, whatever the number of pytest-xdist workers:
  the first worker builds under a file lock in the run's shared temporary directory, the others
  wait and reuse it. For inputs tests only read (prepared shards, a finished tiny run)."""
  import filelock

  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # shared by the workers of this run
  out, done = base / f"shared-{name}", base / f"shared-{name}.done"
  with filelock.FileLock(str(base / f"shared-{name}.lock")):
    if not done.exists():
      if out.exists():  # a build that failed part-way: start again
        import shutil

        shutil.rmtree(out)
      out.mkdir()
      build(out)
      done.touch()
  return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
  """A finished 3-step tiny pretraining workdir (synthetic data, vocab 1000), built once."""
  from bertjax.training import loop

  def build(workdir):
    assert loop.train_and_evaluate(loop_config(3, **{"eval.every_steps": 0}), str(workdir)) == 0

  return built_once(tmp_path_factory, "tiny_run", build)


@pytest.fixture(scope="session")
def austen_shards(tmp_path_factory, prepare_austen):
  """The first ~40k characters of the bundled corpus prepared into shards, built once."""
  return built_once(tmp_path_factory, "austen_shards", lambda out: prepare_austen(out, 40_000))


@pytest.fixture(scope="session")
def snippet_shards(tmp_path_factory):
  """2,000 film-review snippets of the bundled task (mean ~35 tokens), each its own document."""
  from bertjax.data import prepare as prepare_lib

  def build(out):
    rows = (REPO / "data" / "movie_snippets" / "train.tsv").read_text().splitlines()[1:2001]
    corpus = out / "snippets.txt"
    corpus.write_text("".join(r.split("\t")[0] + "\n\n" for r in rows), encoding="utf-8")
    prepare_lib.prepare(
        prepare_lib.PrepareConfig(
            output=str(out / "data"),
            tokenizer=str(REPO / "data" / "tokenizer.model"),
            inputs=(str(corpus),),
            processes=1,
            progress=False,
        )
    )

  return str(built_once(tmp_path_factory, "snippet_shards", build) / "data")
