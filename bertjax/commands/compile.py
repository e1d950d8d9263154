"""`bertjax compile --config experiments/pretrain.py:base --accelerator v4-32 [--suggest]`.

Ahead-of-time compiles the real train step (every phase) for a slice you may not have, and
prints what a reservation needs to know, so a config that does not fit fails here and not
after a pod slice has been reserved. Targets:
  --accelerator TYPE   a Cloud TPU slice as gcloud names it (v4-32, v5litepod-16, v5p-8,
                       v6e-16); the TPU compiler (libtpu, the `tpu` extra) compiles for it
  --topology NAME      a raw libtpu topology string (v5e:4x4, v4:2x2x2), same chip defaults
  --devices N          N fake CPU devices on this machine (memory of the CPU compile)
Per phase: HBM per chip (arguments, outputs, temporaries, code) against the chip's, compiled
FLOPs, the compiler's step-time estimate (an estimate, never a measurement) and the
collectives of the step. The mesh fills the slice (config.mesh, one axis -1). Exit 1 when a
phase does not fit, with one line saying what to change. --suggest compiles a few
mesh/remat/microbatch variants and prints those that fit, fastest (by the estimate) first.

Nothing is run and no parameter is allocated: the state is abstract (`jax.eval_shape`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

from absl import flags

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

MESH_AXES = ("data", "fsdp", "tensor", "dcn_data", "dcn_fsdp", "dcn_tensor")
BERT_VOCAB = 30522  # BERT's English WordPiece vocabulary
_FLAGS = (
    ("accelerator", "TYPE"),
    ("topology", "NAME"),
    ("mesh", "AXIS=N,..."),
    ("devices", "N"),
    ("phase", "N"),
    ("suggest", ""),
    ("quick", ""),
    ("device_memory_gb", "GB"),
)


def _define(fv: flags.FlagValues) -> None:
  flags.DEFINE_string(
      "accelerator",
      None,
      "Cloud TPU slice to compile for, as gcloud names it: "
      "v4-32, v5litepod-16, v5p-8, v6e-16 (needs libtpu)",
      flag_values=fv,
  )
  flags.DEFINE_string(
      "topology",
      None,
      "raw libtpu topology to compile for, e.g. v5e:4x4 " "(needs libtpu)",
      flag_values=fv,
  )
  flags.DEFINE_string(
      "mesh",
      None,
      "mesh axes, e.g. data=4,fsdp=2,tensor=1 (-1 fills); " "default: config.mesh",
      flag_values=fv,
  )
  flags.DEFINE_integer(
      "devices",
      None,
      "fake CPU devices to compile for (default: the " "mesh's size, or 8)",
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
      "device_memory_gb",
      None,
      "memory of one target device: fail (exit 1) if "
      "the step needs more (default: the TPU compiler's limit; CPU: no check)",
      flag_values=fv,
  )


def _parse_mesh(text: str | None) -> dict[str, int]:
  out: dict[str, int] = {}
  for part in (text or "").split(","):
    if not part.strip():
      continue
    name, _, value = part.partition("=")
    name = name.strip()
    if name not in MESH_AXES:
      raise ValueError(f"--mesh {text!r}: unknown axis {name!r}; valid: {', '.join(MESH_AXES)}")
    try:
      out[name] = int(value)
    except ValueError:
      raise ValueError(
          f"--mesh {text!r}: {name}={value.strip()!r} is not an integer; write "
          "e.g. --mesh data=4,fsdp=2 (-1 fills the devices left)"
      ) from None
  return out


def _gib(n: float) -> str:
  return f"{n / 2**30:.2f} GiB"


def main(argv: list[str]) -> int:
  from bertjax.training import tpu
  from bertjax.commands import pretrain

  fv = pretrain.parse(
      argv, "bertjax compile", define_extra=_define, doc=__doc__, flag_metavars=_FLAGS
  )
  if fv is None:
    return 0
  mesh_axes = _parse_mesh(fv.mesh)
  if fv.accelerator and fv.topology:
    raise ValueError("--accelerator and --topology both name the target; pass one")
  if fv.phase is not None and fv.phase not in (1, 2):
    raise ValueError(f"--phase {fv.phase}: write 1 (seq {fv.config.data.seq_len}) or 2")
  target = None
  if fv.accelerator or fv.topology:
    target = (
        tpu.parse_accelerator(fv.accelerator) if fv.accelerator else tpu.parse_topology(fv.topology)
    )
    if fv.devices:
      raise ValueError(
          "--devices is for fake CPU devices; a TPU target's size comes from "
          f"--{'accelerator' if fv.accelerator else 'topology'}"
      )
    missing = tpu.libtpu_missing()
    if missing:
      print(f"bertjax compile: cannot compile for {target.name}: {missing}", file=sys.stderr)
      return 2
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host side; the target is libtpu's
  elif fv.suggest:
    raise ValueError("--suggest needs a TPU target: --accelerator TYPE (e.g. v4-32)")
  else:
    n = fv.devices
    if n is None:
      sizes = [mesh_axes.get(k, fv.config.mesh.get(k, 1)) for k in ("data", "fsdp", "tensor")]
      n = max(1, sizes[0] * sizes[1] * sizes[2]) if -1 not in sizes else 8
    # must happen before jax initialises its backend
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  quick = fv.suggest if fv.quick is None else fv.quick
  phase = None if fv.phase is None else fv.phase - 1
  if phase == 1:
    from bertjax.training import loop

    if len(loop.phases(fv.config)) < 2:
      raise ValueError("--phase 2: this config has one phase (config.phase2.fraction=0)")
  if fv.suggest:
    return suggest(fv.config, target, mesh_axes, quick=quick, phase=phase)
  return compile_and_report(
      fv.config, mesh_axes, target, fv.device_memory_gb, quick=quick, phase=phase
  )


# ----------------------------------------------------------------------------------- vocab


def resolve_vocab(config) -> tuple[int, str]:
  """The vocabulary `bertjax pretrain` would use for this config, and where it came from."""
  c = config
  hint = f"set --config.model.vocab_size (BERT's: {BERT_VOCAB})"
  if c.model.vocab_size:
    return c.model.vocab_size, "config.model.vocab_size"
  if c.data.source == "synthetic":
    return 8000, f"the synthetic stream's default; {hint}"
  if c.data.path:
    from bertjax.data import records

    try:
      meta = records.load_metadata(c.data.path)
      return int(meta["tokenizer"]["vocab_size"]), f"{c.data.path}/metadata.json"
    except (OSError, KeyError, ValueError) as e:
      return BERT_VOCAB, (
          f"assumed (BERT's): cannot read {c.data.path}/metadata.json "
          f"({type(e).__name__}); {hint}"
      )
  from bertjax.training import loop
  from bertjax.data import tokenizer

  path = c.data.tokenizer or str(loop.REPO_DATA / "tokenizer.model")
  try:
    return tokenizer.SentencePieceTokenizer(path).vocab_size, (
        f"the bundled tokenizer, which `pretrain` uses without config.data.path; {hint}"
    )
  except (OSError, ValueError) as e:
    return BERT_VOCAB, f"assumed (BERT's): cannot read {path} ({type(e).__name__}); {hint}"


# --------------------------------------------------------------------------------- compile


@dataclasses.dataclass
class PhaseResult:
  """What one phase's compile said: memory per device, cost, collectives, or out of memory."""

  index: int
  batch: int
  seq_len: int
  microbatches: int
  params: int
  mesh: dict
  peak: float | None = None  # bytes per device: arguments + outputs - donated + temps + code
  memory: dict | None = None
  oom: str | None = None  # the compiler's RESOURCE_EXHAUSTED message
  flops: float | None = None  # XLA's cost analysis, per device (loop bodies counted once)
  model_flops: float | None = None  # bertjax.training.flops, per device
  estimate_s: float | None = None  # the compiler's optimal-time estimate, per step
  bound_s: float | None = None  # model FLOPs at the chip's peak: no step can be faster
  collectives: list = dataclasses.field(default_factory=list)
  windowed: dict = dataclasses.field(default_factory=dict)
  hlo: str = ""


