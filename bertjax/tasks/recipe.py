"""The fine-tuning recipe (hyperparameters, each checked when the recipe is made) and its
optimizer, with the defaults that depend on the encoder's width.

    recipe = Recipe(learning_rate=3e-5, epochs=2)    # ConfigError on an out-of-range field
    tx = make_optimizer(recipe, total_steps)         # the schedule's shape, peaking at 1
    opt_state = with_peak_learning_rate(tx.init(params), recipe.learning_rate)

The peak learning rate is a value in the optimizer state (`optax.inject_hyperparams`), not a
constant of the compiled step, so one compiled step serves every run of a sweep.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from bertjax import errors
from bertjax.tasks import defaults
from bertjax.training import optim

OPTIMIZERS = ("bert_adamw", "adamw")
POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Fine-tuning hyperparameters; the defaults are BERT's GLUE recipe."""

  learning_rate: float = 2e-5  # peak; BERT searched {5e-5, 4e-5, 3e-5, 2e-5}
  epochs: int = 3
  batch_size: int = 32  # global, split over all devices
  eval_batch_size: int = 64  # global; only memory depends on it
  warmup_fraction: float = 0.1  # of all steps, then linear decay to 0
  weight_decay: float = 0.01  # AdamW, masked off biases and LayerNorm
  optimizer: str = "bert_adamw"  # bert_adamw | adamw (`make_optimizer`)
  dropout: float = 0.1  # hidden and attention dropout, replacing the checkpoint's
  clip_norm: float = 1.0  # global-norm clipping, as BERT's optimizer; 0: none
  seed: int = 0  # head init, dropout and data order
  max_steps: int = 0  # > 0 caps the steps per epoch (smoke tests)
  length_bucket: int = (
      defaults.LENGTH_BUCKET
  )  # batches padded to a multiple of this; 0: to the arrays' length
  max_lengths: int = (
      defaults.MAX_LENGTHS
  )  # at most this many batch lengths (compiled shapes); 0: no cap
  mesh: tuple[int, int, int] = (-1, 1, 1)  # (data, fsdp, tensor), as pretraining's config.mesh
  pooling: str = "cls"  # GLUE head: cls (BERT's pooled [CLS]) | mean (of the last layer)
  # Layer-wise learning-rate decay (ELECTRA, Clark et al. 2020, appendix; 0.8 for Small and
  # Base): a layer d below the task head learns at decay^d of the peak (`layerwise_scales`).
  layerwise_lr_decay: float = 1.0  # 1: every parameter at the peak (BERT)

  def __post_init__(self):
    for name, kind, ok, must in _CHECKS:
      check_field(f"Recipe.{name}", getattr(self, name), kind, ok, must)
    mesh = self.mesh
    if (
        not isinstance(mesh, (tuple, list))
        or len(mesh) != 3
        or not all(_is_int(a) and (a == -1 or a >= 1) for a in mesh)
        or list(mesh).count(-1) > 1
    ):
      raise errors.ConfigError(
          f"Recipe.mesh={mesh!r} must be three integers (data, fsdp, tensor), each >= 1 or "
          "-1 (the rest of the devices) for at most one of them, e.g. (-1, 1, 1)"
      )
    for name, valid in (("optimizer", OPTIMIZERS), ("pooling", POOLINGS)):
      if getattr(self, name) not in valid:
        raise errors.ConfigError(
            f"Recipe.{name}={getattr(self, name)!r}; valid: {', '.join(map(repr, valid))}"
        )


# (field, int or float, the test, what the field must be)
_CHECKS: tuple[tuple[str, type, Callable[[Any], bool], str], ...] = (
    ("learning_rate", float, lambda v: v > 0, "> 0"),
    ("epochs", int, lambda v: v >= 1, ">= 1"),
    ("batch_size", int, lambda v: v >= 1, ">= 1"),
    ("eval_batch_size", int, lambda v: v >= 1, ">= 1"),
    ("warmup_fraction", float, lambda v: 0 <= v < 1, "in [0, 1)"),
    ("weight_decay", float, lambda v: v >= 0, ">= 0"),
    ("dropout", float, lambda v: 0 <= v < 1, "in [0, 1)"),
    ("clip_norm", float, lambda v: v >= 0, ">= 0 (0: no clipping)"),
    ("seed", int, lambda v: v >= 0, ">= 0"),
    ("max_steps", int, lambda v: v >= 0, ">= 0 (0: no cap)"),
    ("length_bucket", int, lambda v: v >= 0, ">= 0 (0: no buckets)"),
    ("max_lengths", int, lambda v: v >= 0, ">= 0 (0: no cap)"),
    ("layerwise_lr_decay", float, lambda v: 0 < v <= 1, "in (0, 1] (1: off; ELECTRA: 0.8)"),
)


