"""Optimisers and learning-rate schedules for BERT pretraining (optax).

`config.train.optimizer`, each after global-norm clipping (`clip_norm`, BERT's 1.0), with weight
decay masked off LayerNorm parameters and biases:

  bert_adamw  google-research/bert's AdamWeightDecayOptimizer: Adam WITHOUT bias correction,
              lr * (m / (sqrt(v) + eps) + weight_decay * param)
  adamw       optax's AdamW: the same with Adam's bias correction
  lamb        layer-wise LAMB (You et al. 2019, Algorithm 2): one trust ratio per layer's variable

`config.train.schedule`:

  bert           create_optimizer's: peak * (1 - step / steps) (polynomial decay of power 1 from
                 step 0), overridden by the warmup peak * step / warmup while step < warmup
  warmup_linear  0 -> peak over the warmup, then linearly from the peak to 0 at the last step

Step 0 is the first update, as the reference's global_step: optax counts the updates applied.
Parameters and optimizer moments are float32 whatever the compute dtype: bf16 moments lose the
small updates late in training.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# Parameter names that get no weight decay: LayerNorm scale/bias, every Dense bias, MLM bias.
NO_DECAY_NAMES = ("bias", "scale", "mlm_bias")
# bertjax.model: the `scan_layers` stack (leading layer axis) and the fused [H, 3, N, D] kernel.
SCANNED_LAYERS = "layers"
FUSED_QKV = "qkv"


def _names(path) -> list[str]:
  return [getattr(k, "key", getattr(k, "name", str(k))) for k in path]


def decay_mask(params: Any) -> Any:
  """True where weight decay applies: kernels and embedding tables, by parameter name.

  By name, not by rank: under `scan_layers` a LayerNorm scale is 2-D [layers, H].
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, _: _names(path)[-1] not in NO_DECAY_NAMES, params
  )


# ---------------------------------------------------------------------------------- schedules


