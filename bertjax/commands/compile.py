"""`bertjax compile --config experiments/pretrain.py:base --accelerator v4-32 [--suggest]`.

Ahead-of-time compiles the real train step (every phase) for a slice you may not have, and
prints what a reservation needs to know, so a config that does not fit fails here and not
after a pod slice has been reserved. Targets:
  --accelerator TYPE   a Cloud TPU slice as gcloud names it (v4-32, v5litepod-16, v5p-8,
                       v6e-16); the TPU compiler (libtpu, the `tpu` extra) compiles for it.
                       Or NVIDIA GPU servers: h100-8, h200-8, a100-8 (one server of 8; also
                       -1, -2, -4) and h100-8x4 (4 servers of 8); XLA's GPU compiler (jax's
                       CUDA plugin, the `gpu` extra) compiles for them
  --topology NAME      a raw libtpu topology string (v5e:4x4, v4:2x2x2), same chip defaults
  --devices N          N fake CPU devices on this machine (memory of the CPU compile)
Per phase: HBM per chip (arguments, outputs, temporaries, code) against the chip's, compiled
FLOPs, the compiler's step-time estimate (an estimate, never a measurement) and the
collectives of the step; on GPUs, the attention kernel each layer got (cuDNN or XLA, and why). The mesh fills the slice (config.mesh, one axis -1). Exit 1 when a
phase does not fit, with one line saying what to change. --suggest compiles a few
mesh/remat/microbatch variants and prints those that fit, fastest (by the estimate) first.

Nothing is run and no parameter is allocated: the state is abstract (`jax.eval_shape`).
The work is `bertjax.training.fit` (and `fit_suggest`); this module reads the flags.
"""

from __future__ import annotations

import math
import os

from absl import flags

from bertjax import errors
from bertjax.commands import args as args_lib

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

DEFAULT_CPU_DEVICES = 8  # fake CPU devices when the mesh has a -1 axis and --devices is absent
_FLAGS = (
    ("accelerator", "TYPE"),
    ("topology", "NAME"),
    ("mesh", "AXIS=N,..."),
    ("devices", "N"),
    ("phase", "N"),
    ("suggest", ""),
    ("quick", ""),
    ("device-memory-gb", "GB"),
)


def _define(fv: flags.FlagValues) -> None:
  flags.DEFINE_string(
      "accelerator",
      None,
      "Cloud TPU slice to compile for, as gcloud names it: "
      "v4-32, v5litepod-16, v5p-8, v6e-16 (needs libtpu); or NVIDIA GPU servers: "
      "h100-8, h200-8, a100-8, h100-8x4 (4 servers of 8; needs the `gpu` extra)",
      flag_values=fv,
  )
  flags.DEFINE_string(
      "topology",
      None,
      "raw libtpu topology to compile for, e.g. v5e:4x4 (needs libtpu)",
      flag_values=fv,
  )
  flags.DEFINE_string(
      "mesh",
      None,
      "mesh axes, e.g. data=4,fsdp=2,tensor=1 (-1 fills); default: config.mesh",
      flag_values=fv,
  )
  flags.DEFINE_integer(
      "devices",
      None,
      "fake CPU devices to compile for (default: the mesh's size, or 8)",
      flag_values=fv,
  )
  flags.DEFINE_integer(
      "phase", None, "compile only this phase (1 or 2); default: all", flag_values=fv
  )
  flags.DEFINE_bool(
      "suggest",
      False,
      "compile mesh (fsdp 1 / all chips), remat (none / full) "
      "and microbatch (1 / 4) variants; print those that fit, fastest first",
      flag_values=fv,
  )
  flags.DEFINE_bool(
      "quick",
      None,
      "compile at XLA's lowest execution-time effort: ~4x faster "
      "and it gives a step-time estimate; memory differs by a few % from the "
      "training compile (default: on with --suggest)",
      flag_values=fv,
  )
  flags.DEFINE_float(
      "device-memory-gb",
      None,
      "memory of one target device: fail (exit 1) if "
      "the step needs more (default: the TPU compiler's limit; CPU: no check)",
      flag_values=fv,
  )
  flags.DEFINE_alias("device_memory_gb", "device-memory-gb", flag_values=fv)  # older spelling


# ------------------------------------------------------------------------------- the flags


def _mesh_flag(text: str | None) -> dict[str, int]:
  if not text:
    return {}
  dcn = [p.split("=")[0].strip() for p in text.split(",") if p.strip().startswith("dcn_")]
  if dcn:  # slices are config fields: --mesh is the one spelling of the axes within a slice
    raise errors.ConfigError(
        f"--mesh {text}: {dcn[0]} is not a --mesh axis — set slices with "
        f"--config.mesh.{dcn[0]}=N"
    )
  return args_lib.parse_mesh(text)


def _check_numbers(fv: flags.FlagValues) -> None:
  if fv.devices is not None and fv.devices < 1:
    raise errors.ConfigError(f"--devices {fv.devices}: must be >= 1 (fake CPU devices)")
  if fv.phase is not None and fv.phase not in (1, 2):
    raise errors.ConfigError(
        f"--phase {fv.phase}: write 1 (seq {fv.config.data.seq_len}) or 2 (config.phase2)"
    )
  if fv.phase == 2:
    from bertjax.training import phases as phases_lib

    if len(phases_lib.phases(fv.config)) < 2:
      raise errors.ConfigError("--phase 2: this config has one phase (config.phase2.fraction=0)")
  gb = fv["device-memory-gb"].value
  if gb is not None and not (0 < gb < math.inf):
    raise errors.ConfigError(
        f"--device-memory-gb {gb:g}: must be a number of GB > 0 (e.g. 16 for a v5e chip)"
    )


