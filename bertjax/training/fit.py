"""Will a pretraining config fit? Compile its train step ahead of time and read the compiler.

`bertjax compile` is the command line of this module. Each phase's real train step is lowered
for abstract state (`jax.eval_shape`: nothing is run, no parameter is allocated) and compiled
for a target: a Cloud TPU slice this machine does not have (libtpu's compile-only devices, see
`bertjax.training.tpu`) or local devices. What comes back, per phase: memory per device
(arguments, outputs, temporaries, code) against the device's, compiled FLOPs, the compiler's
step-time estimate (an estimate, never a measurement) and the step's collectives.
`compile_and_report` prints that and returns 1 when a phase does not fit;
`bertjax.training.fit_suggest` searches mesh/remat/microbatch variants.

Errors name config fields (`config.mesh.fsdp`) and arguments (`Target.memory_gb`); the command
names its flags.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import jax

from bertjax import errors
from bertjax import model as model_lib
from bertjax.data import bundled, packing, pretraining
from bertjax.training import config_checks, flops as flops_lib, gpu, phases as phases_lib, sharding
from bertjax.training import tpu, train

BERT_VOCAB = 30522  # BERT's English WordPiece vocabulary
ICI_AXES = ("data", "fsdp", "tensor")  # within a slice; one may be -1 (the devices left)
DCN_AXES = ("dcn_data", "dcn_fsdp", "dcn_tensor")  # across slices


@dataclasses.dataclass(frozen=True)
class Target:
  """What to compile for: a TPU slice (libtpu's compile-only devices), GPU servers (the CUDA
  plugin's compile-only devices) or local devices."""

  slice: tpu.Slice | gpu.Servers | None = None  # None: this process's own devices
  num_devices: int | None = None  # local devices to use (the first N); None: all of them
  memory_gb: float | None = None  # one device's memory; None: the TPU compiler's (CPU: none)
  memory_source: str = "memory_gb"  # how the report names where memory_gb came from


# ------------------------------------------------------------------------------------ mesh


def mesh_devices(mesh) -> tuple[int, bool]:
  """(k, fills) for a `config.mesh`: it needs exactly k devices, or (fills) a multiple of k.

  `ConfigError` naming the field when an axis is 0, below -1, or -1 twice; the DCN axes are
  >= 1 (the slice count is never inferred).
  """
  for axis in ICI_AXES:
    size = mesh.get(axis, 1)
    if size == 0 or size < -1:
      raise errors.ConfigError(
          f"config.mesh.{axis}={size}: each mesh axis is >= 1, or -1 for the devices left"
      )
  for axis in DCN_AXES:
    if mesh.get(axis, 1) < 1:
      raise errors.ConfigError(
          f"config.mesh.{axis}={mesh.get(axis)}: slices along an axis are >= 1 (1: one slice)"
      )
  ici = [mesh.get(a, 1) for a in ICI_AXES]
  if ici.count(-1) > 1:
    raise errors.ConfigError(
        "config.mesh: " + ", ".join(f"{a}={s}" for a, s in zip(ICI_AXES, ici)) + " — at most "
        "one axis may be -1"
    )
  known = math.prod(s for s in ici if s != -1) * math.prod(mesh.get(a, 1) for a in DCN_AXES)
  return known, -1 in ici


def describe_mesh(mesh) -> str:
  """`data=4,fsdp=2,tensor=1` (+ the DCN axes that are not 1)."""
  parts = [f"{a}={mesh.get(a, 1)}" for a in ICI_AXES]
  parts += [f"{a}={mesh.get(a, 1)}" for a in DCN_AXES if mesh.get(a, 1) != 1]
  return ",".join(parts)


# ----------------------------------------------------------------------------------- vocab


def resolve_vocab(config) -> tuple[int, str]:
  """The vocabulary `bertjax pretrain` would use for this config, and where it came from."""
  c = config
  hint = f"set config.model.vocab_size (BERT's: {BERT_VOCAB})"
  if c.model.vocab_size:
    return c.model.vocab_size, "config.model.vocab_size"
  if c.data.source == "synthetic":
    return 8000, f"the synthetic stream's default; {hint}"
  data_path = config_checks.data_path(c)  # data.path, or a mixture's first source
  if data_path:
    from bertjax.data import records

    try:
      meta = records.load_metadata(data_path)
      return int(meta["tokenizer"]["vocab_size"]), f"{data_path}/metadata.json"
    except (OSError, KeyError, ValueError) as e:
      return BERT_VOCAB, (
          f"assumed (BERT's): cannot read {data_path}/metadata.json "
          f"({type(e).__name__}); {hint}"
      )
  from bertjax.data import tokenizer

  path = c.data.tokenizer or str(bundled.TOKENIZER_PATH)
  try:
    return tokenizer.SentencePieceTokenizer(path).vocab_size, (
        f"the bundled tokenizer, which `pretrain` uses without config.data.path; {hint}"
    )
  except (OSError, ValueError) as e:
    return BERT_VOCAB, f"assumed (BERT's): cannot read {path} ({type(e).__name__}); {hint}"


def resolve(config, mesh_axes: dict[str, int] | None = None):
  """(config with `mesh_axes` applied to config.mesh and the vocabulary set, vocab, source)."""
  config = config.copy_and_resolve_references()
  vocab, source = resolve_vocab(config)
  with config.unlocked():
    for k, v in (mesh_axes or {}).items():
      config.mesh[k] = v
    config.model.vocab_size = vocab
  return config, vocab, source


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
  kernels: dict = dataclasses.field(default_factory=dict)  # Pallas kernel -> calls per step
  cudnn: dict = dataclasses.field(default_factory=dict)  # cuDNN attention call -> per step
  attention: list = dataclasses.field(default_factory=list)  # per layer: (kind, kernel, why)
  hlo: str = ""


def setup_target(config, target: Target = Target()):
  """(mesh over the target's devices from config.mesh, memory limit per device or None, where
  the limit came from). The config's mesh must fit the devices (`mesh_devices`)."""
  devices, limit, limit_src = None, None, ""
  if isinstance(target.slice, gpu.Servers):
    s = target.slice
    try:
      devices = gpu.devices(s)
    except Exception as e:  # noqa: BLE001 -- the plugin refuses a description it cannot use
      raise errors.ConfigError(
          f"{s.name}: jax's CUDA plugin cannot build {s.chips} compile-only "
          f"{s.model.kind} devices ({type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}) — check the `gpu` extra's versions "
          "(pip install -e '.[gpu]')"
      ) from None
    limit, limit_src = gpu.usable_bytes(s.model)
  elif target.slice is not None:
    s = target.slice
    try:
      devices = tpu.devices(s)
    except Exception as e:  # noqa: BLE001 -- libtpu refuses a topology it cannot build
      raise errors.ConfigError(
          f"{s.name}: libtpu cannot build topology {s.topology} "
          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}) — choose another "
          f"slice, e.g. {tpu.EXAMPLES}"
      ) from None
    limit, limit_src = tpu.usable_hbm_bytes(devices[0], s.generation.hbm_gib)
  elif target.num_devices is not None:
    devices = jax.devices()
    if len(devices) < target.num_devices:
      raise errors.ConfigError(
          f"Target.num_devices={target.num_devices}: this process has {len(devices)} devices "
          "(JAX started before the fake CPU devices could be set)"
      )
    devices = devices[: target.num_devices]
  if target.memory_gb:
    limit, limit_src = target.memory_gb * 2**30, target.memory_source
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


