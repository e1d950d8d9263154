"""Cloud TPU slices without a TPU: accelerator types, libtpu topologies, HBM, compiled HLO.

`bertjax compile --accelerator v4-32` compiles the real train step for a slice this machine
does not have: libtpu (the `tpu` extra) builds compile-only devices for a topology string, and
the TPU compiler then reports memory, cost and the collectives of the step.

Accelerator types are spelled as gcloud and launch/tpu_pod.sh spell them. v4-N and v5p-N count
TensorCores (two per chip, fused into one "megacore" device: N/2 chips, N/2 devices);
v5litepod-N (alias v5e-N) and v6e-N count chips (one TensorCore each). Hosts hold 4 chips,
except the single-host v5litepod/v6e slices of 1, 4 and 8 chips.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import importlib.util
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bertjax import errors


@dataclasses.dataclass(frozen=True)
class Generation:
  name: str  # v4 | v5e | v5p | v6e
  libtpu: str  # topology prefix libtpu accepts
  cores_per_chip: int  # TensorCores a chip has (v4/v5p: 2, one megacore device)
  dims: int  # torus dimensions: 3 (v4, v5p) or 2 (v5e, v6e)
  hbm_gib: float  # nominal HBM per chip (the compiler's usable figure is a little less)


GENERATIONS = {
    "v4": Generation("v4", "v4", 2, 3, 32),
    "v5p": Generation("v5p", "v5p", 2, 3, 95),
    "v5litepod": Generation("v5e", "v5e", 1, 2, 16),
    "v5e": Generation("v5e", "v5e", 1, 2, 16),
    "v6e": Generation("v6e", "v6e", 1, 2, 32),
}
# 2D slices by chip count (cloud.google.com/tpu/docs/v5e, /v6e).
_TOPOLOGY_2D = {
    1: "1x1",
    4: "2x2",
    8: "2x4",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}
# 3D slices below one 4x4x4 cube (cloud.google.com/tpu/docs/v4, /v5p).
_TOPOLOGY_3D_SMALL = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4"}
EXAMPLES = "v4-32, v5litepod-16, v5p-8, v6e-16"
KINDS = "v4-N, v5p-N (N TensorCores), v5litepod-N or v5e-N, v6e-N (N chips)"


@dataclasses.dataclass(frozen=True)
class Slice:
  """One TPU slice: what to ask libtpu for, and what it is made of."""

  name: str  # the accelerator type, or the raw topology string
  generation: Generation
  topology: str  # libtpu's name, e.g. "v4:2x2x4"
  chips: int
  hosts: int
  chips_per_host: tuple[int, int, int]

  @property
  def topology_options(self) -> dict:
    """Keyword options of `get_topology_desc`: megacore chips, hosts as on Cloud TPU VMs."""
    opts = {"chips_per_host_bounds": self.chips_per_host}
    if self.generation.cores_per_chip == 2:
      opts["chip_config_name"] = "megacore"
    return opts

  @property
  def accelerator_type(self) -> str:
    """gcloud's name of the slice: v4-32 for 16 v4 chips, v5litepod-16 for 16 v5e chips."""
    g = self.generation
    prefix = {"v5e": "v5litepod"}.get(g.name, g.name)
    return f"{prefix}-{self.chips * g.cores_per_chip}"

  def describe(self) -> str:
    g = self.generation
    cores = (
        "1 device per chip (megacore: both TensorCores)"
        if g.cores_per_chip == 2
        else "1 TensorCore per chip"
    )
    return (
        f"{self.name}: {self.chips} chips of TPU {g.name} (topology {self.topology}), "
        f"{self.hosts} host{'s' if self.hosts > 1 else ''} x "
        f"{self.chips // self.hosts} chips, {cores}"
    )


