"""Pretraining's model, optimizer and jitted train / eval steps on a mesh.

    setup = train.setup(config, mesh)
    state = setup.init_state(seed)                  # created already sharded on the mesh
    state, metrics = setup.train_step(state, batch)   # batch: dict of global jax.Arrays

The state (`train_state.TrainState`, the one fine-tuning uses too) is built by
`train_state.build`: abstractly (`jax.eval_shape`), with shardings from the logical axes the
model attaches to every parameter (`sharding.LOGICAL_AXIS_RULES`), by an `init` jitted with those
`out_shardings`, so BERT-large is never materialised on one device. The steps are jitted by
`train_state.jit_step` with explicit in/out shardings; the train step donates the old state.
The loop that drives them lives in `bertjax.training.loop`. This module imports no TensorFlow.

Shape letters: B batch, M microbatches, L sequence length, P masked positions, E examples
per packed row.

Batch-size warmup (`config.train.batch_warmup_steps`, with `microbatches` > 1): the step
trains on the first `optim.active_microbatches(step, ...)` microbatches of its batch and skips
the others in a conditional; the batch's shape never changes, so the step compiles once.

Packed batches (`config.data.packing`, bertjax.data.packing) carry `segment_ids`,
`position_ids` [B, L], `cls_positions`, `nsp_weights` [B, E] besides the usual arrays; the steps
hand the first three to the model and weight the per-example NSP loss by `nsp_weights`. An
unpacked batch lacks them and takes exactly the unpacked path.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertjax import errors, model as model_lib
from bertjax.training import objective as objective_lib
from bertjax.training import objective_contrastive, optim, sharding, train_state
from bertjax.training.objective_mlm import MODEL_INPUTS, PACKED_INPUTS

Array = jax.Array
# What the train step reads of a batch; anything else the stream adds stays out of the jit.
STEP_INPUTS = (
    MODEL_INPUTS
    + PACKED_INPUTS
    + ("masked_ids", "masked_weights", "nsp_labels", "nsp_weights")
    + ("sources",)  # a mixture's [B, N] one-hot source of each row (bertjax.data.mixture)
    + objective_contrastive.BATCH_KEYS  # pairs: queries [B, Lq], documents [B, D, Ld]
)
# BertConfig fields that `config.model` may set besides `preset`.
_MODEL_FIELDS = {f.name for f in dataclasses.fields(model_lib.BertConfig)}


TrainState = train_state.TrainState  # params: BertForPreTraining's; rng: a uint32[2] key


def model_config(config) -> model_lib.BertConfig:
  """`BertConfig` from `config.model` (a preset plus overrides; None means the preset's)."""
  m = config.model
  overrides = {k: v for k, v in m.items() if k != "preset" and v is not None}
  unknown = sorted(set(overrides) - _MODEL_FIELDS)
  if unknown:
    raise errors.ConfigError(
        f"config.model: unknown fields {unknown}; valid: {sorted(_MODEL_FIELDS)}"
    )
  if "vocab_size" not in overrides:
    raise errors.ConfigError(
        "config.model.vocab_size is unset: it must match the tokenizer "
        "(bertjax.training.loop fills it from the prepared data's metadata.json)"
    )
  return model_lib.BertConfig.from_preset(m.preset, **overrides)


# The parameters of each head a `BertForPreTraining` tree holds beside its encoder.
HEAD_PARAMS = {
    "mlm": (("mlm_transform",), ("mlm_layer_norm",), ("mlm_bias",)),
    "nsp": (("nsp",),),
    "pooler": (("bert", "pooler"),),
}


def trained_heads(config) -> tuple[str, ...]:
  """The heads (`HEAD_PARAMS`) a step of config.objective trains."""
  return objective_lib.make(config, model_config(config)).trained_heads()


def head_mask(params, heads) -> Any:
  """A tree of bools like `params`: True for the parameters of `heads`."""
  paths = [p for h in heads for p in HEAD_PARAMS[h]]

  def of_head(path, _):
    keys = tuple(getattr(k, "key", k) for k in path)
    return any(keys[: len(p)] == p for p in paths)

  return jax.tree_util.tree_map_with_path(of_head, params)


def electra_generator_config(config, bert_config: model_lib.BertConfig):
  """The ELECTRA generator's `BertConfig` under `config.objective == "electra"`, else None."""
  obj = objective_lib.make(config, bert_config)
  return getattr(obj, "generator_config", None)


@dataclasses.dataclass
class Setup:
  """Everything the loop needs, built once per (config, mesh)."""

  config: Any  # the ml_collections ConfigDict
  bert_config: model_lib.BertConfig  # ELECTRA: the discriminator's
  objective: objective_lib.Objective  # what is trained, and how its loss is counted
  model: nn.Module  # the objective's network: BertForPreTraining, ElectraForPreTraining
  mesh: jax.sharding.Mesh
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: TrainState  # ShapeDtypeStructs with their shardings: the restore target
  state_shardings: TrainState  # NamedShardings, same structure
  batch_sharding: jax.sharding.NamedSharding  # leading axis over data x fsdp
  init_state: Callable[[int], TrainState]
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
  eval_step: Callable[[Any, dict], dict]  # (params, batch) -> summed metrics


def _init_fn(model, tx, seed_or_key):
  d = model_lib.dummy_inputs(1, 8, 2)
  key = jax.random.PRNGKey(seed_or_key) if jnp.ndim(seed_or_key) == 0 else seed_or_key
  params_key, dropout_key = jax.random.split(key)
  boxed = model.init(
      {"params": params_key, "sample": params_key},
      d["input_ids"],
      d["token_type_ids"],
      d["attention_mask"],
      d["masked_positions"],
  )["params"]
  return boxed, TrainState(
      step=jnp.zeros((), jnp.int32),
      params=nn.unbox(boxed),
      opt_state=tx.init(nn.unbox(boxed)),
      rng=dropout_key,
  )


def setup(config, mesh: jax.sharding.Mesh, head_warmup=(0, ())) -> Setup:
  """Model, optimizer, abstract state, shardings and the jitted init / train / eval steps.

  `head_warmup` (steps, heads): for the first `steps` steps only the parameters of `heads`
  (`HEAD_PARAMS`) change; every other gradient and update is zero (`loop.head_warmup`)."""
  bert_config = model_config(config)
  obj = objective_lib.make(config, bert_config)
  model = obj.model
  schedule = optim.make_schedule(config.train, config.get("phase2"))
  tx = optim.make_optimizer(config.train, schedule)

  built = train_state.build(functools.partial(_init_fn, model, tx), tx, mesh, 0)
  repl = sharding.replicated(mesh)
  batch_sharding = sharding.batch_sharding(mesh)

  def init_state(seed: int) -> TrainState:
    return built.init(jnp.asarray(seed, jnp.uint32))

  step_fn = functools.partial(
      _train_step,
      objective=obj,
      tx=tx,
      schedule=schedule,
      mesh=mesh,
      microbatches=config.train.microbatches,
      batch_warmup=(
          config.train.batch_warmup_steps,
          config.train.batch_warmup_start,
      ),
      inject_nan_at_step=config.train.inject_nan_at_step,
      head_warmup=(
          (head_warmup[0], head_mask(built.abstract.params, head_warmup[1]))
          if head_warmup[0] > 0 and head_warmup[1]
          else None
      ),
  )
  train_step = train_state.jit_step(
      step_fn,
      mesh,
      in_shardings=(built.shardings, batch_sharding),
      out_shardings=(built.shardings, repl),
      donate_argnums=0,
  )
  eval_step = train_state.jit_step(
      functools.partial(_eval_step, objective=obj),
      mesh,
      in_shardings=(built.shardings.params, batch_sharding),
      out_shardings=repl,
  )
  return Setup(
      config=config,
      bert_config=bert_config,
      objective=obj,
      model=model,
      mesh=mesh,
      tx=tx,
      schedule=schedule,
      abstract_state=built.abstract,
      state_shardings=built.shardings,
      batch_sharding=batch_sharding,
      init_state=init_state,
      train_step=train_step,
      eval_step=eval_step,
  )


def _split_microbatches(batch: dict, m: int, mesh) -> dict:
  """[B, ...] -> [M, B/M, ...] taking rows m, m+M, ...: each microbatch spans every shard."""

  def split(x):
    x = x.reshape((x.shape[0] // m, m) + x.shape[1:]).swapaxes(0, 1)
    spec = jax.sharding.PartitionSpec(None, *sharding.logical_to_spec(("batch",)))
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))

  return jax.tree.map(split, batch)


def _train_step(
    state: TrainState,
    batch: dict,
    *,
    objective: objective_lib.Objective,
    tx,
    schedule,
    mesh,
    microbatches: int,
    batch_warmup: tuple[int, int],
    inject_nan_at_step: int,
    head_warmup: tuple[int, Any] | None = None,
):
  batch = {k: v for k, v in batch.items() if k in STEP_INPUTS}
  # Batch-size warmup: only the first `active` microbatches train (the others weigh 0 and
  # are skipped); the batch keeps its shape, so the step compiles once.
  warming = microbatches > 1 and batch_warmup[0] > 0
  if warming:
    active = optim.active_microbatches(state.step, microbatches, *batch_warmup)
    rows = batch["input_ids"].shape[0]
    batch = _weigh_rows(batch, (jnp.arange(rows) % microbatches < active).astype(jnp.float32))
  # Counts of the whole batch first, so each microbatch's loss is scaled exactly.
  counts = objective.counts(batch)
  step_key = jax.random.fold_in(state.rng, state.step)
  batch, draw = objective.prepare(batch, step_key)

  if microbatches == 1:
    sums, grads = objective.grad(state.params, batch, step_key, counts, draw)
  else:

    zeros_g = jax.tree.map(jnp.zeros_like, state.params)
    zeros_s = {k: jnp.zeros((), jnp.float32) for k in objective.sum_names}

    def body(carry, xs):
      grads_acc, sums_acc = carry
      i, mb = xs

      def run(mb):
        s, g = objective.grad(state.params, mb, jax.random.fold_in(step_key, i), counts, draw)
        return g, s

      if warming:  # a conditional, so a skipped microbatch costs no FLOPs
        g, s = jax.lax.cond(i < active, run, lambda _: (zeros_g, zeros_s), mb)
      else:
        g, s = run(mb)
      return (jax.tree.map(jnp.add, grads_acc, g), jax.tree.map(jnp.add, sums_acc, s)), None

    (grads, sums), _ = jax.lax.scan(
        body,
        (zeros_g, zeros_s),
        (jnp.arange(microbatches), _split_microbatches(batch, microbatches, mesh)),
    )

  metrics = objective.finalize(sums)
  loss = metrics["loss"]
  if inject_nan_at_step >= 0:  # testing the guard: poison one step's loss and gradients
    poison = jnp.where(state.step == inject_nan_at_step, jnp.nan, 1.0)
    loss = loss * poison
    grads = jax.tree.map(lambda g: g * poison, grads)
  freeze = lambda tree: tree
  if head_warmup is not None:  # fresh heads first: the rest of the network holds still
    warm_steps, mask = head_warmup
    heads_only = state.step < warm_steps
    freeze = lambda tree: jax.tree.map(
        lambda x, m: x if m else jnp.where(heads_only, jnp.zeros_like(x), x), tree, mask
    )
    grads = freeze(grads)
  grad_norm = optax.tree.norm(grads)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  # Non-finite step: keep the old params and optimizer state (never applied, never saved).
  # A conditional rather than an elementwise select of new vs old: the select would read and
  # write the parameters and both Adam moments once more every step.
  def apply(params_and_opt):
    params, opt_state = params_and_opt
    updates, new_opt = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, freeze(updates)), new_opt  # (weight decay held too)

  new_params, new_opt = jax.lax.cond(ok, apply, lambda po: po, (state.params, state.opt_state))
  new_state = state.replace(step=state.step + 1, params=new_params, opt_state=new_opt)
  metrics.update(
      loss=loss,
      grad_norm=grad_norm,
      finite=ok.astype(jnp.float32),
      learning_rate=schedule(state.step),
      param_norm=optax.tree.norm(new_params),
      **batch_shape_metrics(batch),
  )
  if warming:
    metrics["batch_fraction"] = active.astype(jnp.float32) / microbatches
  return new_state, metrics


