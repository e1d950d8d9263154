"""Fine-tune a restored encoder with a task head: the machinery GLUE, SQuAD and NER share.

    trainer = finetuning.Trainer(make_model, enc, recipe, total_steps, loss_fn, "squad")
    result = finetuning.fit(trainer, train_arrays, recipe, evaluate, "f1", workdir)

`make_model(cfg)` builds a Flax module (`model.BertForSequenceClassification`,
`BertForQuestionAnswering`, `BertForTokenClassification`) that holds the encoder as the
submodule "bert" and takes (input_ids, token_type_ids, attention_mask); `loss_fn(outputs, batch)`
turns its outputs into a mean loss. Batches are dicts of arrays with the global batch on the
leading axis; "weights" (1 real row, 0 padding) is added by `fit`.

The mesh is pretraining's (`sharding.make_mesh`, axes data/fsdp/tensor from `Recipe.mesh`,
`--mesh`; data-parallel over every device by default) and so are the parameter shardings: the
state is built from `jax.eval_shape` with shardings from the model's logical axes
(`sharding.LOGICAL_AXIS_RULES`), so with fsdp > 1 the parameters and Adam moments are split as
in `bertjax pretrain` (BERT-large fits where one copy would not). The state is created by a
jitted init that takes the restored encoder as an argument, so the encoder goes straight from
the checkpoint to its place. Steps are jitted with explicit shardings and donate the old state.
No mesh context or logical-axis rules are entered around the steps: the jit shardings place the
batch and the parameters and XLA propagates the rest (under the rules, flax's parameter shape
check trips over DenseGeneral's flat [H, 3*N*D] init, see docs/glue.md).

Batches are length-aware: each is cut to its rows' longest real length rounded up to
`Recipe.length_bucket` (`padded_lengths`, `epoch_batches`), so a task of short sentences trains
at the cost of its real tokens with a few compiled shapes (a length is kept only if the padding
it saves over the run outweighs a compile, at most `Recipe.max_lengths` of them); prediction
batches rows by length too and returns them in the input's order. The steps of every length a
run will use are compiled before its first step, side by side in threads
(`Trainer.compile_ahead`). Host batches are built and transferred one step ahead (`prefetch`)
and the loss is read one step late.

Shape letters: B batch, L sequence length.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import json
import os
import time
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm import tqdm

from bertjax import model as model_lib
from bertjax.tasks.encoder import Encoder
from bertjax.training import optim, sharding

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
LossFn = Callable[[Any, dict], jax.Array]  # (model outputs, batch) -> mean loss


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Fine-tuning hyperparameters; the defaults are BERT's GLUE recipe."""

  learning_rate: float = 2e-5  # BERT searched {5e-5, 4e-5, 3e-5, 2e-5}
  epochs: int = 3
  batch_size: int = 32  # global, split over all devices
  eval_batch_size: int = 64  # global; only memory depends on it
  warmup_fraction: float = 0.1  # of all steps, then linear decay to 0
  weight_decay: float = 0.01  # AdamW, masked off biases and LayerNorm
  optimizer: str = "bert_adamw"  # bert_adamw | adamw (`make_optimizer`)
  dropout: float = 0.1  # hidden and attention dropout, replacing the checkpoint's
  clip_norm: float = 1.0  # global-norm clipping, as BERT's optimizer
  seed: int = 0  # head init, dropout and data order
  max_steps: int = 0  # > 0 caps the steps per epoch (smoke tests)
  length_bucket: int = 8  # batches padded to a multiple of this; 0: to the arrays' length
  max_lengths: int = 8  # at most this many batch lengths (compiled shapes); 0: no cap
  mesh: tuple[int, int, int] = (-1, 1, 1)  # (data, fsdp, tensor), as pretraining's config.mesh
  pooling: str = "cls"  # GLUE head: cls (BERT's pooled [CLS]) | mean (of the last layer)


