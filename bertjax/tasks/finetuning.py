"""Fine-tune a restored encoder with a task head: the machinery GLUE, SQuAD and NER share.

    trainer = finetuning.Trainer(make_model, enc, recipe, total_steps, loss_fn, "squad")
    result = finetuning.fit(trainer, train_arrays, recipe, evaluate, "f1", workdir)

`make_model(cfg)` builds a Flax module (`model.BertForSequenceClassification`,
`BertForQuestionAnswering`, `BertForTokenClassification`) that holds the encoder as the
submodule "bert" and takes (input_ids, token_type_ids, attention_mask); `loss_fn(outputs, batch)`
turns its outputs into a mean loss. Batches are dicts of arrays with the global batch on the
leading axis; "weights" (1 real row, 0 padding) is added by `fit`. The recipe and optimizer
(`recipe.py`) and the length-aware batches (`batching.py`) are importable from here too.

State and steps are built as pretraining's (`bertjax.training.train_state`): the mesh from
`Recipe.mesh` (data-parallel over every device by default), the state's shardings from the
model's logical axes (`sharding.LOGICAL_AXIS_RULES`), so with fsdp > 1 the parameters and Adam
moments are split as in `bertjax pretrain`; a jitted init takes the restored encoder as an
argument, so it goes straight from the checkpoint to its place. Steps are jitted with explicit
shardings, donate the old state and are traced under the mesh and the rules.

Batches are length-aware (`batching.py`): a task of short sentences trains at the cost of its
real tokens with a few compiled shapes, a length kept only if the padding it saves over the run
outweighs a compile; prediction batches rows by length too and returns them in the input's
order. The steps of every length a run uses are compiled before its first step, side by side
(`Trainer.compile_ahead`). Host batches are built and transferred ahead by pretraining's
prefetcher (`prefetch.prefetch_to_device`) and the loss is read one step late.

Packed (`Trainer(..., packing=E)`, GLUE's heads): instead of length buckets, each epoch's
shuffled examples are packed first-fit-decreasing into rows of the arrays' length, at most E a
row (`batching.packed_epoch`), attention kept within each example and each pooled from its own
[CLS] (or tokens); the loss averages over the examples present. One train and one predict
shape per run; predictions come back in the input's order.

Shape letters: B batch, L sequence length.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm import tqdm

from bertjax import errors, model as model_lib
from bertjax.model import heads as model_heads, ops as model_ops
from bertjax.data import prefetch
from bertjax.runtime import fs
from bertjax.tasks import batching
from bertjax.tasks.batching import (  # noqa: F401  (callers import these from here)
    epoch_batches,
    fewest_padded_lengths,
    pad_length,
    padded_lengths,
    process_rows,
    take,
    train_batch,
)
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.recipe import (  # noqa: F401  (callers import these from here)
    Recipe,
    check_field,
    learning_rates_for,
    make_optimizer,
    optimizer_for,
    peak_learning_rate,
    steps_per_epoch,
    with_peak_learning_rate,
)
from bertjax.training import checkpoint, sharding, train_state
from bertjax.training.train_state import TrainState

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
LossFn = Callable[[Any, dict], jax.Array]  # (model outputs, batch) -> mean loss

# A length used by fewer rows than this many batches is merged into the next longer one: a
# compile costs more than padding them.
MIN_BATCHES_PER_LENGTH = 4
# What one more compiled step costs, in steps at length 32: on 2 CPU cores a BERT-mini train
# step takes ~2 s to trace and lower and ~8.5 s to compile, but two compiles side by side take
# 13 s, so ~8.5 s per length in all: as long as ~24 steps at length 32 (0.35 s each). A length
# is kept only if the padding it saves over the run (all epochs) is worth more tokens than that
# (`padded_lengths`' compile_tokens).
COMPILE_COST_STEPS = 24
COMPILE_COST_LENGTH = 32


def compile_tokens(batch_size: int, epochs: int = 1) -> float:
  """`padded_lengths`' compile_tokens for rows padded once per epoch: one compile as padded
  tokens of a single pass."""
  return COMPILE_COST_STEPS * batch_size * COMPILE_COST_LENGTH / max(1, epochs)


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


def _prefetch(trainer: "Trainer", host_batches):
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


class PackedTokenHead(nn.Module):
  """A per-token head on packed rows: `model.BertForQuestionAnswering` (`pairs`: start and
  end logits, "qa_outputs") or `model.BertForTokenClassification` (`dropout`, "classifier"),
  with `segment_ids` passed to the encoder so that attention stays within each example. The
  parameter tree is the model head's, so the parameters of one serve the other; it goes
  when the model's heads take `segment_ids` themselves."""

  cfg: model_lib.BertConfig
  num_outputs: int  # logits per token: 2 for SQuAD, the tags for NER
  head: str  # the head's layer name in the model's parameters
  dropout: bool = False  # dropout on the tokens' states before the head, as NER's
  pairs: bool = False  # return (logits[..., 0], logits[..., 1]), as the SQuAD head

  @nn.compact
  def __call__(
      self,
      input_ids_BxL,
      token_type_ids_BxL=None,
      attention_mask_BxL=None,
      *,
      segment_ids=None,
      cls_positions=None,  # unused: every token is scored
      deterministic: bool = True,
  ):
    del cls_positions
    enc = model_lib.BertModel(self.cfg, name="bert")(
        input_ids_BxL,
        token_type_ids_BxL,
        attention_mask_BxL,
        segment_ids=segment_ids,
        deterministic=deterministic,
    )
    x_BxLxH = enc.sequence_output
    if self.dropout:
      x_BxLxH = model_ops.Dropout(self.cfg.hidden_dropout_rate)(x_BxLxH, deterministic)
    logits_BxLxC = model_heads._head(self.cfg, self.num_outputs, self.head)(x_BxLxH)
    logits_BxLxC = logits_BxLxC.astype(jnp.float32)
    return (logits_BxLxC[..., 0], logits_BxLxC[..., 1]) if self.pairs else logits_BxLxC


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
  compiled shape each; the model must take `segment_ids` and `cls_positions` (GLUE's)."""

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
    with _prefetch(self, host) as batches:
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
    with _prefetch(self, host()) as batches:
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


# ---------------------------------------------------------------------------------- the loop


def packed_plan(train: dict[str, np.ndarray], recipe: Recipe, max_per_row: int, shards: int):
  """(example lengths, rows per batch, steps per epoch) of packed training (`fit`): every
  epoch packs into as many rows, whatever its shuffle (first-fit-decreasing sees only the
  lengths)."""
  lengths_N = batching.example_lengths(train["attention_mask"])
  n_rows = len(batching.pack_examples(lengths_N, train["input_ids"].shape[1], max_per_row))
  per_batch = batching.packed_batch_rows(recipe.batch_size, len(lengths_N), n_rows, shards)
  steps = -(-n_rows // per_batch)
  return lengths_N, per_batch, min(steps, recipe.max_steps) if recipe.max_steps else steps


def total_steps(train: dict[str, np.ndarray], recipe: Recipe, packing: int = 0) -> int:
  """The run's optimizer steps, `recipe.epochs` x the steps of an epoch: packed (`packing`
  examples a row at most, `packed_plan`) or one example a row (`steps_per_epoch`)."""
  if packing:
    steps = packed_plan(train, recipe, packing, batch_shards(recipe))[2]
  else:
    steps = steps_per_epoch(len(train["input_ids"]), recipe)
  return recipe.epochs * steps


@dataclasses.dataclass
class FitResult:
  best: dict[str, float]  # the best epoch's dev metrics
  best_epoch: int
  best_params: Any  # on device
  history: list[dict]  # per epoch (0 = before training, if asked): train_loss, dev metrics


def fit(
    trainer: Trainer,
    train: dict[str, np.ndarray],
    recipe: Recipe,
    evaluate: Callable[[Any], dict[str, float]],
    main_metric: str,
    workdir: str,
    eval_untrained: bool = False,
    progress: bool = True,
    run_name: str = "",
    predicts: tuple[dict[str, np.ndarray], ...] = (),
) -> FitResult:
  """Train for `recipe.epochs` on the rows of `train`, scoring `evaluate(params)` after each
  epoch; the epoch with the highest `main_metric` is kept. Writes workdir/metrics.jsonl.
  The predict steps of `predicts` (the arrays `evaluate` predicts on, at
  `recipe.eval_batch_size`) are compiled with the train steps, side by side.
  Batches are length-aware (`epoch_batches`, seeded by `recipe.seed`) or packed
  (`trainer.packing`: `batching.packed_epoch`) and prefetched; the
  loss is read one step late (progress bar) or once an epoch, so the host never syncs a step.
  `run_name` (a GLUE task) goes into the progress bars and log lines."""
  fs.path(workdir).mkdir(parents=True, exist_ok=True)
  what = f"{run_name} " if run_name else ""
  epoch_plan, steps, shapes = _epoch_plan(
      trainer, train, recipe, f"{trainer.name}: {what}", progress
  )
  # every step the run will use and the state's init, compiled side by side from their shapes
  abstract = trainer.built.abstract
  trainer.compile_ahead(
      [("train", abstract, batch) for batch in shapes]
      + [
          job
          for arrays in predicts
          for job in trainer.predict_jobs(abstract.params, arrays, recipe.eval_batch_size)
      ],
      init=True,
  )
  state = trainer.init_state(recipe.seed, recipe.learning_rate)
  rng = np.random.default_rng(recipe.seed)
  history, best, best_epoch, best_params = [], None, 0, None
  # Written as it goes and flushed after each epoch (an object store uploads it whole on flush).
  with (fs.path(workdir) / "metrics.jsonl").open("w") as log:
    if eval_untrained:
      entry = dict(epoch=0, **evaluate(state.params))
      history.append(entry)
      log.write(json.dumps(entry) + "\n")
      print(f"{trainer.name}: {what}untrained: " + _fmt(entry), flush=True)
    for epoch in range(1, recipe.epochs + 1):
      t0 = time.time()
      host = (make() for make in epoch_plan(rng)[:steps])
      losses = []
      bar = progress_bar(
          steps, f"{run_name or trainer.name} epoch {epoch}/{recipe.epochs}", progress
      )
      with _prefetch(trainer, host) as batches:
        for batch in batches:
          state, loss = trainer.train_step(state, batch)
          losses.append(loss)
          if progress and len(losses) >= 2:  # read one step late: the device never waits
            bar.set_postfix(loss=f"{float(losses[-2]):.4f}", refresh=False)
          bar.update(1)
      bar.close()
      dev = evaluate(state.params)
      entry = dict(
          epoch=epoch,
          train_loss=float(jnp.mean(jnp.stack(losses))),
          **dev,
          seconds=round(time.time() - t0, 1),
      )
      history.append(entry)
      log.write(json.dumps(entry) + "\n")
      log.flush()
      improved = best is None or dev[main_metric] > best[main_metric]
      print(
          f"{trainer.name}: {what}epoch {epoch}: " + _fmt(entry) + (" (best)" if improved else ""),
          flush=True,
      )
      if improved:
        best, best_epoch = dev, epoch
        best_params = jax.tree.map(jnp.copy, state.params)  # the step donates state.params
  return FitResult(best=best, best_epoch=best_epoch, best_params=best_params, history=history)


def _epoch_plan(trainer: Trainer, train: dict, recipe: Recipe, say: str, progress: bool):
  """(plan(rng) -> the epoch's batches as thunks that build them, steps per epoch, a host
  batch of every shape to compile): length-bucketed batches of `recipe.batch_size` rows, or
  packed rows (`trainer.packing`)."""
  n, max_len = train["input_ids"].shape
  if trainer.packing:
    shards = sharding.num_batch_shards(trainer.mesh) * jax.process_count()
    lengths_N, per_batch, steps = packed_plan(train, recipe, trainer.packing, shards)
    if progress:
      print(
          f"{say}packed rows of {max_len} tokens, up to {trainer.packing} examples each, "
          f"{per_batch} rows a batch ({np.mean(lengths_N):.1f} real tokens per example; "
          "--no-packing)",
          flush=True,
      )

    def build(rows):
      return batching.packed_batch(train, lengths_N, rows, trainer.packing, per_batch)[0]

    def packed(rng):
      epoch = batching.packed_epoch(lengths_N, max_len, trainer.packing, per_batch, rng)
      return [functools.partial(build, rows) for rows in epoch]

    return packed, steps, [build([[0]])]
  padded_N = padded_lengths(
      train["attention_mask"],
      recipe.length_bucket,
      MIN_BATCHES_PER_LENGTH * recipe.batch_size,
      recipe.max_lengths,
      compile_tokens(recipe.batch_size, recipe.epochs),
  )
  lengths = [int(x) for x in np.unique(padded_N)]
  if progress:
    print(
        f"{say}batch lengths {', '.join(map(str, lengths))} "
        f"({np.mean(padded_N):.1f} tokens per row, {np.mean(train['attention_mask'].sum(1)):.1f} "
        "real; --length-bucket, --max-lengths)",
        flush=True,
    )

  def bucketed(rng):
    return [
        functools.partial(train_batch, train, idx, int(padded_N[idx].max()), recipe.batch_size)
        for idx in epoch_batches(padded_N, recipe.batch_size, rng)
    ]

  one = np.arange(min(n, 1))
  shapes = [train_batch(train, one, length, recipe.batch_size) for length in lengths]
  return bucketed, steps_per_epoch(n, recipe), shapes


def _fmt(entry: dict) -> str:
  return " ".join(
      f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
      for k, v in entry.items()
      if k != "epoch"
  )


def save_params(workdir: str, params, meta: dict) -> None:
  """The fine-tuned parameters (orbax) under workdir/best/, what they are in best.json."""
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(fs.absolute(workdir) / "best", params, force=True)
  if jax.process_index() == 0:
    (fs.path(workdir) / "best.json").write_text(json.dumps(meta, indent=2))
