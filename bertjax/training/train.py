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
from bertjax.model import electra as electra_lib
from bertjax.training import losses, optim, sharding, train_state

Array = jax.Array
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "masked_positions")
# A packed batch's extra model inputs (bertjax.data.packing), passed as keywords when present.
PACKED_INPUTS = ("segment_ids", "position_ids", "cls_positions")
# What the train step reads of a batch; anything else the stream adds stays out of the jit.
STEP_INPUTS = (
    MODEL_INPUTS
    + PACKED_INPUTS
    + ("masked_ids", "masked_weights", "nsp_labels", "nsp_weights")
    + ("sources",)  # a mixture's [B, N] one-hot source of each row (bertjax.data.mixture)
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


def objective(config) -> str:
  """config.objective: "mlm" (BERT's masked LM, the default) or "electra" (replaced-token
  detection, `bertjax.model.electra`)."""
  return config.get("objective", "mlm") or "mlm"


# The parameters of each head a `BertForPreTraining` tree holds beside its encoder.
HEAD_PARAMS = {
    "mlm": (("mlm_transform",), ("mlm_layer_norm",), ("mlm_bias",)),
    "nsp": (("nsp",),),
    "pooler": (("bert", "pooler"),),
}


def trained_heads(config) -> tuple[str, ...]:
  """The heads (`HEAD_PARAMS`) a step of this objective trains: MLM's head, and with a pair
  task (NSP or SOP) its head and the pooler it reads."""
  if objective(config) != "mlm":
    return ()
  return ("mlm",) + (("nsp", "pooler") if config.data.pair_mode != "none" else ())


def head_mask(params, heads) -> Any:
  """A tree of bools like `params`: True for the parameters of `heads`."""
  paths = [p for h in heads for p in HEAD_PARAMS[h]]

  def of_head(path, _):
    keys = tuple(getattr(k, "key", k) for k in path)
    return any(keys[: len(p)] == p for p in paths)

  return jax.tree_util.tree_map_with_path(of_head, params)


def electra_generator_config(config, bert_config: model_lib.BertConfig):
  """The ELECTRA generator's `BertConfig` under `config.objective == "electra"`, else None."""
  if objective(config) != "electra":
    return None
  fraction = config.electra.generator_hidden_fraction
  try:
    return electra_lib.generator_config(bert_config, fraction)
  except ValueError as e:  # no width left, or a generator BertConfig refuses
    raise errors.ConfigError(
        f"config.electra.generator_hidden_fraction={fraction}: the generator of "
        f"hidden_size={bert_config.hidden_size} would be invalid ({str(e).removeprefix('BertConfig: ')})"
        " — choose a fraction that leaves whole heads (ELECTRA: 0.25 or 1/3)"
    ) from e


def make_model(bert_config: model_lib.BertConfig, generator_config=None) -> nn.Module:
  """`BertForPreTraining`, or `ElectraForPreTraining` when a generator config is given."""
  if generator_config is None:
    return model_lib.BertForPreTraining(bert_config)
  return electra_lib.ElectraForPreTraining(bert_config, generator_config)


@dataclasses.dataclass
class Setup:
  """Everything the loop needs, built once per (config, mesh)."""

  config: Any  # the ml_collections ConfigDict
  bert_config: model_lib.BertConfig  # ELECTRA: the discriminator's
  model: nn.Module  # BertForPreTraining, or ElectraForPreTraining
  mesh: jax.sharding.Mesh
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: TrainState  # ShapeDtypeStructs with their shardings: the restore target
  state_shardings: TrainState  # NamedShardings, same structure
  batch_sharding: jax.sharding.NamedSharding  # leading axis over data x fsdp
  init_state: Callable[[int], TrainState]
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
  eval_step: Callable[[Any, dict], dict]  # (params, batch) -> summed metrics
  generator_config: model_lib.BertConfig | None = None  # ELECTRA's generator; None: MLM


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
  generator_config = electra_generator_config(config, bert_config)
  model = make_model(bert_config, generator_config)
  disc_weight = float(config.electra.disc_weight) if generator_config else 0.0
  schedule = optim.make_schedule(config.train, config.get("phase2"))
  tx = optim.make_optimizer(config.train, schedule)

  built = train_state.build(functools.partial(_init_fn, model, tx), tx, mesh, 0)
  repl = sharding.replicated(mesh)
  batch_sharding = sharding.batch_sharding(mesh)

  def init_state(seed: int) -> TrainState:
    return built.init(jnp.asarray(seed, jnp.uint32))

  step_fn = functools.partial(
      _train_step,
      model=model,
      tx=tx,
      schedule=schedule,
      mesh=mesh,
      microbatches=config.train.microbatches,
      batch_warmup=(
          config.train.get("batch_warmup_steps", 0) or 0,
          config.train.get("batch_warmup_start", 1) or 1,
      ),
      pair_mode=config.data.pair_mode,
      inject_nan_at_step=config.train.get("inject_nan_at_step", -1),
      disc_weight=disc_weight,
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
      functools.partial(
          _eval_step, model=model, pair_mode=config.data.pair_mode, disc_weight=disc_weight
      ),
      mesh,
      in_shardings=(built.shardings.params, batch_sharding),
      out_shardings=repl,
  )
  return Setup(
      config=config,
      bert_config=bert_config,
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
      generator_config=generator_config,
  )


def _forward(params, batch, model, dropout_key, deterministic: bool, sample_key=None):
  """The model's outputs and the MLM loss fused with its tied decoder: ([B, P] nll, [B, P]
  correct, the outputs). ELECTRA: the generator's MLM; its draw is keyed by `sample_key` and
  each row's `row_ids` (default: derived from `dropout_key`, the rows numbered 0..B-1)."""
  electra = isinstance(model, electra_lib.ElectraForPreTraining)
  rngs = {"dropout": dropout_key}
  extra = {}
  if electra:
    rngs["sample"] = jax.random.fold_in(dropout_key, 1) if sample_key is None else sample_key
    rows = batch["input_ids"].shape[0]
    extra["row_ids"] = batch.get("row_ids", jnp.arange(rows, dtype=jnp.int32))
  targets = ("masked_ids", "masked_weights") if electra else ()
  out = model.apply(
      {"params": params},
      *(batch[k] for k in MODEL_INPUTS + targets),
      **{k: batch[k] for k in PACKED_INPUTS if k in batch},
      **extra,
      deterministic=deterministic,
      rngs=rngs,
  )
  mlm = out.generator if electra else out
  nll_BxP, correct_BxP = losses.mlm_cross_entropy(
      mlm.mlm_hidden, mlm.mlm_table, mlm.mlm_bias, batch["masked_ids"]
  )
  return nll_BxP, correct_BxP, out


def _forward_sums(
    params, batch, model, pair_mode: str, dropout_key, deterministic: bool, sample_key=None
):
  nll_BxP, correct_BxP, out = _forward(params, batch, model, dropout_key, deterministic, sample_key)
  if isinstance(model, electra_lib.ElectraForPreTraining):
    return losses.electra_sums(nll_BxP, correct_BxP, out.disc_logits, out.is_replaced, batch)
  return losses.pretraining_sums(nll_BxP, correct_BxP, out.nsp_logits, batch, pair_mode)


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
    model,
    tx,
    schedule,
    mesh,
    microbatches: int,
    batch_warmup: tuple[int, int],
    pair_mode: str,
    inject_nan_at_step: int,
    disc_weight: float = 0.0,
    head_warmup: tuple[int, Any] | None = None,
):
  batch = {k: v for k, v in batch.items() if k in STEP_INPUTS}
  electra = isinstance(model, electra_lib.ElectraForPreTraining)
  # Batch-size warmup: only the first `active` microbatches train (the others weigh 0 and
  # are skipped); the batch keeps its shape, so the step compiles once.
  warming = microbatches > 1 and batch_warmup[0] > 0
  if warming:
    active = optim.active_microbatches(state.step, microbatches, *batch_warmup)
    rows = batch["input_ids"].shape[0]
    batch = _weigh_rows(batch, (jnp.arange(rows) % microbatches < active).astype(jnp.float32))
  # Counts of the whole batch first, so each microbatch's loss is scaled exactly.
  mlm_count = jnp.sum(batch["masked_weights"].astype(jnp.float32))
  nsp_count = losses.nsp_count(batch, pair_mode)
  disc_count = jnp.sum(losses.real_tokens(batch)) if electra else None
  step_key = jax.random.fold_in(state.rng, state.step)
  sample_key = None
  if electra:  # one draw per row of the step, whatever microbatch the row trains in
    sample_key = jax.random.fold_in(step_key, 1 << 30)
    batch = dict(batch, row_ids=jnp.arange(batch["input_ids"].shape[0], dtype=jnp.int32))

  def loss_fn(params, mb, key):
    sums = _forward_sums(params, mb, model, pair_mode, key, False, sample_key)
    if electra:
      return losses.electra_loss(sums, mlm_count, disc_count, disc_weight), sums
    return losses.total_loss(sums, mlm_count, nsp_count), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if microbatches == 1:
    (_, sums), grads = grad_fn(state.params, batch, step_key)
  else:

    zeros_g = jax.tree.map(jnp.zeros_like, state.params)
    sum_names = (
        losses.ELECTRA_SUMS
        if electra
        else ("mlm_loss", "mlm_correct", "mlm_count", "nsp_loss", "nsp_correct", "nsp_count")
    )
    zeros_s = {k: jnp.zeros((), jnp.float32) for k in sum_names}

    def body(carry, xs):
      grads_acc, sums_acc = carry
      i, mb = xs

      def run(mb):
        (_, s), g = grad_fn(state.params, mb, jax.random.fold_in(step_key, i))
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

  metrics = losses.electra_finalize(sums, disc_weight) if electra else losses.finalize(sums)
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


