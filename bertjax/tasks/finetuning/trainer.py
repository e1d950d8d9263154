"""The fine-tuning trainer: a task head on a restored encoder, its state, its jitted steps.

    trainer = finetuning.Trainer(make_model, enc, recipe, total_steps, loss_fn, "squad")
    state = trainer.init_state(seed=0, learning_rate=1e-4)
    state, loss = trainer.train_step(state, batch)
    outputs = trainer.predict(state.params, arrays, batch_size=64)

`make_model(cfg)` builds a Flax module (`model.BertForSequenceClassification`,
`BertForQuestionAnswering`, `BertForTokenClassification`) that holds the encoder as the
submodule "bert" and takes (input_ids, token_type_ids, attention_mask), and on packed rows
`segment_ids` and `cls_positions`; `loss_fn(outputs, batch)` turns its outputs into a mean
loss. Batches are dicts of arrays with the global batch on the leading axis. The epochs around
it are `loop.fit`'s; the runner that drives a task through both is `finetuning.run`.

State and steps are built as pretraining's (`bertjax.training.train_state`): the mesh from
`Recipe.mesh` (data-parallel over every device by default), the state's shardings from the
model's logical axes (`sharding.LOGICAL_AXIS_RULES`), so with fsdp > 1 the parameters and Adam
moments are split as in `bertjax pretrain`; a jitted init takes the restored encoder as an
argument, so it goes straight from the checkpoint to its place. Steps are jitted with explicit
shardings, donate the old state and are traced under the mesh and the rules. The steps of
every shape a run uses are compiled before its first step, side by side (`compile_ahead`).

Prediction batches rows by length (`batching.padded_lengths`) and returns them in the input's
order. Packed (`Trainer(..., packing=E)`): examples first-fit-decreasing into rows of the
arrays' length, at most E a row (`batching.packed_batch`), attention kept within each example
and each read from its own [CLS] (or tokens); one predict shape per run.

Shape letters: B batch, L sequence length.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from bertjax import errors, model as model_lib
from bertjax.data import prefetch
from bertjax.tasks import batching
from bertjax.tasks.batching import pad_length, padded_lengths, process_rows, take
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.finetuning import MIN_BATCHES_PER_LENGTH, compile_tokens
from bertjax.tasks.recipe import Recipe, check_field, make_optimizer, with_peak_learning_rate
from bertjax.training import checkpoint, sharding, train_state
from bertjax.training.train_state import TrainState

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
LossFn = Callable[[Any, dict], jax.Array]  # (model outputs, batch) -> mean loss


def init_train_state(
    model, tx, bert_params, key, learning_rate, source: str = "encoder"
) -> tuple[Any, TrainState]:
  """(boxed params, TrainState): a new model whose "bert" subtree is `bert_params` if given
  (checked against the model, `source` naming them), its optimizer at the peak
  `learning_rate`."""
  z = jnp.zeros((1, 8), jnp.int32)
  params_key, dropout_key = jax.random.split(key)
  boxed = model.init({"params": params_key}, z, z, jnp.ones_like(z))["params"]
  params = nn.unbox(boxed)
  if bert_params is not None:
    check_encoder(boxed["bert"], bert_params, source)
    params = {**params, "bert": bert_params}  # the head stays new
  return boxed, TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=with_peak_learning_rate(tx.init(params), learning_rate),
      rng=dropout_key,
  )


def check_encoder(want_boxed, got_abs, source: str) -> None:
  """Every parameter the config implies is in the restored encoder (arrays or abstract), with
  its shape."""
  want = dict(jax.tree_util.tree_leaves_with_path(nn.unbox(want_boxed)))
  got = dict(jax.tree_util.tree_leaves_with_path(got_abs))
  for path, w in want.items():
    name = "bert/" + "/".join(str(getattr(p, "key", p)) for p in path)
    if path not in got:
      raise checkpoint.CheckpointMismatchError(
          f"{source}: encoder has no {name}, which its config implies; the weights and the "
          "config do not belong together"
      )
    if tuple(got[path].shape) != tuple(w.shape):
      raise checkpoint.CheckpointMismatchError(
          f"{source}: {name} has shape {tuple(got[path].shape)}, its config implies "
          f"{tuple(w.shape)}; the weights and the config do not belong together"
      )


def progress_bar(total: int, desc: str, enabled: bool):
  off = not enabled or jax.process_index() != 0
  return tqdm(total=total, desc=desc, disable=off, leave=True, dynamic_ncols=True)


def masked_mean(per_example_B: jax.Array, weights_B: jax.Array) -> jax.Array:
  """The mean of a task loss over the batch's real examples (weight 1; 0 pads the batch)."""
  return jnp.sum(per_example_B * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)


