"""What a pretraining run measures as it goes: `Meter` (averages over a log interval,
throughput, MFU, ETA) and `TimeToTarget` (tokens and wall time until the held-out MLM accuracy
first reaches `config.eval.target_mlm_accuracy`). Both are carried in the checkpoint, so a
resumed run reports what the uninterrupted one would."""

from __future__ import annotations

import time

import jax

from bertjax.training import flops, metrics_writer
from bertjax.training.phases import Phase


class Meter:
  """Host-side averages over one log interval, plus throughput, MFU and ETA.

  Every step's metrics count, the first after a (re)compile included; only the timing leaves
  that step out. The running sums travel in the checkpoint (`partial`), so after a resume an
  interval averages the same steps as in an uninterrupted run.
  """

  def __init__(self, config, objective, phase: Phase, partial: dict | None = None):
    self.peak = config.peak_flops_per_device or flops.peak_flops_per_device()
    self.sums = dict(partial["sums"]) if partial else {}
    self.count = int(partial["count"]) if partial else 0
    self.set_phase(objective, phase)

  def set_phase(self, objective, phase: Phase) -> None:
    """`objective` (`objective.Objective`) of the phase's setup: its FLOPs per step."""
    self.phase = phase
    self.flops = objective.flops_per_step(phase.batch_size, phase.seq_len, phase.max_predictions)
    self.t0, self.timed = None, 0

  def add(self, m: dict) -> None:
    for k, v in m.items():
      self.sums[k] = self.sums.get(k, 0.0) + v
    self.count += 1
    if self.t0 is None:  # the first step's time is mostly compilation: start timing after it
      self.t0 = time.perf_counter()
    else:
      self.timed += 1

  def partial(self) -> dict:
    return {"sums": dict(self.sums), "count": self.count}

  def exclude(self, seconds: float) -> None:
    """Leave time spent outside training steps (evals) out of the throughput."""
    if self.t0 is not None:
      self.t0 += seconds

  def summary(self, step: int, total: int) -> dict:
    if not self.count:
      return {}
    out = {k: v / self.count for k, v in self.sums.items()}
    self.sums, self.count = {}, 0
    if self.timed:
      now = time.perf_counter()
      dt = (now - self.t0) / self.timed
      self.t0, self.timed = now, 0
      ph = self.phase
      # Examples (not rows) and real tokens (not padding): packed and unpacked runs compare.
      out.update(
          seq_per_sec=ph.batch_size * out.get("examples_per_row", 1.0) / dt,
          tokens_per_sec=ph.batch_size * ph.seq_len * out.get("real_token_fraction", 1.0) / dt,
          step_time_sec=dt,
          eta_sec=(total - step) * dt,
      )
      out["mfu"] = self.flops / dt / (jax.device_count() * self.peak) if self.peak else None
    return out


class TimeToTarget:
  """Tokens trained and wall time so far (summed over resumes), and the first evaluation whose
  held-out MLM accuracy reaches `config.eval.target_mlm_accuracy`: MLPerf's time to train.

  Tokens are real (not padding) tokens of the steps applied; wall time runs from the start of
  the loop (the first step's compilation and the evaluations included) to the end of the
  evaluation that reached the target. Both travel in the checkpoint (`progress`).
  """

  def __init__(self, config, plan: list[Phase], saved: dict | None, sources=("data",)):
    self.target = config.eval.get("target_mlm_accuracy")
    self.stop = bool(config.eval.stop_at_target) and self.target is not None
    self.plan = plan
    saved = saved or {}
    self.tokens = float(saved.get("tokens", 0.0))
    # Real tokens of each source (a mixture's, bertjax.data.mixture; else the one dataset).
    by = saved.get("tokens_by_source") or {}
    self.by_source = {name: float(by.get(name, 0.0)) for name in sources}
    self.wall0 = float(saved.get("wall_s", 0.0))
    self.reached = saved.get("time_to_target")
    self.t0 = time.perf_counter()

  def start(self) -> None:
    self.t0 = time.perf_counter()

  def wall_s(self) -> float:
    return self.wall0 + time.perf_counter() - self.t0

  def add(self, at: int, m: dict, by_source=None) -> None:
    """Step `at` (1-based) was applied: count its real tokens at its phase's shape;
    `by_source`: a mixture's real tokens of each source in this step (the step's metric)."""
    ph = next((ph for ph in self.plan if ph.start < at <= ph.end), self.plan[-1])
    tokens = ph.batch_size * ph.seq_len * m.get("real_token_fraction", 1.0)
    self.tokens += tokens
    if by_source is None:
      by_source = [tokens] if len(self.by_source) == 1 else [0.0] * len(self.by_source)
    for name, n in zip(self.by_source, by_source):
      self.by_source[name] += float(n)

  def tokens_by_source(self) -> dict[str, int]:
    return {name: int(round(n)) for name, n in self.by_source.items()}

  def state(self) -> dict:
    return {
        "tokens": self.tokens,
        "wall_s": self.wall_s(),
        "time_to_target": self.reached,
        "tokens_by_source": dict(self.by_source),
    }

  def check(self, step: int, ev: dict) -> bool:
    """True the first time an evaluation reaches the target."""
    if self.target is None or self.reached is not None:
      return False
    if ev.get("eval_mlm_accuracy", -1.0) < self.target:
      return False
    self.reached = {
        "step": int(step),
        "wall_s": round(self.wall_s(), 3),
        "tokens": int(self.tokens),
    }
    return True

  def line(self) -> str:
    return metrics_writer.time_to_target_line(self.target, self.reached)