def _bytes_per_device(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
  return sum(
      math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)
  )


def _abstract_batch(ph, batch_sharding, data=None, objective=None) -> dict:
  """The step's batch as sharded ShapeDtypeStructs. Packed (`data.packing`): the extra
  [B, L] segment/position ids, [B, E] cls positions and NSP labels/weights, and [B, R]
  masked arrays with R = packing.prediction_budget (what the packed stream yields). The
  contrastive objective: its queries and documents (`abstract_batch`)."""
  b, l, p = ph.batch_size, ph.seq_len, ph.max_predictions
  if objective is not None and objective.name == "contrastive":
    shapes = objective.abstract_batch(b, l)
    return {
        k: jax.ShapeDtypeStruct(v, jax.numpy.int32, sharding=batch_sharding)
        for k, v in shapes.items()
    }
  packed = bool(data is not None and data.packing)
  e = data.max_examples_per_row if packed else 1
  # Measured on the corpus (0): the largest E that may be measured, so a fit holds for any corpus.
  e = e or pretraining.auto_examples_cap(l)
  if packed:
    p = packing.prediction_budget(l, p, data.mask_prob, e)
  shapes = dict(
      input_ids=(b, l),
      token_type_ids=(b, l),
      attention_mask=(b, l),
      masked_positions=(b, p),
      masked_ids=(b, p),
      masked_weights=(b, p),
      nsp_labels=(b, e) if packed else (b,),
  )
  if packed:
    shapes.update(segment_ids=(b, l), position_ids=(b, l), cls_positions=(b, e), nsp_weights=(b, e))
  return {
      k: jax.ShapeDtypeStruct(v, jax.numpy.int32, sharding=batch_sharding)
      for k, v in shapes.items()
  }