def _init_options() -> dict | None:
  """XLA options of the state's init: it runs once per sweep, and on CPU XLA's backend
  optimizations cost more compile time than they save (BERT-mini on 2 cores: 12.5 s to compile,
  0.3 s to run; unoptimized 4.6 s and 1.2 s)."""
  return {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None


def _length_jobs(params, arrays: dict[str, np.ndarray], plan) -> list:
  """The predict `compile_ahead` jobs of an unpacked `Trainer._predict_plan`: one a length."""
  one_per_length = {length: idx for idx, length in plan}
  return [
      ("predict", params, take(arrays, idx, length, MODEL_INPUTS))
      for length, idx in one_per_length.items()
  ]


def _shapes(kind: str, batch: dict) -> tuple:
  """The key of a compiled step: its kind and the batch's shapes and dtypes."""
  return (kind,) + tuple((k, np.shape(v), str(v.dtype)) for k, v in sorted(batch.items()))


def prefetch_batches(trainer: "Trainer", host_batches):
  """Global device batches from global host batches (this process feeds its rows), built and
  transferred ahead by pretraining's prefetcher thread; closed with the `with` block."""
  local = (process_rows(b) for b in host_batches)
  return contextlib.closing(prefetch.prefetch_to_device(local, trainer.batch_sh))


# ------------------------------------------------------------------------------- the trainer


def _apply(model, params, batch: dict, **kw):
  """The model on a batch: one example per row, or packed rows (`batching.packed_batch`)."""
  if "segment_ids" in batch:
    return model.apply(
        {"params": params},
        batch["input_ids"],
        batch["token_type_ids"],
        None,
        segment_ids=batch["segment_ids"],
        cls_positions=batch["cls_positions"],
        **kw,
    )
  return model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), **kw)


def _train_step(state: TrainState, batch: dict, *, model, tx, loss_fn: LossFn):
  key = jax.random.fold_in(state.rng, state.step)

  def loss_of(params):
    out = _apply(model, params, batch, deterministic=False, rngs={"dropout": key})
    return loss_fn(out, batch)

  loss, grads = jax.value_and_grad(loss_of)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state.replace(
      step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
  )
  return new_state, loss


def _predict_step(params, batch: dict, *, model):
  return _apply(model, params, batch, deterministic=True)


def _mesh(recipe: Recipe) -> jax.sharding.Mesh:
  try:
    return sharding.make_mesh(*recipe.mesh)
  except ValueError as e:
    raise errors.ConfigError(
        f"Recipe.mesh={recipe.mesh}: {str(e).removeprefix('mesh: ')}"
    ) from None


def batch_shards(recipe: Recipe) -> int:
  """What every global batch's rows must be a multiple of: the mesh's data*fsdp x processes."""
  return sharding.num_batch_shards(_mesh(recipe)) * jax.process_count()


def _check_batch_sizes(recipe: Recipe, mesh: jax.sharding.Mesh) -> None:
  shards = sharding.num_batch_shards(mesh) * jax.process_count()
  for field in ("batch_size", "eval_batch_size"):
    if getattr(recipe, field) % shards:
      raise errors.ConfigError(
          f"Recipe.{field}={getattr(recipe, field)} is not divisible by the {shards} batch "
          f"shards (mesh data*fsdp x processes); use a multiple of {shards}"
      )


