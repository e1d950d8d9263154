"""Optimisers and learning-rate schedules for BERT pretraining (optax).

`config.train.optimizer`, each after global-norm clipping (`clip_norm`, BERT's 1.0), with weight
decay masked off LayerNorm parameters and biases:

  bert_adamw  google-research/bert's AdamWeightDecayOptimizer: Adam WITHOUT bias correction,
              lr * (m / (sqrt(v) + eps) + weight_decay * param)
  adamw       optax's AdamW: the same with Adam's bias correction
  lamb        layer-wise LAMB (You et al. 2019, Algorithm 2): one trust ratio per layer's variable
  stable_adamw  StableAdamW (Wortsman et al. 2023, Algorithm 2; ModernBERT's optimizer): AdamW
              whose step size is clipped per tensor, lr_t / max(1, RMS_t) with
              RMS_t = sqrt(mean(g_t^2 / max(v_t, eps^2))) over the tensor (one tensor per layer
              under `scan_layers`, as PyTorch's per-parameter tensors); the clipped step size
              scales the weight decay too. optax 0.2.8 has no StableAdamW (neither in optax nor
              optax.contrib), and its scale_by_adam hides v_t, which the RMS needs: so
              `scale_by_stable_adam` keeps Adam's moments itself, with optax's moment and
              bias-correction helpers (optax.tree.update_moment, bias_correction). Bias correction
              m / (1 - b1^t) equals the paper's debiased betas b(1 - b^(t-1)) / (1 - b^t) exactly.
              The max(v, eps^2) floor is the reference implementation's (optimi, which ModernBERT
              trains with): an all-zero gradient then clips nothing instead of giving 0/0.

`config.train.schedule`:

  bert           create_optimizer's: peak * (1 - step / steps) (polynomial decay of power 1 from
                 step 0), overridden by the warmup peak * step / warmup while step < warmup
  warmup_linear  0 -> peak over the warmup, then linearly from the peak to 0 at the last step
  wsd            warmup-stable-decay (the trapezoid; ModernBERT, Warner et al. 2024): 0 -> peak
                 over the warmup, the peak, then over the last D = round(decay_fraction * steps)
                 steps the 1-sqrt cooldown of Hagele et al. 2024 ("Scaling Laws and
                 Compute-Optimal Training Beyond Fixed Training Durations"), as ModernBERT's
                 OneMinusSqrtScheduler: peak * (f + (1 - f) * (1 - sqrt((t - (T - D)) / D))),
                 f = final_lr_fraction (0 in Hagele et al.). Where warmup and decay overlap the
                 lower of the two applies.
  one_cycle      Cramming's one-cycle (Geiping & Goldstein 2022, their `get_one_cycle`): linear
                 from 0 to the peak at peak_fraction * steps (0.5 in Cramming), then linear to 0
                 at the last step; no separate warmup

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


def wsd_schedule(
    peak: float,
    warmup_steps: int,
    total_steps: int,
    decay_fraction: float = 0.1,
    final_lr_fraction: float = 0.0,
) -> optax.Schedule:
  """Warmup-stable-decay with the 1-sqrt decay over the last round(decay_fraction * total)
  steps, down to final_lr_fraction * peak (module docstring)."""
  decay_steps = int(round(decay_fraction * total_steps))
  decay_start = total_steps - decay_steps
  f = final_lr_fraction

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = jnp.minimum(step / warmup_steps, 1.0) if warmup_steps else 1.0
    if not decay_steps:
      return peak * warm
    into_decay = jnp.clip((step - decay_start) / decay_steps, 0.0, 1.0)
    return peak * jnp.minimum(warm, f + (1.0 - f) * (1.0 - jnp.sqrt(into_decay)))

  return schedule


def one_cycle_schedule(
    peak: float, warmup_steps: int, total_steps: int, peak_fraction: float = 0.5
) -> optax.Schedule:
  """0 -> peak linearly until peak_fraction * total, then linearly to 0 at total; the
  warmup is the rise, so `warmup_steps` is not used."""
  del warmup_steps
  top = max(peak_fraction * total_steps, 1.0)
  rest = max(total_steps - top, 1.0)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    up, down = step / top, (total_steps - step) / rest
    return peak * jnp.clip(jnp.where(step < top, up, down), 0.0, 1.0)

  return schedule


SCHEDULES = {
    "bert": bert_schedule,
    "warmup_linear": warmup_linear_decay,
    "wsd": wsd_schedule,
    "one_cycle": one_cycle_schedule,
}
# Fields of config.train a schedule reads besides peak, warmup and steps (phase 2 may override
# them under a restarted schedule); their defaults: bertjax/training/fields.py.
SCHEDULE_FIELDS = {
    "wsd": ("decay_fraction", "final_lr_fraction"),
    "one_cycle": ("peak_fraction",),
}


def _pick(table: dict, name: str, field: str):
  if name not in table:
    raise ValueError(f"config.train.{field}={name!r}; valid: {', '.join(map(repr, table))}")
  return table[name]


def _shape(train_cfg, override=None):
  """`train.schedule`'s function with its extra fields bound (from `override` first)."""
  name = train_cfg.schedule
  shape = _pick(SCHEDULES, name, "schedule")
  kw = {}
  for field in SCHEDULE_FIELDS.get(name, ()):
    kw[field] = train_cfg[field]
    if override is not None and override.get(field) is not None:
      kw[field] = override.get(field)
  return lambda peak, warmup, total: shape(peak, warmup, total, **kw)