def bert_schedule(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """google-research/bert's create_optimizer: polynomial decay (power 1) from `peak` at step 0
  to 0 at `total_steps`, and peak * step / warmup while step < warmup (when warmup > 0)."""
  total = max(total_steps, 1)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    decay = peak * (1.0 - jnp.minimum(step, total) / total)
    if not warmup_steps:
      return decay
    return jnp.where(step < warmup_steps, peak * step / warmup_steps, decay)

  return schedule


def warmup_linear_decay(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """0 -> peak over `warmup_steps`, then linearly from the peak to 0 at `total_steps`."""
  warmup_steps = max(0, min(warmup_steps, total_steps))
  return optax.join_schedules(
      [
          optax.linear_schedule(0.0, peak, max(warmup_steps, 1)),
          optax.linear_schedule(peak, 0.0, max(total_steps - warmup_steps, 1)),
      ],
      [warmup_steps],
  )


SCHEDULES = {"bert": bert_schedule, "warmup_linear": warmup_linear_decay}


def _pick(table: dict, name: str, field: str):
  if name not in table:
    raise ValueError(f"config.train.{field}={name!r}; valid: {', '.join(map(repr, table))}")
  return table[name]


def make_schedule(train_cfg, phase2_cfg=None) -> optax.Schedule:
  """The run's `train.schedule` over `train_cfg.steps`.

  With a second phase that restarts its schedule (LAMB's recipe), phase 2 gets its own warmup
  and decay from `phase2.learning_rate`; otherwise one schedule spans both phases (BERT's).
  """
  shape = _pick(SCHEDULES, train_cfg.schedule, "schedule")
  total = train_cfg.steps
  boundary = phase2_start(train_cfg, phase2_cfg)
  if boundary >= total or not phase2_cfg.get("restart_schedule", False):
    return shape(train_cfg.learning_rate, train_cfg.warmup_steps, total)
  first = shape(train_cfg.learning_rate, train_cfg.warmup_steps, boundary)
  second = shape(phase2_cfg.learning_rate, phase2_cfg.warmup_steps, total - boundary)
  return optax.join_schedules([first, second], [boundary])


def phase2_start(train_cfg, phase2_cfg) -> int:
  """First step of phase 2 (== steps when there is no second phase)."""
  if phase2_cfg is None or not phase2_cfg.get("fraction", 0.0):
    return train_cfg.steps
  return int(round(train_cfg.steps * (1.0 - phase2_cfg.fraction)))


# --------------------------------------------------------------------------------- optimizers


class UncorrectedAdamState(NamedTuple):
  mu: optax.Updates
  nu: optax.Updates


def scale_by_uncorrected_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """m / (sqrt(v) + eps) from moments WITHOUT bias correction, as AdamWeightDecayOptimizer
  (optax.scale_by_adam always corrects)."""

  def init(params):
    return UncorrectedAdamState(mu=optax.tree.zeros_like(params), nu=optax.tree.zeros_like(params))

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), state.nu, updates)
    out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return out, UncorrectedAdamState(mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def trust_ratio_axes(path, shape: tuple[int, ...]) -> tuple[int, ...] | None:
  """The axes whose every index gets its own LAMB trust ratio: () for one ratio per array,
  None for no layer adaptation (LayerNorm and biases, as TF-Addons' exclude_from_layer_adaptation).

  Under `scan_layers` each slice of the leading layer axis is one layer's variable; each
  q/k/v slice of the fused QKV kernel is one of Google's separate query/key/value kernels.
  """
  names = _names(path)
  if names[-1] in NO_DECAY_NAMES:
    return None
  axes = (0,) if SCANNED_LAYERS in names else ()
  if names[-2:] == [FUSED_QKV, "kernel"]:
    axes += (len(axes) + 1,)  # [(layers,) H, 3, N, D]
    assert shape[axes[-1]] == 3, (names, shape)
  return axes


def scale_by_layerwise_trust_ratio() -> optax.GradientTransformation:
  """update * ||w|| / ||update|| per layer's variable (`trust_ratio_axes`); ratio 1 where
  either norm is 0 or the variable is excluded."""

  def norm(x, keep):
    axes = tuple(i for i in range(x.ndim) if i not in keep)
    return jnp.sqrt(jnp.sum(jnp.square(x), axis=axes, keepdims=True))

  def update(updates, state, params):
    if params is None:
      raise ValueError("LAMB's trust ratio needs the params: tx.update(grads, state, params)")

    def scale(path, u, w):
      keep = trust_ratio_axes(path, w.shape)
      if keep is None:
        return u
      w_norm, u_norm = norm(w, keep), norm(u, keep)
      ok = (w_norm > 0) & (u_norm > 0)
      return u * jnp.where(ok, w_norm / jnp.where(ok, u_norm, 1.0), 1.0)

    return jax.tree_util.tree_map_with_path(scale, updates, params), state

  return optax.GradientTransformation(optax.init_empty_state, update)


def bert_adamw(
    learning_rate, b1: float, b2: float, eps: float, weight_decay: float
) -> optax.GradientTransformation:
  """google-research/bert's AdamWeightDecayOptimizer (no bias correction)."""
  return optax.chain(
      scale_by_uncorrected_adam(b1, b2, eps),
      optax.add_decayed_weights(weight_decay, decay_mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def adamw(
    learning_rate, b1: float, b2: float, eps: float, weight_decay: float
) -> optax.GradientTransformation:
  """optax's AdamW, with Adam's bias correction."""
  return optax.adamw(
      learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask
  )


def lamb(
    learning_rate, b1: float, b2: float, eps: float, weight_decay: float
) -> optax.GradientTransformation:
  """Layer-wise LAMB (You et al. 2019, Algorithm 2, with its bias correction)."""
  return optax.chain(
      optax.scale_by_adam(b1, b2, eps),
      optax.add_decayed_weights(weight_decay, decay_mask),
      scale_by_layerwise_trust_ratio(),
      optax.scale_by_learning_rate(learning_rate),
  )


OPTIMIZERS = {"bert_adamw": bert_adamw, "adamw": adamw, "lamb": lamb}


def make_optimizer(train_cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
  """Global-norm clipping (as BERT's create_optimizer) then `train.optimizer`."""
  opt = _pick(OPTIMIZERS, train_cfg.optimizer, "optimizer")(
      schedule,
      b1=train_cfg.b1,
      b2=train_cfg.b2,
      eps=train_cfg.eps,
      weight_decay=train_cfg.weight_decay,
  )
  if train_cfg.clip_norm and train_cfg.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(train_cfg.clip_norm), opt)
  return opt