class Trainer:
  """Model, optimizer, shardings and jitted steps for one (head, encoder, recipe); `name`
  ("glue", "squad", "ner") opens its progress bars and log lines. `packing` > 0 packs up to
  that many examples into each row (`batching.packed_batch`) to train and predict, with one
  compiled shape each; the model takes `segment_ids` and `cls_positions` (every head of
  `model.heads` does)."""

  def __init__(
      self,
      make_model: Callable[[model_lib.BertConfig], nn.Module],
      enc: Encoder,
      recipe: Recipe,
      total_steps: int,
      loss_fn: LossFn,
      name: str,
      mesh: jax.sharding.Mesh | None = None,
      packing: int = 0,
  ):
    self.name, self.packing = name, packing
    self.mesh = _mesh(recipe) if mesh is None else mesh
    _check_batch_sizes(recipe, self.mesh)
    self.length_bucket, self.max_lengths = recipe.length_bucket, recipe.max_lengths
    # Fine-tuning runs unscanned, without remat, at the recipe's dropout.
    self.cfg = enc.config.replace(
        hidden_dropout_rate=recipe.dropout,
        attention_dropout_rate=recipe.dropout,
        scan_layers=False,
        remat="none",
    )
    self.model = make_model(self.cfg)
    self.tx = make_optimizer(recipe, total_steps)
    self.bert_params = enc.bert_params
    bert_abs = None
    if enc.bert_params is not None:
      bert_abs = jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.float32), enc.bert_params
      )
    init = functools.partial(init_train_state, self.model, self.tx, source=enc.source)
    # Shaping the state checks the encoder (`check_encoder`) before anything is computed.
    self.built = train_state.build(init, self.tx, self.mesh, bert_abs, jax.random.key(0), 0.0)
    self.state_sh, self.param_sh = self.built.shardings, self.built.shardings.params
    self.batch_sh = sharding.batch_sharding(self.mesh)
    self._init_compiled = None
    self.traces = {"train": 0, "predict": 0}
    self._executables: dict[tuple, Any] = {}  # (kind, batch shapes) -> compiled step
    repl = sharding.replicated(self.mesh)
    train_fn = functools.partial(_train_step, model=self.model, tx=self.tx, loss_fn=loss_fn)
    self._train = train_state.jit_step(
        self._counted("train", train_fn),
        self.mesh,
        in_shardings=(self.state_sh, self.batch_sh),
        out_shardings=(self.state_sh, repl),
        donate_argnums=0,
    )
    self._predict_fn = functools.partial(_predict_step, model=self.model)
    self._predict = train_state.jit_step(
        self._counted("predict", self._predict_fn),
        self.mesh,
        in_shardings=(self.param_sh, self.batch_sh),
        out_shardings=repl,
    )

  def init_state(self, seed: int, learning_rate: float) -> TrainState:
    """The restored encoder (resharded from wherever the checkpoint put it) and a new head
    from `seed`, at the peak `learning_rate` (0: a state that only predicts)."""
    check_field("learning_rate", learning_rate, float, lambda v: v >= 0, ">= 0")
    args = self._init_args(seed, learning_rate)
    if self._init_compiled is None:
      self._init_compiled = self._init_lowered(args).compile(compiler_options=_init_options())
    return self._init_compiled(*args)

  def _init_args(self, seed: int, learning_rate: float) -> tuple:
    bert = None
    if self.bert_params is not None:
      bert = jax.device_put(
          jax.tree.map(
              lambda x: x if isinstance(x, jax.Array) else np.asarray(x, np.float32),
              self.bert_params,
          ),
          self.param_sh["bert"],
      )
    repl = sharding.replicated(self.mesh)
    return (bert, *jax.device_put((jax.random.key(seed), np.float32(learning_rate)), repl))

  def _init_lowered(self, args: tuple | None = None):
    return self.built.init.lower(*(args or self._init_args(0, 0.0)))

  def device_batch(self, batch: dict) -> dict:
    """A global host batch as global device arrays (this process gives its rows)."""
    return prefetch.global_batch(process_rows(batch), self.batch_sh)

  def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, jax.Array]:
    """One step on a host batch (`fit` hands it device batches, already placed)."""
    if not isinstance(batch["input_ids"], jax.Array):
      batch = self.device_batch(batch)
    return self._executables.get(_shapes("train", batch), self._train)(state, batch)

  def compile_ahead(self, jobs: list[tuple[str, Any, dict]], init: bool = False) -> None:
    """Compile the steps of `jobs` (kind "train" or "predict", its first argument: the state
    or the params, values or `self.built.abstract`'s shapes, an example host batch of the
    shape to compile) that are not compiled yet, and with `init` the state's init, side by
    side: each is traced here, then XLA compiles them in threads (the compiler releases the
    GIL), one per core. `train_step`, `predict` and `init_state` then run the executables."""
    todo = {}
    for kind, first, batch in jobs:
      batch = self.device_batch(batch)  # the dtypes and shardings the steps will see
      key = _shapes(kind, batch)
      if key not in self._executables and key not in todo:
        todo[key] = (self._train if kind == "train" else self._predict).lower(first, batch)
    if init and self._init_compiled is None:
      todo["init"] = self._init_lowered()  # last: unoptimized, the shortest compile
    if not todo:
      return

    def compile_one(key):
      return todo[key].compile(compiler_options=_init_options() if key == "init" else None)

    workers = min(len(todo), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      for key, exe in zip(todo, pool.map(compile_one, todo)):
        if key == "init":
          self._init_compiled = exe
        else:
          self._executables[key] = exe

  def _counted(self, name: str, fn):
    """`fn`, counting its traces in `self.traces[name]`: jit traces (and compiles) once per new
    input shape, so the count is the number of compiled shapes."""

    def traced(*args):
      self.traces[name] += 1
      return fn(*args)

    return traced

  def compiled_shapes(self) -> tuple[int, int]:
    """(train, predict) step compilations so far: one per batch length used."""
    return self.traces["train"], self.traces["predict"]

  def _sequence_leaves(self, params, arrays: dict[str, np.ndarray]) -> list[bool]:
    """Which output leaves have a length axis (SQuAD's logits, NER's tags; not GLUE's): their
    shapes change with the input's length."""

    def out(length):
      batch = {k: jax.ShapeDtypeStruct((1, length), arrays[k].dtype) for k in MODEL_INPUTS}
      return jax.tree.leaves(jax.eval_shape(self._predict_fn, params, batch))

    return [a.shape != b.shape for a, b in zip(out(2), out(3))]

  def _predict_plan(self, arrays: dict[str, np.ndarray], batch_size: int):
    """(rows sorted by padded length, [(rows, length) of every batch]) of unpacked `predict`;
    wrap-around pads the last batch."""
    n = len(arrays["input_ids"])
    padded_N = padded_lengths(
        arrays["attention_mask"],
        self.length_bucket,
        MIN_BATCHES_PER_LENGTH * batch_size,
        self.max_lengths,
        compile_tokens(batch_size),
    )
    order = np.argsort(padded_N, kind="stable")
    plan = []
    for start in range(0, n, batch_size):
      idx = order[np.arange(start, start + batch_size) % n]
      plan.append((idx, int(padded_N[idx].max())))
    return order, plan

  def _packed_predict_rows(self, arrays: dict[str, np.ndarray], batch_size: int):
    """(example lengths, packed rows, batch builder) of packed `predict`."""
    lengths_N = batching.example_lengths(arrays["attention_mask"])
    rows = batching.pack_examples(lengths_N, arrays["input_ids"].shape[1], self.packing)
    inputs = {k: arrays[k] for k in batching.PACKED_INPUTS}  # no labels to the step
    build = functools.partial(
        batching.packed_batch, inputs, lengths_N, max_per_row=self.packing, n_rows=batch_size
    )
    return lengths_N, rows, build

  def predict_jobs(self, params, arrays: dict[str, np.ndarray], batch_size: int) -> list:
    """The `compile_ahead` jobs of `predict(params, arrays, batch_size)`: one a batch shape.
    `fit` compiles them beside the train step, so the first evaluation compiles nothing."""
    if not len(arrays["input_ids"]):
      return []
    if self.packing:
      _, rows, build = self._packed_predict_rows(arrays, batch_size)
      return [("predict", params, build(rows=rows[:1])[0])]
    return _length_jobs(params, arrays, self._predict_plan(arrays, batch_size)[1])

  def predict(self, params, arrays: dict[str, np.ndarray], batch_size: int, progress=False):
    """The model's outputs for every row of `arrays` as numpy, [N, ...] per leaf, in the rows'
    order. Rows are batched by padded length (`padded_lengths`); a length axis is padded back
    to the arrays' with the dtype's minimum (never an argmax or top-n candidate); the last
    batch is padded by wrapping around and the padding dropped."""
    n, max_len = arrays["input_ids"].shape
    if self.packing and n:
      return self._predict_packed(params, arrays, batch_size, progress)
    if n == 0:
      batch = {
          k: jax.ShapeDtypeStruct((batch_size,) + arrays[k].shape[1:], arrays[k].dtype)
          for k in MODEL_INPUTS
      }
      out_abs = jax.eval_shape(self._predict_fn, params, batch)
      return jax.tree.map(lambda s: np.zeros((0,) + s.shape[1:], s.dtype), out_abs)
    order, plan = self._predict_plan(arrays, batch_size)
    seq = self._sequence_leaves(params, arrays)
    self.compile_ahead(_length_jobs(params, arrays, plan))

    out, treedef = [], None
    bar = progress_bar(len(plan), f"{self.name} predict", progress)
    host = (take(arrays, idx, length, MODEL_INPUTS) for idx, length in plan)
    with prefetch_batches(self, host) as batches:
      for batch in batches:
        step = self._executables.get(_shapes("predict", batch), self._predict)
        leaves, treedef = jax.tree.flatten(step(params, batch))
        xs = [np.asarray(x) for x in leaves]
        out.append([pad_length(x, max_len) if s else x for x, s in zip(xs, seq)])
        bar.update(1)
    bar.close()
    rows_N = np.empty(n, np.int64)
    rows_N[order] = np.arange(n)  # input row -> its place in the sorted order
    return jax.tree.unflatten(treedef, [np.concatenate(xs)[rows_N] for xs in zip(*out)])

  def _predict_packed(self, params, arrays: dict[str, np.ndarray], batch_size: int, progress):
    """`predict` on packed rows: examples first-fit-decreasing into `batch_size`-row batches of
    the arrays' length (one compiled shape); each slot's outputs (or, for outputs with a
    length axis, its own tokens' outputs) put back at its example."""
    lengths_N, rows, build = self._packed_predict_rows(arrays, batch_size)
    self.compile_ahead([("predict", params, build(rows=rows[:1])[0])])  # as predict_jobs gives
    seq = self._sequence_leaves(params, arrays)
    slots = collections.deque()  # each built batch's (example_RxE, cls_RxE), in order

    def host():
      for i in range(0, len(rows), batch_size):
        batch, example_RxE = build(rows=rows[i : i + batch_size])
        slots.append((example_RxE, batch["cls_positions"]))
        yield batch

    examples, out, treedef = [], [], None
    bar = progress_bar(-(-len(rows) // batch_size), f"{self.name} predict", progress)
    with prefetch_batches(self, host()) as batches:
      for batch in batches:
        step = self._executables.get(_shapes("predict", batch), self._predict)
        leaves, treedef = jax.tree.flatten(step(params, batch))
        example_RxE, cls_RxE = slots.popleft()
        unpacked = [
            batching.unpack_outputs(np.asarray(x), example_RxE, cls_RxE, lengths_N, s)
            for x, s in zip(leaves, seq)
        ]
        examples.append(unpacked[0][0])
        out.append([x for _, x in unpacked])
        bar.update(1)
    bar.close()
    order_N = np.argsort(np.concatenate(examples))  # back to the input's order
    leaves = [np.concatenate(xs)[order_N] for xs in zip(*out)]
    return jax.tree.unflatten(treedef, leaves)