def _eval_step(params, batch, *, model, pair_mode: str, disc_weight: float = 0.0) -> dict:
  """Summed MLM/NSP loss and accuracy counts on one batch (dropout off).

  Also `mask_correct`/`mask_count` at `batch["at_mask"]` ([B, P], `losses.at_mask_token` with
  the data's [MASK] id): the predicted positions whose input is [MASK] (80% of them). There the
  model cannot copy the token it is given, so this is the accuracy that shows whether it uses
  context (`bertjax.training.loop.evaluate` sets it beside the best constant guess).

  ELECTRA: the generator's MLM and the discriminator's sums (`losses.electra_sums`) on
  replacements drawn with a fixed key, so that every evaluation sees the same draw per model.
  """
  nll_BxP, correct_BxP, out = _forward(
      params, batch, model, jax.random.PRNGKey(0), deterministic=True
  )
  if isinstance(model, electra_lib.ElectraForPreTraining):
    sums = losses.electra_sums(nll_BxP, correct_BxP, out.disc_logits, out.is_replaced, batch)
  else:
    sums = losses.pretraining_sums(nll_BxP, correct_BxP, out.nsp_logits, batch, pair_mode)
  at_mask_BxP = batch["at_mask"]
  sums.update(mask_correct=jnp.sum(correct_BxP * at_mask_BxP), mask_count=jnp.sum(at_mask_BxP))
  return sums