def _resolve(config, mesh_axes: dict[str, int]):
  config = config.copy_and_resolve_references()
  vocab, source = resolve_vocab(config)
  with config.unlocked():
    for k, v in mesh_axes.items():
      config.mesh[k] = v
    config.model.vocab_size = vocab
  return config, vocab, source


def _bytes_per_device(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
  import jax

  return sum(
      math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)
  )


def compile_phases(
    config, mesh, quick: bool = False, phase: int | None = None, keep_hlo: bool = False
) -> list[PhaseResult]:
  """Lower + compile each phase's train step for `mesh` (config already resolved)."""
  import jax

  from bertjax.training import flops as flops_lib, loop, sharding, train, tpu

  from bertjax import model as model_lib

  out = []
  for ph in loop.phases(config):
    if phase is not None and ph.index != phase:
      continue
    c = loop.phase_config(config, ph)
    sharding.check_batch_size(
        ph.batch_size,
        mesh,
        ph.microbatches,
        "config.train.batch_size" if ph.index == 0 else "config.phase2.batch_size",
    )
    s = train.setup(c, mesh)
    b, l, p = ph.batch_size, ph.seq_len, ph.max_predictions
    shapes = dict(
        input_ids=(b, l),
        token_type_ids=(b, l),
        attention_mask=(b, l),
        masked_positions=(b, p),
        masked_ids=(b, p),
        masked_weights=(b, p),
        nsp_labels=(b,),
    )
    batch = {
        k: jax.ShapeDtypeStruct(v, jax.numpy.int32, sharding=s.batch_sharding)
        for k, v in shapes.items()
    }
    r = PhaseResult(
        ph.index,
        b,
        l,
        ph.microbatches,
        model_lib.count_params(s.abstract_state.params),
        dict(mesh.shape),
    )
    r.model_flops = flops_lib.pretraining_flops_per_step(s.bert_config, b, l, p) / mesh.size
    peak = flops_lib.peak_flops_per_device(mesh.devices.flat[0])
    r.bound_s = r.model_flops / peak if peak else None
    lowered = s.train_step.lower(s.abstract_state, batch)
    opts = {"exec_time_optimization_effort": -1.0} if quick else {}
    try:
      compiled = lowered.compile(opts) if opts else lowered.compile()
    except Exception as e:  # the TPU compiler refuses a program over its HBM
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      r.oom = str(e)
      temps, _ = tpu.parse_oom(r.oom)  # the compiler names the temporaries it could not place
      state = _bytes_per_device((s.abstract_state, batch))
      r.peak = temps + state if temps else None
      out.append(r)
      continue
    mem = compiled.memory_analysis()
    if mem is not None:
      args, outs = mem.argument_size_in_bytes, mem.output_size_in_bytes
      temp, alias = mem.temp_size_in_bytes, mem.alias_size_in_bytes
      code = getattr(mem, "generated_code_size_in_bytes", 0)
      r.memory = dict(arguments=args, outputs=outs, donated=alias, temporaries=temp, code=code)
      r.peak = args + outs - alias + temp + code
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    if cost:
      r.flops = cost.get("flops")
      est = cost.get("optimal_seconds")
      r.estimate_s = est if est and est > 0 else None
    if mesh.devices.flat[0].platform == "tpu":
      hlo = compiled.as_text()
      r.collectives, r.windowed = tpu.collectives(hlo), tpu.windowed_einsums(hlo)
      r.hlo = hlo if keep_hlo else ""
    out.append(r)
  return out