# Peak learning rate and --sweep grid by encoder width. BERT's (Devlin et al. 2018) are for
# base/large; small encoders need larger ones (Turc et al. 2019 searched up to 3e-4 for their
# small BERTs; a tiny model pretrained here for 300 steps reached 0.732 dev accuracy at 1e-3 and
# 0.551 at 2e-5 on a single-sentence task).
_LEARNING_RATES = (  # (largest hidden size, default, sweep grid)
    (128, 1e-3, (3e-3, 1e-3, 3e-4, 1e-4)),
    (256, 5e-4, (1e-3, 5e-4, 3e-4, 1e-4)),
    (512, 1e-4, (3e-4, 1e-4, 5e-5, 3e-5)),
)
BERT_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)  # the BERT paper's GLUE grid


def learning_rates_for(
    hidden_size: int, bert_default: float = 2e-5
) -> tuple[float, tuple[float, ...], str]:
  """(default peak lr, --sweep grid, why) for an encoder of `hidden_size`; `bert_default` is
  the command's BERT-base value (GLUE 2e-5, SQuAD 3e-5, NER 5e-5)."""
  for width, lr, grid in _LEARNING_RATES:
    if hidden_size <= width:
      return (
          lr,
          grid,
          f"for hidden size {hidden_size} (<= {width}); BERT's {bert_default:g} is for base/large",
      )
  return bert_default, BERT_LEARNING_RATES, f"BERT's, for hidden size {hidden_size}"


@flax.struct.dataclass
class State:
  step: jax.Array
  params: Any  # {"bert": ..., and the head's subtree}
  opt_state: Any
  rng: jax.Array  # dropout key; step keys are fold_in(rng, step)
  learning_rate: jax.Array  # peak learning rate: a value, not a constant, so one compiled
  # step serves every run of a sweep


OPTIMIZERS = ("bert_adamw", "adamw")


def optimizer_for(hidden_size: int) -> tuple[str, str]:
  """(default `Recipe.optimizer`, why) for an encoder of `hidden_size`: BERT's where BERT's
  learning rates apply (`learning_rates_for`), bias-corrected AdamW for the smaller encoders."""
  width = _LEARNING_RATES[-1][0]
  if hidden_size > width:
    return "bert_adamw", f"BERT's, for hidden size {hidden_size}"
  return "adamw", (
      f"bias-corrected, for hidden size {hidden_size} (<= {width}); BERT's "
      "bert_adamw is for base/large"
  )


def make_optimizer(recipe: Recipe, total_steps: int) -> optax.GradientTransformation:
  """Global-norm clipping, then `recipe.optimizer` with its schedule's shape peaking at 1 (the
  train step scales the update by the state's peak learning rate):

    bert_adamw  google-research/bert's create_optimizer, as run_classifier/run_squad use it:
                AdamWeightDecayOptimizer (no bias correction) on BERT's schedule
    adamw       optax's bias-corrected AdamW, warmup then linear decay from the peak to 0

  Both β 0.9/0.999, ε 1e-6, decay masked off biases and LayerNorm. Mosbach et al. 2021 ("On
  the stability of fine-tuning BERT") found that Adam's bias correction, which BERT's optimizer
  leaves out, makes fine-tuning more stable: hence `adamw` outside BERT's recipe.
  """
  warmup = int(recipe.warmup_fraction * total_steps)
  if recipe.optimizer == "bert_adamw":
    shape, opt = optim.bert_schedule(1.0, warmup, total_steps), optim.bert_adamw
  elif recipe.optimizer == "adamw":
    shape, opt = optim.warmup_linear_decay(1.0, warmup, total_steps), optim.adamw
  else:
    raise ValueError(
        f"Recipe.optimizer={recipe.optimizer!r}; valid: " f"{', '.join(map(repr, OPTIMIZERS))}"
    )
  return optax.chain(
      optax.clip_by_global_norm(recipe.clip_norm),
      opt(shape, b1=0.9, b2=0.999, eps=1e-6, weight_decay=recipe.weight_decay),
  )