def _is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_field(name: str, value, kind: type, ok: Callable[[Any], bool], must: str) -> None:
  """ConfigError `NAME=VALUE must be ...` unless `value` is an integer (`kind` int) or a
  finite number (`kind` float) that passes `ok`."""
  if kind is int:
    typed, what = _is_int(value), "an integer"
  else:
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    typed, what = real and math.isfinite(value), "a finite number"
  if not typed or not ok(value):
    raise errors.ConfigError(f"{name}={value!r} must be {what} {must}")


def steps_per_epoch(n: int, recipe: Recipe) -> int:
  steps = -(-n // recipe.batch_size)  # the last batch is padded, weight 0
  return min(steps, recipe.max_steps) if recipe.max_steps else steps


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
  """Global-norm clipping, then `recipe.optimizer` with its schedule's shape peaking at 1, then
  the peak learning rate, a value in the optimizer state (1 until `with_peak_learning_rate`):

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
  else:  # "adamw": Recipe checked it is one of OPTIMIZERS
    shape, opt = optim.warmup_linear_decay(1.0, warmup, total_steps), optim.adamw
  clip = [optax.clip_by_global_norm(recipe.clip_norm)] if recipe.clip_norm > 0 else []
  decay = recipe.layerwise_lr_decay
  layerwise = [layerwise_lr_decay(decay)] if decay != 1.0 else []

  def chain(learning_rate):
    return optax.chain(
        *clip,
        opt(shape, b1=0.9, b2=0.999, eps=1e-6, weight_decay=recipe.weight_decay),
        *layerwise,
        optax.scale(learning_rate),
    )

  return optax.inject_hyperparams(chain, hyperparam_dtype=jnp.float32)(learning_rate=1.0)


def _key(entry) -> str:
  return str(getattr(entry, "key", getattr(entry, "name", entry)))


def layerwise_scales(params, decay: float) -> Any:
  """A tree like `params` of each parameter's learning-rate factor under ELECTRA's layer-wise
  decay (google-research/electra, model/optimization.py `_get_layer_lrs`): with n encoder
  layers, the embeddings (and `embeddings_project`) are at depth 0, layer i at depth i + 1 and
  everything else (the task head, the pooler) at depth n + 2; the factor is
  decay^(n + 2 - depth). A pre-LN encoder's final norm takes its last layer's. Scanned layers
  ("layers", stacked on axis 0) get one factor per layer."""
  flat = jax.tree_util.tree_leaves_with_path(params)
  names = [[_key(e) for e in path] for path, _ in flat]
  n = 0
  for ks in names:
    for k in ks:
      if k.startswith("layer_") and k[len("layer_") :].isdigit():
        n = max(n, int(k[len("layer_") :]) + 1)
  for (path, leaf), ks in zip(flat, names):
    if "layers" in ks:
      n = max(n, int(jnp.shape(leaf)[0]))

  def scale(path, leaf):
    ks = [_key(e) for e in path]
    if "embeddings" in ks or "embeddings_project" in ks:
      return jnp.asarray(decay ** (n + 2), jnp.float32)
    for k in ks:
      if k.startswith("layer_") and k[len("layer_") :].isdigit():
        return jnp.asarray(decay ** (n + 1 - int(k[len("layer_") :])), jnp.float32)
    if "layers" in ks:  # [n, ...]: layer i's slice at decay^(n + 1 - i)
      per_layer = decay ** (n + 1 - jnp.arange(n, dtype=jnp.float32))
      return per_layer.reshape((n,) + (1,) * (jnp.ndim(leaf) - 1))
    if "final_layer_norm" in ks:
      return jnp.asarray(decay**2, jnp.float32)
    return jnp.asarray(1.0, jnp.float32)

  return jax.tree_util.tree_map_with_path(scale, params)


def layerwise_lr_decay(decay: float) -> optax.GradientTransformation:
  """Scale each update by its parameter's `layerwise_scales` factor (after the optimizer, so
  the weight decay scales too, as ELECTRA's per-layer learning rates do)."""

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    scales = layerwise_scales(updates, decay)
    return jax.tree.map(lambda u, s: (u * s).astype(u.dtype), updates, scales), state

  return optax.GradientTransformation(init, update)


def with_peak_learning_rate(opt_state, learning_rate) -> Any:
  """`make_optimizer`'s state with the peak learning rate set (traceable)."""
  peak = jnp.asarray(learning_rate, jnp.float32)
  return opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": peak})


def peak_learning_rate(opt_state) -> jax.Array:
  """The peak learning rate in `make_optimizer`'s state."""
  return opt_state.hyperparams["learning_rate"]
