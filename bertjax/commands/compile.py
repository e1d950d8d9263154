"""`bertjax compile --config experiments/pretrain.py:base --mesh data=4,fsdp=2 [--devices 8]`.

Ahead-of-time compiles the real train step (every phase) for a mesh you may not have, and
prints its per-device memory, so a config that does not fit fails here and not after a pod
slice has been reserved. Targets: N fake CPU devices on this machine (--devices), or a TPU
topology (--topology v5e:4x4; `jax.experimental.topologies`, needs libtpu). The command exits 1
if a device needs more than --device_memory_gb.

Nothing is run and no parameter is allocated: the state is abstract (`jax.eval_shape`).
"""

from __future__ import annotations

import os
import sys

from absl import flags

MESH_AXES = ("data", "fsdp", "tensor", "dcn_data", "dcn_fsdp", "dcn_tensor")
_FLAGS = (("mesh", "AXIS=N,..."), ("devices", "N"), ("topology", "NAME"),
          ("device_memory_gb", "GB"))


def _define(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("mesh", None, "mesh axes, e.g. data=4,fsdp=2,tensor=1 (-1 fills); "
                      "default: config.mesh", flag_values=fv)
  flags.DEFINE_integer("devices", None, "fake CPU devices to compile for (default: the "
                       "mesh's size, or 8)", flag_values=fv)
  flags.DEFINE_string("topology", None, "TPU topology to compile for, e.g. v5e:4x4 (needs "
                      "libtpu)", flag_values=fv)
  flags.DEFINE_float("device_memory_gb", None, "memory of one target device: fail (exit 1) if "
                     "the step needs more (default: 16 for TPU, else no check)", flag_values=fv)


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
      raise ValueError(f"--mesh {text!r}: {name}={value.strip()!r} is not an integer; write "
                       "e.g. --mesh data=4,fsdp=2 (-1 fills the devices left)") from None
  return out


def _gib(n: float) -> str:
  return f"{n / 2**30:.3f} GiB"


def main(argv: list[str]) -> int:
  from bertjax.commands import pretrain

  fv = pretrain.parse(argv, "bertjax compile", define_extra=_define, doc=__doc__,
                      flag_metavars=_FLAGS)
  if fv is None:
    return 0
  mesh_axes = _parse_mesh(fv.mesh)
  n = fv.devices
  if n is None and not fv.topology:
    sizes = [mesh_axes.get(k, fv.config.mesh.get(k, 1)) for k in ("data", "fsdp", "tensor")]
    n = max(1, sizes[0] * sizes[1] * sizes[2]) if -1 not in sizes else 8
  if not fv.topology:  # must happen before jax initialises its backend
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={n}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  return compile_and_report(fv.config, mesh_axes, fv.topology, fv.device_memory_gb)


def compile_and_report(config, mesh_axes: dict[str, int], topology: str | None = None,
                       device_memory_gb: float | None = None) -> int:
  """Lower + compile each phase's train step; print memory per device. Exit status."""
  import jax

  from bertjax import loop, model as model_lib, sharding, train

  devices = None
  if topology:
    from jax.experimental import topologies

    try:
      devices = topologies.get_topology_desc(topology, "tpu").devices
    except Exception as e:  # no libtpu, unknown name: say which
      print(f"bertjax compile: cannot build TPU topology {topology!r} ({type(e).__name__}: {e}); "
            "install libtpu (pip install 'jax[tpu]') or use --devices N for fake CPU devices",
            file=sys.stderr)
      return 2
    device_memory_gb = device_memory_gb or 16.0
  config = config.copy_and_resolve_references()
  with config.unlocked():
    for k, v in mesh_axes.items():
      config.mesh[k] = v
    if not config.model.vocab_size:
      config.model.vocab_size = 30522  # BERT's English WordPiece vocabulary
  m = config.mesh
  mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor, dcn_data=m.dcn_data,
                            dcn_fsdp=m.dcn_fsdp, dcn_tensor=m.dcn_tensor, devices=devices)
  rc = 0
  for ph in loop.phases(config):
    c = loop.phase_config(config, ph)
    sharding.check_batch_size(ph.batch_size, mesh, ph.microbatches,
                              "config.train.batch_size" if ph.index == 0
                              else "config.phase2.batch_size")
    s = train.setup(c, mesh)
    b, l, p = ph.batch_size, ph.seq_len, ph.max_predictions
    shapes = dict(input_ids=(b, l), token_type_ids=(b, l), attention_mask=(b, l),
                  masked_positions=(b, p), masked_ids=(b, p), masked_weights=(b, p),
                  nsp_labels=(b,))
    batch = {k: jax.ShapeDtypeStruct(v, jax.numpy.int32, sharding=s.batch_sharding)
             for k, v in shapes.items()}
    compiled = s.train_step.lower(s.abstract_state, batch).compile()
    mem = compiled.memory_analysis()
    n_params = model_lib.count_params(s.abstract_state.params)
    print(f"phase {ph.index}: {config.model.preset} ({n_params:,} params), batch {b} x seq {l}, "
          f"microbatches {ph.microbatches}, mesh {dict(mesh.shape)} on "
          f"{mesh.devices.size} x {mesh.devices.flat[0].device_kind}")
    if mem is None:
      print("  memory analysis not available on this backend")
      continue
    args, out = mem.argument_size_in_bytes, mem.output_size_in_bytes
    temp, alias = mem.temp_size_in_bytes, mem.alias_size_in_bytes
    code = getattr(mem, "generated_code_size_in_bytes", 0)
    peak = args + out - alias + temp + code
    print(f"  per device: state+batch {_gib(args)}, outputs {_gib(out)} (donated {_gib(alias)}), "
          f"temporaries {_gib(temp)}, code {_gib(code)} -> peak ~{_gib(peak)}")
    if device_memory_gb and peak > device_memory_gb * 2**30:
      print(f"  DOES NOT FIT: {_gib(peak)} > {device_memory_gb} GiB per device; raise "
            "config.mesh.fsdp, config.train.microbatches, or set config.model.remat=full",
            file=sys.stderr)
      rc = 1
  return rc