def _collective_line(r: PhaseResult) -> str:
  from bertjax.training import tpu

  parts = []
  for op in tpu.COLLECTIVES:
    cs = [c for c in r.collectives if c.op == op]
    if cs:
      runs = sum(c.runs for c in cs)
      parts.append(f"{op} {len(cs)} ({runs}/step, {_gib(sum(c.bytes * c.runs for c in cs))})")
  text = ", ".join(parts) or "none"
  if r.windowed:
    text += "; matmuls with a fused all-gather/reduce-scatter (windowed einsums): " + ", ".join(
        f"{'all-gather' if k == 'ag' else 'reduce-scatter'} {n}" for k, n in r.windowed.items()
    )
  return text


def _fix_hint(config, r: PhaseResult, chips: int) -> str:
  tries = []
  if config.model.remat == "none":
    tries.append("config.model.remat=full")
  if r.mesh.get("fsdp", 1) < chips and chips > 1:
    tries.append(
        f"config.mesh.fsdp={chips}" + ("" if config.mesh.data in (-1, 1) else " config.mesh.data=1")
    )
  field = "train" if r.index == 0 else "phase2"
  shards = r.mesh.get("data", 1) * r.mesh.get("fsdp", 1)
  k = r.microbatches * 4
  if r.batch % (k * shards) == 0:
    tries.append(f"config.{field}.microbatches={k}")
  return ", ".join(tries) or "a larger slice"