def _weigh_rows(batch: dict, row_B: Array) -> dict:
  """The batch with rows where `row_B` is 0 left out of every loss and count (and of the
  real-token and example shares `batch_shape_metrics` reports)."""
  out = dict(batch, row_weights=row_B)
  out["masked_weights"] = batch["masked_weights"].astype(jnp.float32) * row_B[:, None]
  w = batch.get("nsp_weights")
  out["nsp_weights"] = row_B if w is None else w.astype(jnp.float32) * row_B[:, None]
  return out


def batch_shape_metrics(batch: dict) -> dict:
  """What share of the batch's slots are real tokens, and examples per row (1 unpacked): the
  loop turns rows/s into real tokens/s and examples/s with them."""
  if "query_ids" in batch:  # pairs: the real tokens of the queries and documents
    masks = [batch["query_mask"], batch["doc_mask"]]
    real = sum(jnp.sum(m.astype(jnp.float32)) for m in masks) / sum(m.size for m in masks)
    out = dict(real_token_fraction=real, examples_per_row=jnp.ones((), jnp.float32))
    if "sources" in batch:  # a mixture of pair datasets: each row's query and documents
      real_B = jnp.sum(masks[0], 1).astype(jnp.float32) + jnp.sum(masks[1], (1, 2))
      out["tokens_by_source"] = real_B @ batch["sources"].astype(jnp.float32)
    return out
  rows = batch["input_ids"].shape[0]
  examples = (
      jnp.sum(batch["nsp_weights"].astype(jnp.float32)) / rows if "nsp_weights" in batch else 1.0
  )
  real_BxL = batch["attention_mask"].astype(jnp.float32)
  if "row_weights" in batch:  # batch-size warmup: the rows trained on
    real_BxL = real_BxL * batch["row_weights"][:, None]
  out = dict(
      real_token_fraction=jnp.mean(real_BxL),
      examples_per_row=jnp.asarray(examples, jnp.float32),
  )
  if "sources" in batch:  # a mixture: the real tokens of each source, [N]
    out["tokens_by_source"] = jnp.sum(real_BxL, 1) @ batch["sources"].astype(jnp.float32)
  return out


def _eval_step(params, batch, *, objective: objective_lib.Objective) -> dict:
  """Summed MLM/NSP loss and accuracy counts on one batch (dropout off).

  Also `mask_correct`/`mask_count` at `batch["at_mask"]` ([B, P], `losses.at_mask_token` with
  the data's [MASK] id): the predicted positions whose input is [MASK] (80% of them). There the
  model cannot copy the token it is given, so this is the accuracy that shows whether it uses
  context (`bertjax.training.loop.evaluate` sets it beside the best constant guess).

  ELECTRA: the generator's MLM and the discriminator's sums (`losses.electra_sums`) on
  replacements drawn with a fixed key, so that every evaluation sees the same draw per model.
  """
  sums, correct_BxP = objective.sums(params, batch, jax.random.PRNGKey(0), True)
  if "at_mask" not in batch:  # no masked positions (contrastive)
    return sums
  at_mask_BxP = batch["at_mask"]
  sums.update(mask_correct=jnp.sum(correct_BxP * at_mask_BxP), mask_count=jnp.sum(at_mask_BxP))
  return sums
