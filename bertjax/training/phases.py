"""The phases of a pretraining run: one, or BERT's two (seq 128, then 512 for the last 10%).

A second phase may also change the RoPE bases (`phase2.rope_theta`, `phase2.local_rope_theta`;
None keeps config.model's): ModernBERT's context extension (1,024 -> 8,192 tokens, global
theta 10,000 -> 160,000). The loop builds each phase's model from `phase_config`, so the
phase-2 model computes with the new bases; RoPE has no parameters, so the state carries over.

Its own module because the config checks, the loop and the compile-only fit check all read it,
and the checks must not import the loop.
"""

from __future__ import annotations

import dataclasses

from bertjax.training import optim


@dataclasses.dataclass(frozen=True)
class Phase:
  index: int
  start: int  # first step (inclusive)
  end: int  # last step (exclusive)
  seq_len: int
  batch_size: int  # global
  max_predictions: int
  microbatches: int
  rope_theta: float | None = None  # None: config.model's
  local_rope_theta: float | None = None  # None: config.model's


def phases(config) -> list[Phase]:
  """One phase, or two when config.phase2.fraction > 0."""
  c, p2 = config, config.get("phase2")
  boundary = optim.phase2_start(c.train, p2)
  out = [
      Phase(
          0,
          0,
          boundary,
          c.data.seq_len,
          c.train.batch_size,
          c.data.max_predictions_per_seq,
          c.train.microbatches,
      )
  ]
  if boundary < c.train.steps:
    out.append(
        Phase(
            1,
            boundary,
            c.train.steps,
            p2.seq_len,
            p2.batch_size,
            p2.max_predictions_per_seq,
            p2.microbatches,
            p2.get("rope_theta"),
            p2.get("local_rope_theta"),
        )
    )
  return [ph for ph in out if ph.end > ph.start]


def phase_config(config, phase: Phase):
  """The config with this phase's sequence length, batch, accumulation and RoPE bases."""
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.data.seq_len, c.train.batch_size = phase.seq_len, phase.batch_size
    c.data.max_predictions_per_seq, c.train.microbatches = phase.max_predictions, phase.microbatches
    for field in ("rope_theta", "local_rope_theta"):
      if getattr(phase, field) is not None:
        c.model[field] = float(getattr(phase, field))
  return c