def _setup_target(target, mesh_axes, config, device_memory_gb):
  from bertjax.training import sharding, tpu

  devices, limit, limit_src = None, None, ""
  if target is not None:
    try:
      devices = tpu.devices(target)
    except Exception as e:  # unknown topology: say which
      raise ValueError(
          f"--{'topology' if ':' in target.name else 'accelerator'} "
          f"{target.name}: libtpu cannot build topology {target.topology} "
          f"({type(e).__name__}: {str(e).splitlines()[0]})"
      ) from None
    limit, limit_src = tpu.usable_hbm_bytes(devices[0], target.generation.hbm_gib)
  if device_memory_gb:
    limit, limit_src = device_memory_gb * 2**30, "--device_memory_gb"
  m = config.mesh
  mesh = sharding.make_mesh(
      m.data,
      m.fsdp,
      m.tensor,
      dcn_data=m.dcn_data,
      dcn_fsdp=m.dcn_fsdp,
      dcn_tensor=m.dcn_tensor,
      devices=devices,
  )
  return mesh, limit, limit_src


def _header(target, vocab, source, limit, limit_src):
  if target is not None:
    g = target.generation
    print(
        f"target {target.describe()}; HBM per chip {_gib(limit)} usable ({limit_src}; "
        f"{g.hbm_gib:g} GiB nominal)"
    )
  print(f"vocab {vocab:,} ({source})" if "assumed" not in source else f"vocab {vocab:,} {source}")


def compile_and_report(
    config,
    mesh_axes: dict[str, int],
    target=None,
    device_memory_gb: float | None = None,
    quick: bool = False,
    phase: int | None = None,
) -> int:
  """Compile each phase for the target; print memory, cost, collectives. Exit status."""
  config, vocab, source = _resolve(config, mesh_axes)
  mesh, limit, limit_src = _setup_target(target, mesh_axes, config, device_memory_gb)
  _header(target, vocab, source, limit, limit_src)
  on_tpu = target is not None
  rc = 0
  for r in compile_phases(config, mesh, quick=quick, phase=phase):
    where = (
        f"{mesh.devices.size} chips"
        if on_tpu
        else f"{mesh.devices.size} x {mesh.devices.flat[0].device_kind}"
    )
    print(
        f"phase {r.index + 1}: {config.model.preset} ({r.params:,} params), batch {r.batch} "
        f"x seq {r.seq_len}, microbatches {r.microbatches}, remat {config.model.remat}, "
        f"mesh {r.mesh} on {where}" + (" (quick compile)" if quick else "")
    )
    if r.memory is None and r.oom is None:
      print("  memory analysis not available on this backend")
      continue
    if r.memory is not None:
      mm = r.memory
      label = "HBM per chip" if on_tpu else "per device"
      print(
          f"  {label}: arguments {_gib(mm['arguments'])}, outputs {_gib(mm['outputs'])} "
          f"(donated {_gib(mm['donated'])}), temporaries {_gib(mm['temporaries'])}, code "
          f"{_gib(mm['code'])} -> peak ~{_gib(r.peak)}" + (f" of {_gib(limit)}" if limit else "")
      )
    if on_tpu and r.oom is None:
      flops = f"{r.flops / 1e9:,.1f} GFLOP" if r.flops else "n/a"
      est = (
          f"compiler's step-time estimate {r.estimate_s * 1e3:.1f} ms (an estimate, not a "
          "measurement)"
          if r.estimate_s
          else "no step-time estimate from the compiler at this effort (--quick gives one)"
      )
      if r.bound_s:
        est += f"; >= {r.bound_s * 1e3:.2f} ms at the chip's peak FLOPs"
      print(
          f"  compute per chip: {flops} in XLA's cost analysis (it counts a loop body once), "
          f"{r.model_flops / 1e9:,.1f} GFLOP by bertjax.training.flops; {est}"
      )
      print(f"  collectives: {_collective_line(r)}")
    if limit and (r.oom or (r.peak and r.peak > limit)):
      name = target.name if target else "this device"
      need = f"{r.peak / 2**30:.2f} GiB" if r.peak else "more than that"
      of = f"{limit / 2**30:.2f}" + (
          f" usable ({target.generation.hbm_gib:g} GiB HBM)" if target else ""
      )
      chips = mesh.devices.size
      unit = "chip" if target else "device"
      print(
          f"DOES NOT FIT on {name}: phase {r.index + 1} needs {need} per {unit} of {of}; try "
          f"{_fix_hint(config, r, chips)}",
          file=sys.stderr,
      )
      rc = 1
  return rc