def init_train_state(model, tx, bert_params, key, learning_rate):
  """(boxed params, State): a new model whose "bert" subtree is `bert_params` if given."""
  z = jnp.zeros((1, 8), jnp.int32)
  params_key, dropout_key = jax.random.split(key)
  boxed = model.init({"params": params_key}, z, z, jnp.ones_like(z))["params"]
  params = nn.unbox(boxed)
  if bert_params is not None:
    params = {**params, "bert": bert_params}  # the head stays new
  return boxed, State(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      rng=dropout_key,
      learning_rate=jnp.asarray(learning_rate, jnp.float32),
  )


def check_encoder(want_boxed, got_abs, source: str, prefix: str) -> None:
  """Every parameter the config implies is in the restored encoder, with its shape."""
  if got_abs is None:
    return
  want = dict(jax.tree_util.tree_leaves_with_path(nn.unbox(want_boxed)))
  got = dict(jax.tree_util.tree_leaves_with_path(got_abs))
  for path, w in want.items():
    name = "bert/" + "/".join(str(getattr(p, "key", p)) for p in path)
    if path not in got:
      raise ValueError(f"{prefix}: {source}: encoder has no {name}")
    if tuple(got[path].shape) != tuple(w.shape):
      raise ValueError(
          f"{prefix}: {source}: {name} has shape {tuple(got[path].shape)}, its "
          f"config implies {tuple(w.shape)}"
      )


def to_global(batch: dict, sh) -> dict:
  """Every process holds the whole global batch (fine-tuning sets fit in host memory); each
  gives its slice of rows."""
  pi, pc = jax.process_index(), jax.process_count()
  out = {}
  for k, v in batch.items():
    per = v.shape[0] // pc
    out[k] = jax.make_array_from_process_local_data(sh, v[pi * per : (pi + 1) * per], v.shape)
  return out


def progress_bar(total: int, desc: str, enabled: bool):
  return tqdm(
      total=total,
      desc=desc,
      disable=not enabled or jax.process_index() != 0,
      leave=True,
      dynamic_ncols=True,
  )


def masked_mean(per_example_B: jax.Array, weights_B: jax.Array) -> jax.Array:
  return jnp.sum(per_example_B * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)


# ------------------------------------------------------------------------------- the trainer


def _train_step(state: State, batch: dict, *, model, tx, loss_fn: LossFn):
  key = jax.random.fold_in(state.rng, state.step)

  def loss_of(params):
    out = model.apply(
        {"params": params},
        *(batch[k] for k in MODEL_INPUTS),
        deterministic=False,
        rngs={"dropout": key},
    )
    return loss_fn(out, batch)

  loss, grads = jax.value_and_grad(loss_of)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  updates = jax.tree.map(lambda u: u * state.learning_rate, updates)
  return (
      state.replace(
          step=state.step + 1,
          params=optax.apply_updates(state.params, updates),
          opt_state=opt_state,
      ),
      loss,
  )


def _predict_step(params, batch: dict, *, model):
  return model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=True)