def _read_compiled(r: PhaseResult, compiled, platform: str, keep_hlo: bool) -> None:
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
  if platform in ("tpu", "gpu"):
    hlo = compiled.as_text()
    r.collectives, r.windowed = tpu.collectives(hlo), tpu.windowed_einsums(hlo)
    r.kernels = tpu.pallas_kernels(hlo)
    r.cudnn = gpu.cudnn_attention_calls(hlo) if platform == "gpu" else {}
    r.hlo = hlo if keep_hlo else ""


def compile_phases(
    config, mesh, quick: bool = False, phase: int | None = None, keep_hlo: bool = False
) -> list[PhaseResult]:
  """Lower + compile each phase's train step for `mesh` (config already `resolve`d).

  `phase` (0-based) compiles that phase alone; `quick` compiles at XLA's lowest
  execution-time effort (about 4x faster, and it gives a step-time estimate)."""
  out = []
  for ph in phases_lib.phases(config):
    if phase is not None and ph.index != phase:
      continue
    field = "config.train.batch_size" if ph.index == 0 else "config.phase2.batch_size"
    sharding.check_batch_size(ph.batch_size, mesh, ph.microbatches, field)  # ConfigError
    s = train.setup(phases_lib.phase_config(config, ph), mesh)
    batch = _abstract_batch(ph, s.batch_sharding, config.data, s.objective)
    r = PhaseResult(
        ph.index,
        ph.batch_size,
        ph.seq_len,
        ph.microbatches,
        model_lib.count_params(s.abstract_state.params),
        dict(mesh.shape),
    )
    r.model_flops = (
        s.objective.flops_per_step(ph.batch_size, ph.seq_len, ph.max_predictions) / mesh.size
    )
    peak = flops_lib.peak_flops_per_device(mesh.devices.flat[0])
    r.bound_s = r.model_flops / peak if peak else None
    if mesh.devices.flat[0].platform == "gpu":
      r.attention = gpu.attention_plan(s.bert_config, ph.seq_len, bool(config.data.packing))
    lowered = s.train_step.lower(s.abstract_state, batch)
    opts = {"exec_time_optimization_effort": -1.0} if quick else {}
    try:
      compiled = lowered.compile(opts) if opts else lowered.compile()
    except Exception as e:  # noqa: BLE001 -- the TPU compiler refuses a program over its HBM
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      r.oom = str(e)
      temps, _ = tpu.parse_oom(r.oom)  # the compiler names the temporaries it could not place
      state = _bytes_per_device((s.abstract_state, batch))
      r.peak = temps + state if temps else None
      out.append(r)
      continue
    _read_compiled(r, compiled, mesh.devices.flat[0].platform, keep_hlo)
    out.append(r)
  return out


def does_not_fit(r: PhaseResult, limit: float | None) -> bool:
  return bool(limit) and bool(r.oom or (r.peak and r.peak > limit))


def fix_hint(config, r: PhaseResult, chips: int) -> str:
  """The config changes that lower a phase's memory, cheapest in speed first."""
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
  if config.objective == "contrastive":  # microbatches would split the negatives: chunks do not
    chunk = config.contrastive.chunk_size or r.batch
    if chunk // 4 and r.batch % (chunk // 4) == 0:  # a chunk must divide the queries
      tries.append(f"config.contrastive.chunk_size={chunk // 4}")
  elif r.batch % (k * shards) == 0:
    tries.append(f"config.{field}.microbatches={k}")
  return ", ".join(tries) or "a larger slice"


# ---------------------------------------------------------------------------------- report


def gib(n: float) -> str:
  return f"{n / 2**30:.2f} GiB"


def _collective_line(r: PhaseResult) -> str:
  parts = []
  for op in tpu.COLLECTIVES:
    cs = [c for c in r.collectives if c.op == op]
    if cs:
      runs = sum(c.runs for c in cs)
      parts.append(f"{op} {len(cs)} ({runs}/step, {gib(sum(c.bytes * c.runs for c in cs))})")
  text = ", ".join(parts) or "none"
  if r.windowed:
    text += "; matmuls with a fused all-gather/reduce-scatter (windowed einsums): " + ", ".join(
        f"{'all-gather' if k == 'ag' else 'reduce-scatter'} {n}" for k, n in r.windowed.items()
    )
  return text


def print_header(target: Target, vocab: int, source: str, limit, limit_src: str) -> None:
  s = target.slice
  if isinstance(s, gpu.Servers):
    print(f"target {s.describe()}; memory per GPU {gib(limit)} usable ({limit_src})")
  elif s is not None:
    print(
        f"target {s.describe()}; HBM per chip {gib(limit)} usable ({limit_src}; "
        f"{s.generation.hbm_gib:g} GiB nominal)"
    )
  print(f"vocab {vocab:,} ({source})" if "assumed" not in source else f"vocab {vocab:,} {source}")


