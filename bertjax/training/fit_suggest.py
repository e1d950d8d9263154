"""Which mesh/remat/microbatch variants of a config fit a TPU slice, fastest first.

`bertjax compile --suggest` is the command line. Each variant is compiled ahead of time for the
slice (`bertjax.training.fit`); those that fit are ranked by the compiler's step-time estimate
or, when larger, the model FLOPs at the chip's peak (both estimates, never measurements).
"""

from __future__ import annotations

import math
import sys

from bertjax import errors
from bertjax.training import fit, phases as phases_lib


def variants(chips: int):
  """(fsdp, remat, microbatches, overrides) for fsdp in {1, chips} x remat in {none, full} x
  microbatches in {1, 4}, cheapest in memory last per mesh."""
  for fsdp in sorted({1, chips}):
    for remat, micro in (("none", 1), ("full", 1), ("none", 4), ("full", 4)):
      ov = {
          "mesh.data": -1,
          "mesh.fsdp": fsdp,
          "mesh.tensor": 1,
          "model.remat": remat,
          "train.microbatches": micro,
          "phase2.microbatches": micro,
      }
      yield fsdp, remat, micro, ov


def _with(config, overrides: dict):
  c = config.copy_and_resolve_references()
  with c.unlocked():
    for k, v in overrides.items():
      sec, key = k.split(".")
      c[sec][key] = v
  return c


def _compile_variant(c, target: fit.Target, phases, quick: bool, limit) -> list[fit.PhaseResult]:
  """The phases' results for one variant, stopping at the first phase that does not fit."""
  mesh, _, _ = fit.setup_target(c, target)
  rs = []
  for ph in phases:
    rs += fit.compile_phases(c, mesh, quick=quick, phase=ph.index)
    if fit.does_not_fit(rs[-1], limit):
      break
  return rs


def suggest(
    config,
    target: fit.Target,
    mesh_axes: dict[str, int] | None = None,
    quick: bool = True,
    phase: int | None = None,
) -> int:
  """Compile the variants that make sense for the slice; print those that fit, fastest first.

  Per mesh, a variant is skipped once one with less remat and no more microbatches fits:
  remat and accumulation trade speed for memory, so they cannot win once memory is not short.
  Returns 0, or 1 when no variant fits.
  """
  if target.slice is None:
    raise errors.ConfigError("suggest needs a TPU slice as its target (Target.slice)")
  config, vocab, source = fit.resolve(config, mesh_axes)
  chips = target.slice.chips
  fits, skipped = [], 0
  fitted = set()  # (fsdp, remat, microbatches) that fit
  _, limit, limit_src = fit.setup_target(config, target)
  fit.print_header(target, vocab, source, limit, limit_src)
  phases = [ph for ph in phases_lib.phases(config) if phase is None or ph.index == phase]
  steps = {ph.index: ph.end - ph.start for ph in phases}
  print(
      f"trying fsdp in {sorted({1, chips})}, remat in (none, full), microbatches in (1, 4)"
      + (" (quick compiles)" if quick else ""),
      flush=True,
  )
  for fsdp, remat, micro, ov in variants(chips):
    if any(f == fsdp and (r == "none" or r == remat) and m <= micro for f, r, m in fitted):
      skipped += 1
      continue
    # Printed as `bertjax pretrain` overrides: the line to paste into the run's command.
    args = " ".join(f"--config.{k}={v}" for k, v in ov.items())
    try:
      rs = _compile_variant(_with(config, ov), target, phases, quick, limit)
    except errors.ConfigError:  # the batch does not split over this mesh / microbatches
      continue
    peaks = [r.peak or 0 for r in rs]
    if any(fit.does_not_fit(r, limit) for r in rs):
      need = " / ".join(f"{p / 2**30:.1f}" for p in peaks)
      print(f"  does not fit ({need} GiB per chip, phase 1 / 2): {args}", flush=True)
      continue
    fitted.add((fsdp, remat, micro))
    # The compiler's estimate can undercount loops (it came out below the peak-FLOPs bound
    # for FSDP and microbatched steps): rank by the larger of the two.
    ests = [max(r.estimate_s or 0, r.bound_s or 0) or None for r in rs]
    total = sum(e * steps[r.index] for e, r in zip(ests, rs)) if all(ests) else math.inf
    fits.append((total, [r.estimate_s for r in rs], [r.bound_s for r in rs], peaks, args))
    print(f"  fits ({' / '.join(f'{p / 2**30:.1f}' for p in peaks)} GiB): {args}", flush=True)
  if not fits:
    print(
        f"DOES NOT FIT on {target.slice.name} in any variant tried; use a larger slice or a "
        "smaller config.train.batch_size",
        file=sys.stderr,
    )
    return 1
  _print_fits(target.slice.name, fits, skipped)
  return 0


def _print_fits(name: str, fits: list, skipped: int) -> None:
  print(
      f"fit on {name}, fastest first by the compiler's step-time estimate or, when "
      "larger, the model FLOPs at peak (estimates, not measurements); per phase: ms/step "
      "(compiler, peak-FLOPs bound) and HBM per chip:"
  )
  ms = lambda t: f"{t * 1e3:.1f}" if t else "n/a"  # noqa: E731
  for _, ests, bounds, peaks, args in sorted(fits, key=lambda f: f[0]):
    est = " / ".join(f"{ms(e)} (>= {ms(b)})" for e, b in zip(ests, bounds))
    mem = " / ".join(f"{p / 2**30:.1f}" for p in peaks)
    print(f"  est {est} ms, {mem} GiB:  {args}")
  if skipped:
    print(
        f"({skipped} variants with more remat or microbatches than one that fits were not "
        "compiled: they trade speed for memory)"
    )