def _target_slice(fv: flags.FlagValues):
  """The TPU slice (or GPU servers) of --accelerator / --topology, or None."""
  from bertjax.training import gpu, tpu

  if fv.accelerator and fv.topology:
    raise errors.UsageError("--accelerator and --topology both name the target — pass one")
  if not (fv.accelerator or fv.topology):
    if fv.suggest:
      raise errors.UsageError("--suggest needs a TPU target — add --accelerator TYPE (e.g. v4-32)")
    return None
  flag = "--accelerator" if fv.accelerator else "--topology"
  if fv.accelerator and gpu.is_gpu_name(fv.accelerator):
    s = gpu.parse_accelerator(fv.accelerator, what=flag)
  elif fv.accelerator:
    s = tpu.parse_accelerator(fv.accelerator, what=flag)
  else:
    s = tpu.parse_topology(fv.topology, what=flag)
  if fv.devices:
    raise errors.UsageError(
        f"--devices is for fake CPU devices; the size of a TPU target comes from {flag} — "
        "drop --devices"
    )
  return s


def _check_mesh_fits(mesh: dict, n: int, where: str, fix: str) -> None:
  """The mesh (config.mesh with --mesh applied) against `n` devices, in the flags' words."""
  from bertjax.training import fit

  need, fills = fit.mesh_devices(mesh)
  if (n % need == 0) if fills else (n == need):
    return
  needs = f"a multiple of {need}" if fills else f"{need}"
  raise errors.ConfigError(
      f"{where}: the mesh {fit.describe_mesh(mesh)} needs {needs} devices, not {n} — {fix}"
  )


def _cpu_devices(fv: flags.FlagValues, mesh: dict) -> int:
  """How many fake CPU devices to compile for, checked against the mesh."""
  from bertjax.training import fit

  need, fills = fit.mesh_devices(mesh)
  if fv.devices is not None:
    _check_mesh_fits(
        mesh, fv.devices, f"--devices {fv.devices}", "change --devices or --mesh (-1 fills)"
    )
    return fv.devices
  n = DEFAULT_CPU_DEVICES if fills else need
  _check_mesh_fits(mesh, n, f"the default --devices {n}", f"pass --devices N, a multiple of {need}")
  return n


def _target(fv: flags.FlagValues, mesh: dict):
  """The `fit.Target` of the flags, its size checked against the mesh (config.mesh + --mesh)."""
  from bertjax.training import fit, gpu, tpu

  target_slice = _target_slice(fv)
  n = None
  if target_slice is not None:
    flag = "--accelerator" if fv.accelerator else "--topology"
    on_gpu = isinstance(target_slice, gpu.Servers)
    _check_mesh_fits(
        mesh,
        target_slice.chips,
        f"{flag} {target_slice.name} ({target_slice.chips} {'GPUs' if on_gpu else 'chips'})",
        "change --mesh (one axis -1 fills the " + ("servers)" if on_gpu else "slice)"),
    )
    missing = gpu.plugin_missing() if on_gpu else tpu.libtpu_missing()
    if missing:
      kind = "NVIDIA GPUs" if on_gpu else "a TPU"
      raise errors.ConfigError(f"{flag} {target_slice.name}: cannot compile for {kind}: {missing}")
  else:
    n = _cpu_devices(fv, mesh)
    # Before jax initialises its backend; a process that started it already uses its own.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    ).strip()
  return fit.Target(
      slice=target_slice,
      num_devices=n,
      memory_gb=fv["device-memory-gb"].value,
      memory_source="--device-memory-gb",
  )


# ------------------------------------------------------------------------------------ main


def main(argv: list[str]) -> int:
  from bertjax.commands import pretrain

  # The host side is the CPU for every target (libtpu compiles for a slice without one), set
  # before JAX is imported: it reads this once, and would otherwise probe for a local TPU.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  fv = pretrain.parse(
      argv, "bertjax compile", define_extra=_define, doc=__doc__, flag_metavars=_FLAGS
  )
  if fv is None:
    return 0
  # The variables JAX reads when it starts (the CPU device count, the persistent cache) are set
  # for this command and put back afterwards, so that nothing this process starts later (a
  # command called from Python, a subprocess) inherits them.
  saved = {k: os.environ.get(k) for k in ("XLA_FLAGS", "JAX_ENABLE_COMPILATION_CACHE")}
  if fv.accelerator or fv.topology:
    # A program compiled for libtpu's compile-only devices cannot be loaded here: the
    # persistent cache (bertjax.runtime.compile_cache) would store dead entries and warn on
    # reading them.
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  try:
    return _run(fv)
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def _run(fv) -> int:
  _check_numbers(fv)
  mesh_axes = _mesh_flag(fv.mesh)
  target = _target(fv, {**fv.config.mesh.to_dict(), **mesh_axes})  # the last check
  from bertjax.training import fit, fit_suggest

  quick = fv.suggest if fv.quick is None else fv.quick
  phase = None if fv.phase is None else fv.phase - 1
  if fv.suggest:
    return fit_suggest.suggest(fv.config, target, mesh_axes, quick=quick, phase=phase)
  return fit.compile_and_report(fv.config, target, mesh_axes, quick=quick, phase=phase)