# --------------------------------------------------------------------------------- suggest


def _variants(config, chips: int):
  """(fsdp, remat, microbatches, overrides) for fsdp in {1, chips} x remat in {none, full} x
  microbatches in {1, 4}, cheapest in memory last per mesh."""
  fsdps = sorted({1, chips})
  for fsdp in fsdps:
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


def suggest(config, target, mesh_axes, quick: bool = True, phase: int | None = None) -> int:
  """Compile the variants that make sense for the slice; print those that fit, fastest first.

  Per mesh, a variant is skipped once one with less remat and no more microbatches fits:
  remat and accumulation trade speed for memory, so they cannot win once memory is not short."""
  from bertjax.training import loop

  config, vocab, source = _resolve(config, mesh_axes)
  chips = target.chips
  fits, failed, skipped = [], [], 0
  fitted = set()  # (fsdp, remat, microbatches) that fit
  mesh0, limit, limit_src = _setup_target(target, mesh_axes, config, None)
  _header(target, vocab, source, limit, limit_src)
  phases = [ph for ph in loop.phases(config) if phase is None or ph.index == phase]
  steps = {ph.index: ph.end - ph.start for ph in phases}
  print(
      f"trying fsdp in {sorted({1, chips})}, remat in (none, full), microbatches in (1, 4)"
      + (" (quick compiles)" if quick else ""),
      flush=True,
  )
  for fsdp, remat, micro, ov in _variants(config, chips):
    if any(f == fsdp and (r == "none" or r == remat) and m <= micro for f, r, m in fitted):
      skipped += 1
      continue
    c = config.copy_and_resolve_references()
    with c.unlocked():
      for k, v in ov.items():
        sec, key = k.split(".")
        c[sec][key] = v
    args = " ".join(f"--config.{k}={v}" for k, v in ov.items())
    rs = []
    try:
      mesh, _, _ = _setup_target(target, {}, c, None)
      for ph in phases:  # stop at the first phase that does not fit
        rs += compile_phases(c, mesh, quick=quick, phase=ph.index)
        if rs[-1].oom or (rs[-1].peak or 0) > limit:
          break
    except ValueError as e:  # batch does not split over this mesh / microbatches
      failed.append((args, str(e).splitlines()[0]))
      continue
    peaks = [r.peak or 0 for r in rs]
    if any(r.oom or (r.peak or 0) > limit for r in rs):
      need = " / ".join(f"{p / 2**30:.1f}" for p in peaks)
      failed.append((args, need))
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
        f"DOES NOT FIT on {target.name} in any variant tried; use a larger slice or a "
        "smaller config.train.batch_size",
        file=sys.stderr,
    )
    return 1
  print(
      f"fit on {target.name}, fastest first by the compiler's step-time estimate or, when "
      "larger, the model FLOPs at peak (estimates, not measurements); per phase: ms/step "
      "(compiler, peak-FLOPs bound) and HBM per chip:"
  )
  ms = lambda t: f"{t * 1e3:.1f}" if t else "n/a"  # noqa: E731
  for total, ests, bounds, peaks, args in sorted(fits, key=lambda f: f[0]):
    est = " / ".join(f"{ms(e)} (>= {ms(b)})" for e, b in zip(ests, bounds))
    mem = " / ".join(f"{p / 2**30:.1f}" for p in peaks)
    print(f"  est {est} ms, {mem} GiB:  {args}")
  if skipped:
    print(
        f"({skipped} variants with more remat or microbatches than one that fits were not "
        "compiled: they trade speed for memory)"
    )
  return 0
