"""Optimisers and learning-rate schedules for BERT pretraining (optax).

AdamW as in BERT (β1 0.9, β2 0.999, ε 1e-6, weight decay 0.01 on weights only, never on
LayerNorm parameters or biases); LAMB (You et al. 2019) for batches of 32k-64k; linear warmup
then linear decay to 0; global-norm clipping. Parameters and optimizer moments are float32
whatever the compute dtype: bf16 moments lose the small updates late in training.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

# Parameter names that get no weight decay: LayerNorm scale/bias, every Dense bias, MLM bias.
NO_DECAY_NAMES = ("bias", "scale", "mlm_bias")


def decay_mask(params: Any) -> Any:
  """True where weight decay applies: kernels and embedding tables, by parameter name.

  By name, not by rank: under `scan_layers` a LayerNorm scale is 2-D [layers, H].
  """
  def keep(path, _):
    last = path[-1]
    name = getattr(last, "key", getattr(last, "name", str(last)))
    return name not in NO_DECAY_NAMES
  return jax.tree_util.tree_map_with_path(keep, params)


def warmup_linear_decay(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """0 -> peak over `warmup_steps`, then linearly to 0 at `total_steps` (BERT's schedule)."""
  warmup_steps = max(0, min(warmup_steps, total_steps))
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(warmup_steps, 1)),
       optax.linear_schedule(peak, 0.0, max(total_steps - warmup_steps, 1))],
      [warmup_steps])


def make_schedule(train_cfg, phase2_cfg=None) -> optax.Schedule:
  """The run's schedule over `train_cfg.steps`.

  With a second phase that restarts its schedule (LAMB's recipe), phase 2 gets its own warmup
  and decay from `phase2.learning_rate`; otherwise one schedule spans both phases (BERT's).
  """
  total = train_cfg.steps
  boundary = phase2_start(train_cfg, phase2_cfg)
  if boundary >= total or not phase2_cfg.get("restart_schedule", False):
    return warmup_linear_decay(train_cfg.learning_rate, train_cfg.warmup_steps, total)
  first = warmup_linear_decay(train_cfg.learning_rate, train_cfg.warmup_steps, boundary)
  second = warmup_linear_decay(phase2_cfg.learning_rate, phase2_cfg.warmup_steps,
                               total - boundary)
  return optax.join_schedules([first, second], [boundary])


def phase2_start(train_cfg, phase2_cfg) -> int:
  """First step of phase 2 (== steps when there is no second phase)."""
  if phase2_cfg is None or not phase2_cfg.get("fraction", 0.0):
    return train_cfg.steps
  return int(round(train_cfg.steps * (1.0 - phase2_cfg.fraction)))


def make_optimizer(train_cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
  """Clipping then AdamW or LAMB, with weight decay masked off LayerNorm and biases."""
  name = train_cfg.optimizer
  if name == "adamw":
    opt = optax.adamw(schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                      weight_decay=train_cfg.weight_decay, mask=decay_mask)
  elif name == "lamb":
    opt = optax.lamb(schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                     weight_decay=train_cfg.weight_decay, mask=decay_mask)
  else:
    raise ValueError(f"config.train.optimizer={name!r}; valid: 'adamw', 'lamb'")
  if train_cfg.clip_norm and train_cfg.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(train_cfg.clip_norm), opt)
  return opt