class Trainer:
  """Model, optimizer, shardings and jitted steps for one (head, encoder, recipe); `name`
  ("glue", "squad", "ner") prefixes its messages."""

  def __init__(
      self,
      make_model: Callable[[model_lib.BertConfig], nn.Module],
      enc: Encoder,
      recipe: Recipe,
      total_steps: int,
      loss_fn: LossFn,
      name: str,
      mesh: jax.sharding.Mesh | None = None,
  ):
    self.name = name
    if mesh is None:
      try:
        mesh = sharding.make_mesh(*recipe.mesh)
      except ValueError as e:
        raise ValueError(f"{name}: --mesh={','.join(map(str, recipe.mesh))}: {e}") from None
    self.mesh = mesh
    self.length_bucket, self.max_lengths = recipe.length_bucket, recipe.max_lengths
    shards = sharding.num_batch_shards(self.mesh) * jax.process_count()
    for field in ("batch_size", "eval_batch_size"):
      if getattr(recipe, field) % shards:
        raise ValueError(
            f"{name}: --{field.replace('_', '-')}={getattr(recipe, field)} is not "
            f"divisible by the {shards} batch shards; use a multiple of {shards}"
        )
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
    init = functools.partial(init_train_state, self.model, self.tx)
    boxed_abs, state_abs = jax.eval_shape(init, bert_abs, jax.random.key(0), 0.0)
    check_encoder(boxed_abs["bert"], bert_abs, enc.source, name)
    param_sh = sharding.state_shardings(boxed_abs, self.mesh)
    repl = sharding.replicated(self.mesh)
    opt_sh = sharding.opt_state_shardings(self.tx, state_abs.opt_state, param_sh, self.mesh)
    self.state_sh = State(
        step=repl, params=param_sh, opt_state=opt_sh, rng=repl, learning_rate=repl
    )
    self.param_sh, self.batch_sh = param_sh, sharding.batch_sharding(self.mesh)
    self._init_compiled = None
    self._init = jax.jit(
        lambda b, k, lr: init(b, k, lr)[1],
        in_shardings=(None if bert_abs is None else param_sh["bert"], repl, repl),
        out_shardings=self.state_sh,
    )
    self.traces = {"train": 0, "predict": 0}
    self._executables: dict[tuple, Any] = {}  # (kind, batch shapes) -> compiled step
    self._train = jax.jit(
        self._counted(
            "train", functools.partial(_train_step, model=self.model, tx=self.tx, loss_fn=loss_fn)
        ),
        in_shardings=(self.state_sh, self.batch_sh),
        out_shardings=(self.state_sh, repl),
        donate_argnums=0,
    )
    self._predict_fn = functools.partial(_predict_step, model=self.model)
    self._predict = jax.jit(
        self._counted("predict", self._predict_fn),
        in_shardings=(param_sh, self.batch_sh),
        out_shardings=repl,
    )

  def init_state(self, seed: int, learning_rate: float) -> State:
    """The restored encoder (resharded from wherever the checkpoint put it) and a new head
    from `seed`."""
    bert = None
    if self.bert_params is not None:
      bert = jax.device_put(
          jax.tree.map(
              lambda x: x if isinstance(x, jax.Array) else np.asarray(x, np.float32),
              self.bert_params,
          ),
          self.param_sh["bert"],
      )
    args = (bert, jax.random.key(seed), np.float32(learning_rate))
    if self._init_compiled is None:
      # It runs once per sweep: on CPU, XLA's backend optimizations cost more compile time
      # than they save (BERT-mini on 2 cores: 12.5 s to compile, 0.3 s to run; unoptimized
      # 4.6 s and 1.2 s).
      opts = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None
      self._init_compiled = self._init.lower(*args).compile(compiler_options=opts)
    return self._init_compiled(*args)

  def train_step(self, state: State, batch: dict) -> tuple[State, jax.Array]:
    """One step on a host batch (`fit` hands it device batches, already placed)."""
    if not isinstance(batch["input_ids"], jax.Array):
      batch = to_global(batch, self.batch_sh)
    return self._executables.get(_shapes("train", batch), self._train)(state, batch)

  def compile_ahead(self, jobs: list[tuple[str, Any, dict]]) -> None:
    """Compile the steps of `jobs` (kind "train" or "predict", its first argument: the state
    or the params, an example host batch of the shape to compile) that are not compiled yet,
    side by side: each is traced here, then XLA compiles them in threads (the compiler releases
    the GIL), one per core. `train_step` and `predict` then run the compiled executables."""
    todo = {}
    for kind, first, batch in jobs:
      batch = to_global(batch, self.batch_sh)  # the dtypes and shardings the steps will see
      key = _shapes(kind, batch)
      if key not in self._executables and key not in todo:
        todo[key] = (self._train if kind == "train" else self._predict).lower(first, batch)
    if not todo:
      return
    workers = min(len(todo), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      for key, exe in zip(todo, pool.map(lambda lowered: lowered.compile(), todo.values())):
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

  def predict(self, params, arrays: dict[str, np.ndarray], batch_size: int, progress=False):
    """The model's outputs for every row of `arrays` as numpy, [N, ...] per leaf, in the rows'
    order. Rows are batched by padded length (`padded_lengths`); a length axis is padded back
    to the arrays' with the dtype's minimum (never an argmax or top-n candidate); the last
    batch is padded by wrapping around and the padding dropped."""
    n, max_len = arrays["input_ids"].shape
    if n == 0:
      batch = {
          k: jax.ShapeDtypeStruct((batch_size,) + arrays[k].shape[1:], arrays[k].dtype)
          for k in MODEL_INPUTS
      }
      out_abs = jax.eval_shape(self._predict_fn, params, batch)
      return jax.tree.map(lambda s: np.zeros((0,) + s.shape[1:], s.dtype), out_abs)
    padded_N = padded_lengths(
        arrays["attention_mask"],
        self.length_bucket,
        MIN_BATCHES_PER_LENGTH * batch_size,
        self.max_lengths,
        compile_tokens(batch_size),
    )
    order = np.argsort(padded_N, kind="stable")
    seq = self._sequence_leaves(params, arrays)
    plan = []  # (rows, length) of every batch; wrap-around pads the last
    for start in range(0, n, batch_size):
      idx = order[np.arange(start, start + batch_size) % n]
      plan.append((idx, int(padded_N[idx].max())))
    one_per_length = {length: idx for idx, length in plan}  # the shapes to compile
    self.compile_ahead(
        [
            ("predict", params, take(arrays, idx, length, MODEL_INPUTS))
            for length, idx in one_per_length.items()
        ]
    )

    def full_length(x, is_seq):
      x = np.asarray(x)
      if not is_seq or x.shape[1] == max_len:
        return x
      fill = np.finfo(x.dtype).min if np.issubdtype(x.dtype, np.floating) else 0
      width = [(0, 0), (0, max_len - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
      return np.pad(x, width, constant_values=fill)

    out, treedef = [], None
    bar = progress_bar(len(plan), f"{self.name} predict", progress)
    batches = (take(arrays, idx, length, MODEL_INPUTS) for idx, length in plan)
    for batch in prefetch(batches, self.batch_sh):
      step = self._executables.get(_shapes("predict", batch), self._predict)
      leaves, treedef = jax.tree.flatten(step(params, batch))
      out.append([full_length(x, s) for x, s in zip(leaves, seq)])
      bar.update(1)
    bar.close()
    rows_N = np.empty(n, np.int64)
    rows_N[order] = np.arange(n)  # input row -> its place in the sorted order
    return jax.tree.unflatten(treedef, [np.concatenate(xs)[rows_N] for xs in zip(*out)])


# ----------------------------------------------------------------------- length-aware batches


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


def _shapes(kind: str, batch: dict) -> tuple:
  """The key of a compiled step: its kind and the batch's shapes and dtypes."""
  return (kind,) + tuple((k, np.shape(v), str(v.dtype)) for k, v in sorted(batch.items()))


def padded_lengths(
    mask_NxL: np.ndarray,
    bucket: int,
    min_rows: int = 0,
    max_lengths: int = 0,
    compile_tokens: float = 0.0,
) -> np.ndarray:
  """[N] the length each row is padded to: its real tokens rounded up to a multiple of
  `bucket`, at most L (0: every row to L); a length with fewer than `min_rows` rows goes up to
  the next longer one (the longest, rare, takes the next shorter one in). Then the lengths
  kept are the ones that minimise the padded tokens plus `compile_tokens` per length kept
  (what a compile costs, in tokens; `fewest_padded_lengths`), at most `max_lengths` (> 0) of
  them: few compiled steps, each worth its compile."""
  n, max_len = mask_NxL.shape
  if bucket <= 0:
    return np.full(n, max_len, np.int64)
  # One past the last real token (not the mask's sum: a mask need not be a prefix).
  real_N = np.where(mask_NxL.any(axis=1), max_len - np.argmax(mask_NxL[:, ::-1] != 0, axis=1), 1)
  padded_N = np.minimum(-(-real_N // bucket) * bucket, max_len)
  lengths = np.unique(padded_N)
  for short, longer in zip(lengths[:-1], lengths[1:]):
    if np.sum(padded_N == short) < min_rows:
      padded_N[padded_N == short] = longer
  lengths = np.unique(padded_N)
  while len(lengths) > 1 and np.sum(padded_N == lengths[-1]) < min_rows:  # a rare longest
    padded_N[padded_N == lengths[-2]] = lengths[-1]  # length takes its neighbour in
    lengths = lengths[np.arange(len(lengths)) != len(lengths) - 2]
  if len(lengths) > 1 and (compile_tokens > 0 or 0 < max_lengths < len(lengths)):
    counts = np.array([np.sum(padded_N == v) for v in lengths])
    kept = fewest_padded_lengths(lengths, counts, max_lengths or len(lengths), compile_tokens)
    padded_N = kept[np.searchsorted(kept, padded_N)]
  return padded_N


def fewest_padded_lengths(
    lengths: np.ndarray, counts: np.ndarray, k: int, per_length: float = 0.0
) -> np.ndarray:
  """At most `k` of the sorted `lengths` (the longest always among them) that minimise the
  padded tokens, when each of `counts[i]` rows of length `lengths[i]` is padded up to the next
  kept length, plus `per_length` for each length kept: dynamic programming over (kept so
  far, last kept), O(k·n²) for n lengths."""
  n = len(lengths)
  k = min(k, n)
  rows_upto = np.concatenate([[0], np.cumsum(counts)])
  # cost[j][i]: fewest padded tokens of the rows of lengths[:i + 1] with j + 1 lengths kept,
  # lengths[i] the longest of them
  cost = np.full((k, n), np.inf)
  back = np.zeros((k, n), np.int64)
  cost[0] = rows_upto[1:] * lengths
  for j in range(1, k):
    for i in range(j, n):
      prev = cost[j - 1, :i] + (rows_upto[i + 1] - rows_upto[1 : i + 1]) * lengths[i]
      back[j, i] = int(np.argmin(prev))
      cost[j, i] = prev[back[j, i]]
  j = int(np.argmin(cost[:, n - 1] + per_length * np.arange(1, k + 1)))
  kept, i = [n - 1], n - 1
  while j > 0:
    i = back[j, i]
    kept.append(i)
    j -= 1
  return lengths[sorted(kept)]


def epoch_batches(
    padded_N: np.ndarray, batch_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
  """One epoch's batches of row indexes: rows shuffled, grouped by padded length (a stable
  sort keeps the shuffle within each length), cut into batches, the batches shuffled. Only the
  batches on a length's boundary mix lengths (padded to the longer), only the last is short:
  ceil(N / batch) steps, as without buckets."""
  order = rng.permutation(len(padded_N))
  order = order[np.argsort(padded_N[order], kind="stable")]
  chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
  return [chunks[i] for i in rng.permutation(len(chunks))]


def take(arrays: dict[str, np.ndarray], idx: np.ndarray, length: int, keys=None) -> dict:
  """Rows `idx` of `arrays` (of `keys`, default all), [N, L] arrays cut to `length`."""
  max_len = arrays["input_ids"].shape[1]
  out = {}
  for k in keys or arrays:
    v = arrays[k][idx]
    out[k] = v[:, :length] if v.ndim >= 2 and v.shape[1] == max_len else v
  return out


def train_batch(
    arrays: dict[str, np.ndarray], idx: np.ndarray, length: int, batch_size: int
) -> dict:
  """A training batch of rows `idx`, padded to `batch_size` by repeating rows of weight 0."""
  weights = np.zeros(batch_size, np.float32)
  weights[: len(idx)] = 1.0
  return dict(take(arrays, np.resize(idx, batch_size), length), weights=weights)


def prefetch(batches, sh, size: int = 2):
  """Host batches as global device arrays, `size` ahead: the next batch is built and its
  transfer started while the device runs the current step (dispatch is asynchronous)."""
  queue = collections.deque()
  for b in itertools.islice(batches, size):
    queue.append(to_global(b, sh))
  while queue:
    yield queue.popleft()
    for b in itertools.islice(batches, 1):
      queue.append(to_global(b, sh))


# ---------------------------------------------------------------------------------- the loop


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
) -> FitResult:
  """Train for `recipe.epochs` on the rows of `train`, scoring `evaluate(params)` after each
  epoch; the epoch with the highest `main_metric` is kept. Writes workdir/metrics.jsonl.
  Batches are length-aware (`epoch_batches`, seeded by `recipe.seed`) and prefetched; the
  loss is read one step late (progress bar) or once an epoch, so the host never syncs a step.
  `run_name` (a GLUE task) goes into the progress bars and log lines."""
  os.makedirs(workdir, exist_ok=True)
  n = len(train["input_ids"])
  steps = steps_per_epoch(n, recipe)
  padded_N = padded_lengths(
      train["attention_mask"],
      recipe.length_bucket,
      MIN_BATCHES_PER_LENGTH * recipe.batch_size,
      recipe.max_lengths,
      compile_tokens(recipe.batch_size, recipe.epochs),
  )
  state = trainer.init_state(recipe.seed, recipe.learning_rate)
  lengths = [int(x) for x in np.unique(padded_N)]
  what = f"{run_name} " if run_name else ""
  if progress:
    print(
        f"{trainer.name}: {what}batch lengths {', '.join(map(str, lengths))} "
        f"({np.mean(padded_N):.1f} tokens per row, {np.mean(train['attention_mask'].sum(1)):.1f} "
        "real; --length-bucket, --max-lengths)",
        flush=True,
    )
  trainer.compile_ahead(
      [
          ("train", state, train_batch(train, np.arange(min(n, 1)), length, recipe.batch_size))
          for length in lengths
      ]
  )
  rng = np.random.default_rng(recipe.seed)
  history, best, best_epoch, best_params = [], None, 0, None
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as log:
    if eval_untrained:
      entry = dict(epoch=0, **evaluate(state.params))
      history.append(entry)
      log.write(json.dumps(entry) + "\n")
      print(f"{trainer.name}: {what}untrained: " + _fmt(entry), flush=True)
    for epoch in range(1, recipe.epochs + 1):
      t0 = time.time()
      plan = epoch_batches(padded_N, recipe.batch_size, rng)[:steps]
      host = (train_batch(train, idx, int(padded_N[idx].max()), recipe.batch_size) for idx in plan)
      losses = []
      bar = progress_bar(
          steps, f"{run_name or trainer.name} epoch {epoch}/{recipe.epochs}", progress
      )
      for batch in prefetch(host, trainer.batch_sh):
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


def steps_per_epoch(n: int, recipe: Recipe) -> int:
  steps = -(-n // recipe.batch_size)  # the last batch is padded, weight 0
  return min(steps, recipe.max_steps) if recipe.max_steps else steps


def _fmt(entry: dict) -> str:
  return " ".join(
      f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
      for k, v in entry.items()
      if k != "epoch"
  )


def save_params(workdir: str, params, meta: dict) -> None:
  """The fine-tuned parameters (orbax) under workdir/best/, what they are in best.json."""
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.abspath(os.path.join(workdir, "best")), params, force=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "best.json"), "w") as f:
      json.dump(meta, f, indent=2)