def _print_phase(config, r: PhaseResult, mesh, on_tpu: bool, limit, quick: bool) -> None:
  """`on_tpu`: the target is a TPU slice or GPU servers (compile-only devices), not local."""
  on_gpu = mesh.devices.flat[0].platform == "gpu"
  chip = "GPU" if on_gpu else "chip"
  where = (
      f"{mesh.devices.size} chips"
      if on_tpu and not on_gpu
      else f"{mesh.devices.size} x {mesh.devices.flat[0].device_kind}"
  )
  print(
      f"phase {r.index + 1}: {config.get('variant', config.model.preset)} ({r.params:,} params), "
      f"batch {r.batch} "
      f"x seq {r.seq_len}, microbatches {r.microbatches}, remat {config.model.remat}, "
      f"mesh {r.mesh} on {where}" + (" (quick compile)" if quick else "")
  )
  if r.memory is None and r.oom is None:
    print("  memory analysis not available on this backend")
    return
  if r.memory is not None:
    mm = r.memory
    label = f"HBM per {chip}" if on_tpu else "per device"
    print(
        f"  {label}: arguments {gib(mm['arguments'])}, outputs {gib(mm['outputs'])} "
        f"(donated {gib(mm['donated'])}), temporaries {gib(mm['temporaries'])}, code "
        f"{gib(mm['code'])} -> peak ~{gib(r.peak)}" + (f" of {gib(limit)}" if limit else "")
    )
  if on_tpu and r.oom is None:
    flops = (
        f"{r.flops / 1e9:,.1f} GFLOP in XLA's cost analysis (it counts a loop body once)"
        if r.flops
        else "no cost analysis from XLA's GPU compiler"
        if on_gpu
        else "n/a in XLA's cost analysis (it counts a loop body once)"
    )
    est = (
        f"compiler's step-time estimate {r.estimate_s * 1e3:.1f} ms (an estimate, not a "
        "measurement)"
        if r.estimate_s
        else "no step-time estimate from the compiler at this effort (a quick compile gives one)"
    )
    if on_gpu and not r.estimate_s:
      est = "no step-time estimate from XLA's GPU compiler"
    if r.bound_s:
      est += f"; >= {r.bound_s * 1e3:.2f} ms at the {chip}'s {'bf16 ' if on_gpu else ''}peak FLOPs"
    print(
        f"  compute per {chip}: {flops}, "
        f"{r.model_flops / 1e9:,.1f} GFLOP by bertjax.training.flops; {est}"
    )
    print(f"  collectives: {_collective_line(r)}")
    if on_gpu:
      for line in gpu.describe_attention(r.attention, r.cudnn, r.microbatches):
        print(f"  attention: {line}")
      return
    kernels = ", ".join(f"{k} {n}" for k, n in r.kernels.items())
    print(f"  Pallas kernels per step: {kernels or 'none (attention is XLA)'}")


def compile_and_report(
    config,
    target: Target = Target(),
    mesh_axes: dict[str, int] | None = None,
    quick: bool = False,
    phase: int | None = None,
) -> int:
  """Compile each phase (or the 0-based `phase`) for the target; print memory, cost and
  collectives, and one "DOES NOT FIT" line on stderr per phase over the memory limit.

  Returns 0, or 1 when a phase does not fit.
  """
  config, vocab, source = resolve(config, mesh_axes)
  mesh, limit, limit_src = setup_target(config, target)
  print_header(target, vocab, source, limit, limit_src)
  on_tpu = target.slice is not None
  rc = 0
  for r in compile_phases(config, mesh, quick=quick, phase=phase):
    _print_phase(config, r, mesh, on_tpu, limit, quick)
    if does_not_fit(r, limit):
      on_gpu = isinstance(target.slice, gpu.Servers)
      name = target.slice.name if on_tpu else "this device"
      need = f"{r.peak / 2**30:.2f} GiB" if r.peak else "more than that"
      nominal = (
          ""
          if not on_tpu
          else f"{target.slice.model.hbm_gb} GB HBM"
          if on_gpu
          else f"{target.slice.generation.hbm_gib:g} GiB HBM"
      )
      of = f"{limit / 2**30:.2f}" + (f" usable ({nominal})" if on_tpu else "")
      print(
          f"DOES NOT FIT on {name}: phase {r.index + 1} needs {need} per "
          f"{('GPU' if on_gpu else 'chip') if on_tpu else 'device'} of {of}; try "
          f"{fix_hint(config, r, mesh.devices.size)}",
          file=sys.stderr,
      )
      rc = 1
  return rc