def _cube_topology(chips: int) -> str | None:
  """3D torus dims for `chips` (v4/v5p): the small shapes, else 4x4x4 cubes, most cubic."""
  if chips in _TOPOLOGY_3D_SMALL:
    return _TOPOLOGY_3D_SMALL[chips]
  if chips < 64 or chips % 64:
    return None
  k = chips // 64
  best = min(
      (
          (a, b, k // (a * b))
          for a in range(1, k + 1)
          for b in range(a, k + 1)
          if k % (a * b) == 0 and k // (a * b) >= b
      ),
      key=lambda d: (max(d), sum(d)),
  )
  return "x".join(str(4 * d) for d in best)


def _host_layout(gen: Generation, chips: int) -> tuple[int, tuple[int, int, int]]:
  if gen.dims == 2 and chips <= 8:  # v5e/v6e single-host slices: 1, 4 or 8 chips
    dims = [int(d) for d in _TOPOLOGY_2D[chips].split("x")]
    return 1, (dims[0], dims[1], 1)
  return max(1, chips // 4), (2, 2, 1) if chips >= 4 else (1, 1, 1)


def parse_accelerator(name: str, what: str = "accelerator") -> Slice:
  """`v4-32` -> Slice(v4:2x2x4, 16 chips, 4 hosts); `ConfigError` naming `what` otherwise."""
  m = re.fullmatch(r"(v4|v5p|v5litepod|v5e|v6e)-(\d+)", name.strip())
  if not m:
    raise errors.ConfigError(
        f"{what} {name!r}: not a Cloud TPU accelerator type — valid types: {KINDS}, "
        f"e.g. {EXAMPLES} (gcloud's names)"
    )
  gen, n = GENERATIONS[m.group(1)], int(m.group(2))
  if gen.cores_per_chip == 2:
    chips, topo = n // 2, _cube_topology(n // 2) if n % 2 == 0 else None
    if topo is None:
      raise errors.ConfigError(
          f"{what} {name!r}: {m.group(1)}-N counts TensorCores (2 per chip) — "
          f"N must be 8, 16, 32, 64 or a multiple of 128, e.g. {m.group(1)}-32"
      )
  else:
    chips, topo = n, _TOPOLOGY_2D.get(n)
    if topo is None:
      raise errors.ConfigError(
          f"{what} {name!r}: {m.group(1)}-N counts chips — N must be one of "
          f"{', '.join(map(str, _TOPOLOGY_2D))}"
      )
  hosts, per_host = _host_layout(gen, chips)
  return Slice(name, gen, f"{gen.libtpu}:{topo}", chips, hosts, per_host)


def parse_topology(text: str, what: str = "topology") -> Slice:
  """A raw libtpu topology string (`v5e:4x4`, `v4:2x2x2`) with the same chip defaults."""
  m = re.fullmatch(r"(?:TPU )?(v4|v5p|v5|v5e|v5litepod|v6e):(\d+(?:x\d+){1,2})", text.strip())
  if not m:
    raise errors.ConfigError(
        f"{what} {text!r}: not a libtpu topology — write GENERATION:DIMS, e.g. v4:2x2x4, "
        "v5p:2x2x1, v5e:4x4, v6e:4x4"
    )
  gen = GENERATIONS["v5p" if m.group(1) == "v5" else m.group(1)]
  dims = [int(d) for d in m.group(2).split("x")]
  if len(dims) != gen.dims or 0 in dims:
    example = f"{gen.libtpu}:{'2x2x2' if gen.dims == 3 else '4x4'}"
    raise errors.ConfigError(
        f"{what} {text!r}: TPU {gen.name} is a {gen.dims}D torus — write "
        f"{gen.dims} dimensions of at least 1, e.g. {example}"
    )
  chips = math.prod(dims)
  hosts, per_host = (
      _host_layout(gen, chips)
      if gen.dims == 3 or chips in _TOPOLOGY_2D
      else (max(1, chips // 4), (2, 2, 1))
  )
  return Slice(text, gen, f"{gen.libtpu}:{m.group(2)}", chips, hosts, per_host)


def libtpu_missing() -> str | None:
  """None when libtpu can be imported, else the one-line reason and fix."""
  if importlib.util.find_spec("libtpu") is None:
    return "libtpu is not installed: pip install -e '.[tpu]' (or 'jax[tpu]')"
  return None


def devices(s: Slice) -> list:
  """Compile-only devices of the slice (no TPU needed)."""
  # Compiling never touches a chip: let several processes load libtpu at once (its lockfile
  # otherwise refuses the second), and skip the Cloud metadata server off Cloud TPU VMs.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  # Off a TPU VM libtpu warns that it cannot find these; the topology below is explicit.
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", s.accelerator_type)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  from jax.experimental import topologies  # after the environment above: libtpu reads it

  return topologies.get_topology_desc(s.topology, "tpu", **s.topology_options).devices


_HBM_RE = re.compile(r"exceeds available HBM \(([\d.]+)([KMGT])\)")
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def usable_hbm_bytes(device, nominal_gib: float) -> tuple[float, str]:
  """HBM one device may use, as the TPU compiler reports it (it reserves a little), and where
  the figure came from: compile an over-sized copy and read the compiler's limit."""
  s = NamedSharding(Mesh([device], ("x",)), P())
  big = jax.ShapeDtypeStruct((2**38,), jnp.float32, sharding=s)  # 1 TiB
  try:
    jax.jit(lambda a: a + 1, out_shardings=s).lower(big).compile()
  except Exception as e:  # RESOURCE_EXHAUSTED names the limit
    m = _HBM_RE.search(str(e))
    if m:
      return float(m.group(1)) * _UNIT[m.group(2)], "the TPU compiler's limit"
  return nominal_gib * 2**30, "nominal"


def parse_oom(message: str) -> tuple[float | None, float | None]:
  """(needed, available) bytes from a RESOURCE_EXHAUSTED compile error, None if absent."""
  m = re.search(r"\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)", message)
  if not m:
    m2 = _HBM_RE.search(message)
    return None, (float(m2.group(1)) * _UNIT[m2.group(2)]) if m2 else None
  return (float(m.group(1)) * _UNIT[m.group(2)], float(m.group(3)) * _UNIT[m.group(4)])


# ------------------------------------------------------------------------- compiled HLO text

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_SHAPE_RE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_INSTR_RE = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) (" + "|".join(COLLECTIVES) + r")(-start)?\(")
_CALL_RE = re.compile(r"\b(body|calls|condition)=%([\w.\-]+)")
# A while loop's trip count in its backend config, where the GPU compiler records it (its
# condition compares inside a fusion there, out of `_trip_count`'s reach).
_KNOWN_TRIP_RE = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


@dataclasses.dataclass
class Collective:
  op: str  # one of COLLECTIVES
  dtype: str
  shape: tuple[int, ...]
  bytes: int  # of the result (the gathered / reduced arrays); `shape` is its largest array
  runs: int  # executions per step (inside a loop: its trip count)
  computation: str


def _computations(hlo: str) -> dict[str, list[str]]:
  comps: dict[str, list[str]] = {}
  cur = None
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$", line)
    if head and not line.startswith(" "):
      cur = "ENTRY" if line.startswith("ENTRY") else head.group(1)
      comps[cur] = []
    elif cur is not None:
      comps[cur].append(line)
  return comps


def _trip_count(cond: list[str]) -> int:
  consts = [
      int(v)
      for line in cond
      for v in re.findall(r"[su]32\[\](?:\{[^}]*\})? constant\((\d+)\)", line)
  ]
  return max(consts) if consts else 1


def _runs(comps: dict[str, list[str]]) -> dict[str, int]:
  """How often each computation runs per step: a loop (the layer scan, microbatches, windowed
  einsums) multiplies its body by the trip count."""
  runs: dict[str, int] = {"ENTRY": 1}
  order = ["ENTRY"]
  for name in order:  # breadth-first from the entry: callers before callees
    for line in comps.get(name, ()):
      calls = dict(_CALL_RE.findall(line))
      trip = 1
      if "condition" in calls:  # the loop's own count (XLA's GPU backend), else its condition's
        known = _KNOWN_TRIP_RE.search(line)
        trip = int(known.group(1)) if known else _trip_count(comps.get(calls["condition"], []))
      for kind, callee in calls.items():
        if callee in comps:
          runs[callee] = runs.get(callee, 0) + runs[name] * (trip if kind == "body" else 1)
          if callee not in order:
            order.append(callee)
  return runs


def collectives(hlo: str) -> list[Collective]:
  """Every collective of an optimized HLO module, with how often it runs per step (a collective
  inside a loop counts once per iteration)."""
  comps = _computations(hlo)
  runs = _runs(comps)
  out = []
  for name, lines in comps.items():
    for line in lines:
      m = _INSTR_RE.match(line)
      if not m:
        continue
      shapes = [
          (d, tuple(int(x) for x in dims.split(",") if x))
          for d, dims in _SHAPE_RE.findall(m.group(2))
      ]
      if not shapes:
        continue
      size = [math.prod(d) * _DTYPE_BYTES[t] for t, d in shapes]
      dtype, shape = shapes[size.index(max(size))]
      # A combined all-reduce (and its kin) returns one array per operand: count them all.
      # An async all-gather / permute returns (operand, result, ...): count the result.
      nbytes = max(size) if m.group(3) in ("all-gather", "collective-permute") else sum(size)
      out.append(Collective(m.group(3), dtype, shape, nbytes, runs.get(name, 1), name))
  return out


def windowed_einsums(hlo: str) -> dict[str, int]:
  """Loops the TPU compiler made of an all-gather (ag) or reduce-scatter (rs) fused into its
  matmul (collective-permutes that overlap the dot): FSDP's gathers and gradient scatters."""
  found = set(re.findall(r"body=%[\w.\-]*windowed_dot_general_body_(ag|rs)[\w.\-]*", hlo))
  loops = re.findall(r"body=%[\w.\-]*windowed_dot_general_body_(ag|rs)", hlo)
  return {k: loops.count(k) for k in sorted(found)}


_KERNEL_RE = re.compile(
    r'^\s*(?:ROOT )?%([\w\-]+?)(?:\.\d+)? = .*custom_call_target="tpu_custom_call"'
)


def pallas_kernels(hlo: str) -> dict[str, int]:
  """Pallas (Mosaic) kernel calls per step by kernel, from an optimized HLO module: splash
  attention's are `splash_mha_fwd*` (forward) and `splash_mha_dq*` / `splash_mha_dkv*`
  (backward); a call inside a loop counts once per iteration."""
  comps = _computations(hlo)
  runs = _runs(comps)
  out: dict[str, int] = {}
  for name, lines in comps.items():
    for line in lines:
      m = _KERNEL_RE.match(line)
      if m:
        out[m.group(1)] = out.get(m.group(1), 0) + runs.get(name, 1)
  return dict(sorted(out.items()))