def make_schedule(train_cfg, phase2_cfg=None) -> optax.Schedule:
  """The run's `train.schedule` over `train_cfg.steps`.

  With a second phase that restarts its schedule (LAMB's recipe, ModernBERT's context
  extension), phase 2 gets its own warmup and decay from `phase2.learning_rate` (and its own
  `phase2.decay_fraction` etc. where set); otherwise one schedule spans both phases (BERT's).
  """
  total = train_cfg.steps
  boundary = phase2_start(train_cfg, phase2_cfg)
  if boundary >= total or not phase2_cfg.restart_schedule:
    return _shape(train_cfg)(train_cfg.learning_rate, train_cfg.warmup_steps, total)
  first = _shape(train_cfg)(train_cfg.learning_rate, train_cfg.warmup_steps, boundary)
  second = _shape(train_cfg, phase2_cfg)(
      phase2_cfg.learning_rate, phase2_cfg.warmup_steps, total - boundary
  )
  return optax.join_schedules([first, second], [boundary])


def phase2_start(train_cfg, phase2_cfg) -> int:
  """First step of phase 2 (== steps when there is no second phase)."""
  if phase2_cfg is None or not phase2_cfg.fraction:
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


class ScaleByStableAdamState(NamedTuple):
  count: jax.Array  # updates applied, int32
  mu: optax.Updates
  nu: optax.Updates


def _per_tensor_axes(path, x) -> tuple[int, ...]:
  """The axes one tensor spans: all, but each slice of the `scan_layers` stack on its own."""
  first = 1 if SCANNED_LAYERS in _names(path) else 0
  return tuple(range(first, x.ndim))


def scale_by_stable_adam(
    b1: float, b2: float, eps: float, weight_decay: float
) -> optax.GradientTransformation:
  """(m^ / (sqrt(v^) + eps) + weight_decay * param) / max(1, RMS) per tensor, RMS =
  sqrt(mean(g^2 / max(v^, eps^2))), m^ and v^ bias-corrected; decay masked by `decay_mask`.
  Times -lr this is StableAdamW's step (module docstring)."""

  def init(params):
    zeros = optax.tree.zeros_like(params)
    return ScaleByStableAdamState(jnp.zeros([], jnp.int32), zeros, optax.tree.zeros_like(params))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("StableAdamW's weight decay needs the params: tx.update(g, state, params)")
    count = optax.safe_increment(state.count)
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    mu_hat = optax.tree.bias_correction(mu, b1, count)
    nu_hat = optax.tree.bias_correction(nu, b2, count)
    decay = decay_mask(params)

    def step(path, g, m, v, w, decays):
      axes = _per_tensor_axes(path, g)
      ratio = jnp.square(g) / jnp.maximum(v, eps**2)
      rms = jnp.sqrt(jnp.mean(ratio, axis=axes, keepdims=True))
      direction = m / (jnp.sqrt(v) + eps) + (weight_decay * w if decays else 0.0)
      return direction / jnp.maximum(1.0, rms)

    out = jax.tree_util.tree_map_with_path(step, updates, mu_hat, nu_hat, params, decay)
    return out, ScaleByStableAdamState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def stable_adamw(
    learning_rate, b1: float, b2: float, eps: float, weight_decay: float
) -> optax.GradientTransformation:
  """StableAdamW (Wortsman et al. 2023, Algorithm 2): AdamW with per-tensor update clipping."""
  return optax.chain(
      scale_by_stable_adam(b1, b2, eps, weight_decay),
      optax.scale_by_learning_rate(learning_rate),
  )


OPTIMIZERS = {"bert_adamw": bert_adamw, "adamw": adamw, "lamb": lamb, "stable_adamw": stable_adamw}


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


# -------------------------------------------------------------------------- batch-size warmup


def active_microbatches(step, microbatches: int, warmup_steps: int, start: int) -> jax.Array:
  """Microbatches of the batch that step `step` trains on (int32; all of them once warm).

  Batch-size warmup (Cramming; ModernBERT) through the accumulation count: the batch keeps its
  shape, so nothing recompiles; over `warmup_steps` the count grows from `start` to
  `microbatches`, each count for an equal share of the steps.
  """
  if not warmup_steps or microbatches == 1:
    return jnp.asarray(microbatches, jnp.int32)
  start = min(max(start, 1), microbatches)
  stage = jnp.floor(jnp.asarray(step, jnp.float32) * (microbatches - start + 1) / warmup_steps)
  return jnp.minimum(start + stage.astype(jnp.int32), microbatches)
