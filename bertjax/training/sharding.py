"""The device mesh and the one table that maps the model's logical axes onto it.

Mesh axes, outermost first:
  data    pure data parallelism: each group holds a full copy of the state (after fsdp/tensor)
  fsdp    data parallelism whose replicas also split parameters and optimizer state (ZeRO-3)
  tensor  Megatron-style model parallelism: heads, MLP columns and the vocabulary are split

The batch is split over `data` x `fsdp`. Inside one slice the axes use the fast interconnect
(ICI); `dcn_*` multiplies an axis across slices (or hosts, on GPU clusters), where bandwidth is
low, so only `data` (and perhaps `fsdp`) should go there.

`LOGICAL_AXIS_RULES` is the only place a mesh-axis name meets a model axis name: the model
(`bertjax/model/`) names its axes ('embed', 'mlp', 'heads', ...) and never a mesh axis.
Pretraining and fine-tuning both place their state and trace their steps by it
(`bertjax.training.train_state`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bertjax import errors

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or axes, or None = replicated). Parameters first, then activations.
LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ("vocab", "tensor"),  # word embeddings / MLM bias: vocab-parallel
    ("embed", "fsdp"),  # the hidden axis of every weight is the one FSDP splits
    ("embed_out", "tensor"),  # second hidden axis of square (H, H) kernels: pooler, MLM transform
    ("pos", None),
    ("type", None),
    ("qkv", None),  # size 3
    ("glu", None),  # size 2: the GLU's input and gate halves (each split as 'mlp')
    ("heads", "tensor"),  # attention heads split Megatron-style
    ("kv", None),
    ("mlp", "tensor"),  # MLP columns (intermediate) / rows (output)
    ("classes", None),
    ("layers", None),  # the scan axis stays whole: each step of the scan needs its own layer
    # activations
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("masked", None),
)


def axis_sizes(
    data: int = -1, fsdp: int = 1, tensor: int = 1, num_devices: int | None = None
) -> tuple[int, int, int]:
  """Resolve one `-1` in (data, fsdp, tensor) so that the product is `num_devices`."""
  n = jax.device_count() if num_devices is None else num_devices
  sizes = [data, fsdp, tensor]
  if any(s != -1 and s < 1 for s in sizes) or sizes.count(-1) > 1:
    raise errors.ConfigError(
        f"mesh: data={data} fsdp={fsdp} tensor={tensor}: each axis must be >= 1, or -1 (fill) "
        "for at most one of them"
    )
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if n % known:
      raise errors.ConfigError(
          f"mesh: {n} devices do not divide by the product of the other axes, {known}; "
          f"give sizes whose product divides {n}"
      )
    sizes[sizes.index(-1)] = n // known
  if math.prod(sizes) != n:
    raise errors.ConfigError(
        f"mesh: data*fsdp*tensor = {sizes[0]}*{sizes[1]}*{sizes[2]} = "
        f"{math.prod(sizes)} but there are {n} devices; set one axis to -1 to fill"
    )
  return tuple(sizes)  # type: ignore[return-value]


def make_mesh(
    data: int = -1,
    fsdp: int = 1,
    tensor: int = 1,
    *,
    dcn_data: int = 1,
    dcn_fsdp: int = 1,
    dcn_tensor: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """A `Mesh` over axes ('data', 'fsdp', 'tensor').

  (data, fsdp, tensor) is the parallelism within one slice (ICI); one of them may be -1 to use
  all remaining devices. dcn_* is the parallelism across slices (DCN); the full mesh axis is
  the product, e.g. data=-1, dcn_data=2 on two v5e-256 slices gives data = 512.
  """
  devices = list(jax.devices() if devices is None else devices)
  dcn = (dcn_data, dcn_fsdp, dcn_tensor)
  num_slices = math.prod(dcn)
  if len(devices) % num_slices:
    raise errors.ConfigError(
        f"mesh: {len(devices)} devices do not split into dcn {dcn} = {num_slices} slices"
    )
  ici = axis_sizes(data, fsdp, tensor, len(devices) // num_slices)
  if num_slices == 1:
    try:
      arr = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
      arr = np.asarray(devices).reshape(ici)  # CPU / unknown topologies
  else:
    is_tpu = devices[0].platform == "tpu"
    try:
      arr = mesh_utils.create_hybrid_device_mesh(
          ici, dcn, devices, process_is_granule=not is_tpu, allow_split_physical_axes=True
      )
    except ValueError:  # fewer slices/processes than dcn asks (e.g. fake CPU devices)
      grid = np.asarray(devices).reshape(dcn + ici).transpose(0, 3, 1, 4, 2, 5)
      arr = grid.reshape([d * i for d, i in zip(dcn, ici)])
  return Mesh(arr, MESH_AXES)


def mesh_from_config(mesh_cfg) -> Mesh:
  """`make_mesh` from a `config.mesh` ConfigDict (fields data/fsdp/tensor/dcn_*)."""
  return make_mesh(
      mesh_cfg.data,
      mesh_cfg.fsdp,
      mesh_cfg.tensor,
      dcn_data=mesh_cfg.dcn_data,
      dcn_fsdp=mesh_cfg.dcn_fsdp,
      dcn_tensor=mesh_cfg.dcn_tensor,
  )


def logical_to_spec(
    names: Sequence[str | None],
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    rules=LOGICAL_AXIS_RULES,
) -> P:
  """The PartitionSpec the rules give for an array with these logical axis names.

  With `shape` and `mesh`, a dimension that the mesh axes do not divide evenly is replicated
  instead (e.g. BERT's vocabulary of 30522 on tensor=4), so any config compiles.
  """
  spec = nn.logical_to_mesh_axes(tuple(names), rules)
  if shape is None or mesh is None:
    return spec
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    ax = (axes,) if isinstance(axes, str) else (axes or ())
    size = math.prod(mesh.shape[a] for a in ax)
    out.append(axes if size and dim % size == 0 else None)
  return P(*out)


def opt_state_shardings(tx, opt_state_abs: Any, param_shardings: Any, mesh: Mesh) -> Any:
  """The optimizer state's shardings: every per-parameter leaf (Adam's moments, ...) as its
  parameter, everything else (counts, schedules' state) replicated. Pretraining's state and
  fine-tuning's are both built with it."""
  repl = replicated(mesh)
  return optax.tree_utils.tree_map_params(
      tx,
      lambda _, s: s,
      opt_state_abs,
      param_shardings,
      transform_non_params=lambda _: repl,
      is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
  )


def state_shardings(abstract_boxed: Any, mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> Any:
  """NamedShardings for a tree of (possibly `nn.Partitioned`) abstract arrays.

  Leaves without logical names (step counters, RNG keys, scalars) are replicated.
  """

  def one(x):
    if isinstance(x, nn.Partitioned):
      return NamedSharding(mesh, logical_to_spec(x.names, x.value.shape, mesh, rules))
    return NamedSharding(mesh, P())

  return jax.tree.map(one, abstract_boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Inputs are split on the leading (batch) axis over data x fsdp."""
  return NamedSharding(mesh, logical_to_spec(("batch",)))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def num_batch_shards(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch_size(
    global_batch: int, mesh: Mesh, num_microbatches: int = 1, field: str = "config.train.batch_size"
) -> None:
  """Fail early, naming the field, when the global batch does not split evenly."""
  procs = jax.process_count()
  shards = num_batch_shards(mesh)
  if global_batch % num_microbatches:
    raise errors.ConfigError(
        f"{field}={global_batch} is not divisible by "
        f"config.train.microbatches={num_microbatches}"
    )
  micro = global_batch // num_microbatches
  if micro % shards:
    raise errors.ConfigError(
        f"{field}={global_batch} / microbatches {num_microbatches} = {micro} is not "
        f"divisible by the {shards} batch shards (mesh data*fsdp = "
        f"{mesh.shape['data']}*{mesh.shape['fsdp']}); use a multiple of {shards}"
    )
  if global_batch % procs:
    raise errors.ConfigError(f"{field}={global_batch} is not divisible by the {procs} processes")
