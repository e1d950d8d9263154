"""NVIDIA GPU servers without a GPU: accelerator names, target descriptions, compiled attention.

`bertjax compile --accelerator h100-8` compiles the real train step for GPUs this machine does
not have. jax's CUDA PJRT plugin (the `gpu` extra: jax-cuda12-plugin, jax-cuda12-pjrt) builds
compile-only devices from a target description, a `stream_executor.GpuTargetConfigProto` in
text form (what XLA would otherwise read from an attached GPU: compute capability, SM count,
memory, caches), and XLA's GPU compiler then reports memory, cost and the collectives of the
step, as libtpu does for a TPU slice (`bertjax.training.tpu`).

Names: MODEL-N is one server of N GPUs (N = 1, 2, 4 or 8), MODEL-8xH is H servers of 8
(`h100-8x4`: 32 GPUs). The plugin's topology is "partitions x hosts x GPUs per host"; NVLink
domains beyond one server (GB200 NVL72) are not modelled.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

from bertjax import errors


@dataclasses.dataclass(frozen=True)
class Model:
  """One GPU model, as XLA sees it through a target description (data sheet figures)."""

  name: str  # the accelerator prefix: h100
  kind: str  # the device kind the CUDA driver reports, and so the compile-only devices
  capability: tuple[int, int]  # CUDA compute capability
  sms: int  # streaming multiprocessors
  hbm_bytes: int  # device memory the CUDA driver reports (XLA's own target descriptions of
  # these GPUs, xla/backends/gpu/target_config/specs, record the same figures)
  hbm_gb: int  # nominal
  bandwidth: float  # HBM bytes/s
  l2_bytes: int
  smem_per_sm: int  # shared memory per SM
  smem_per_block_optin: int  # the most one block may opt into
  clock_ghz: float  # boost clock


MODELS = {
    "a100": Model(
        "a100",
        "NVIDIA A100-SXM4-80GB",
        (8, 0),
        108,
        85_100_068_864,
        80,
        2.039e12,
        40 * 2**20,
        167_936,
        166_912,
        1.41,
    ),
    "h100": Model(
        "h100",
        "NVIDIA H100 80GB HBM3",
        (9, 0),
        132,
        84_942_979_072,
        80,
        3.35e12,
        50 * 2**20,
        233_472,
        232_448,
        1.98,
    ),
    "h200": Model(
        "h200",
        "NVIDIA H200 141GB HBM3e",
        (9, 0),
        132,
        151_397_597_184,
        141,
        4.8e12,
        50 * 2**20,
        233_472,
        232_448,
        1.98,
    ),
}
PER_HOST = (1, 2, 4, 8)
EXAMPLES = "h100-8, h200-8, a100-8, h100-8x4"
KINDS = "MODEL-N (one server of N = 1, 2, 4 or 8 GPUs) or MODEL-8xH (H servers of 8)"
# The cuDNN the target description names: jax-cuda12-plugin 0.10's floor (nvidia-cudnn-cu12 >= 9.8).
CUDNN = (9, 8, 0)


@dataclasses.dataclass(frozen=True)
class Servers:
  """GPUs of one model in `hosts` servers of `per_host`."""

  name: str
  model: Model
  hosts: int
  per_host: int

  @property
  def chips(self) -> int:  # the name the TPU slice uses too: fit.Target counts devices by it
    return self.hosts * self.per_host

  @property
  def topology(self) -> str:
    """The plugin's topology option: partitions x hosts x GPUs per host."""
    return f"1x{self.hosts}x{self.per_host}"

  def describe(self) -> str:
    m = self.model
    hosts = (
        f"{self.hosts} hosts x {self.per_host}" if self.hosts > 1 else f"1 host of {self.per_host}"
    )
    return (
        f"{self.name}: {self.chips} x {m.kind} (compute capability {m.capability[0]}."
        f"{m.capability[1]}, {m.sms} SMs), {hosts} GPUs"
    )


def parse_accelerator(name: str, what: str = "--accelerator") -> Servers:
  """`h100-8x4` -> Servers(h100, 4 hosts of 8); `ConfigError` naming `what` otherwise."""
  m = re.fullmatch(r"([a-z]\d+)-(\d+)(?:x(\d+))?", name.strip().lower())
  if not m or m.group(1) not in MODELS:
    raise errors.ConfigError(
        f"{what} {name!r}: not a GPU server — valid: {', '.join(MODELS)} as {KINDS}, "
        f"e.g. {EXAMPLES}"
    )
  per_host, hosts = int(m.group(2)), int(m.group(3) or 1)
  if per_host not in PER_HOST or hosts < 1 or (hosts > 1 and per_host != 8):
    raise errors.ConfigError(f"{what} {name!r}: {KINDS} — e.g. {m.group(1)}-8 or {m.group(1)}-8x4")
  return Servers(name.strip(), MODELS[m.group(1)], hosts, per_host)


def is_gpu_name(name: str) -> bool:
  """Whether an --accelerator value is spelled as a GPU server (a model this module knows or
  another letter-digits model, e.g. b200-8, which `parse_accelerator` then refuses)."""
  return bool(re.fullmatch(r"[a-uw-z]\d+-\d+(?:x\d+)?", name.strip().lower()))


def target_config(model: Model) -> str:
  """The `GpuTargetConfigProto` text of `model`: the fields XLA's GPU compiler reads."""
  major, minor = model.capability
  info = {
      "threads_per_block_limit": 1024,
      "threads_per_warp": 32,
      "shared_memory_per_block": 48 * 1024,
      "shared_memory_per_core": model.smem_per_sm,
      "threads_per_core_limit": 2048,
      "core_count": model.sms,
      "fpus_per_core": 64 if major == 8 else 128,
      "block_dim_limit_x": 2**31 - 1,
      "block_dim_limit_y": 65535,
      "block_dim_limit_z": 65535,
      "memory_bandwidth": int(model.bandwidth),
      "l2_cache_size": model.l2_bytes,
      "clock_rate_ghz": model.clock_ghz,
      "device_memory_size": model.hbm_bytes,
      "shared_memory_per_block_optin": model.smem_per_block_optin,
      "registers_per_core_limit": 65536,
      "registers_per_block_limit": 65536,
  }
  lines = ["gpu_device_info {"]
  lines += [f"  {k}: {v}" for k, v in info.items()]
  # Hopper's arch-specific features (sm_90a: wgmma, TMA), as an H100's driver reports them
  extension = " feature_extension: ACCELERATED_FEATURES" if major == 9 else ""
  lines += [f"  cuda_compute_capability {{ major: {major} minor: {minor}{extension} }}", "}"]
  lines += [
      'platform_name: "CUDA"',
      "dnn_version_info {{ major: {} minor: {} patch: {} }}".format(*CUDNN),
      f'device_description_str: "{model.kind}"',
  ]
  return "\n".join(lines) + "\n"


def plugin_missing() -> str | None:
  """None when jax's CUDA plugin can be imported, else the one-line reason and fix."""
  # jax finds its plugins in the `jax_plugins` namespace; without it there is no submodule to ask
  if importlib.util.find_spec("jax_plugins") is None or (
      importlib.util.find_spec("jax_plugins.xla_cuda12") is None
  ):
    return "jax's CUDA plugin is not installed: pip install -e '.[gpu]'"
  return None


def cudnn_missing() -> str | None:
  """None when NVIDIA's cuDNN wheel is installed, else the one-line reason and fix. Without it
  JAX refuses cuDNN's attention while tracing, and every layer gets XLA's."""
  if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.cudnn") is None:
    return "cuDNN is not installed: pip install -e '.[gpu]'"
  return None


def devices(s: Servers) -> list:
  """Compile-only devices of the servers (no GPU needed)."""
  # The plugin checks the local CUDA libraries against its build before it registers; with no
  # GPU and no CUDA runtime here that check fails, and it has nothing to check for a compile.
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  from jax.experimental import topologies

  return topologies.get_topology_desc(
      platform="cuda", target_config=target_config(s.model), topology=s.topology
  ).devices


# ------------------------------------------------------------------------- compiled HLO text

# cuDNN's fused attention as XLA's GPU backend names its custom calls: forward `__cudnn$fmha*`,
# backward `__cudnn$fmha*Backward`; a fusion XLA hands to cuDNN is `__cudnn$fusion`.
_CUDNN_RE = re.compile(r'custom_call_target="(__cudnn\$fmha[\w$]*|__cudnn\$fusion)"')


def cudnn_attention_calls(hlo: str) -> dict[str, int]:
  """cuDNN attention custom calls per step by target, from an optimized HLO module (a call in a
  loop counts once per iteration)."""
  from bertjax.training import tpu

  comps = tpu._computations(hlo)
  runs = tpu._runs(comps)
  out: dict[str, int] = {}
  for name, lines in comps.items():
    for line in lines:
      for target in _CUDNN_RE.findall(line):
        out[target] = out.get(target, 0) + runs.get(name, 1)
  return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------- memory

# The share of a GPU's memory jax's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION; its default).
DEFAULT_MEM_FRACTION = 0.75


def usable_bytes(model: Model) -> tuple[float, str]:
  """Memory one training process may use on a GPU of `model`, and where the figure came from:
  the share jax's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set)."""
  text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
  try:
    fraction = float(text) if text else DEFAULT_MEM_FRACTION
  except ValueError:
    raise errors.ConfigError(
        f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r}: write a fraction of GPU memory, e.g. 0.9"
    ) from None
  if not 0 < fraction <= 1:
    raise errors.ConfigError(
        f"XLA_PYTHON_CLIENT_MEM_FRACTION={text}: write a fraction in (0, 1], e.g. 0.9"
    )
  how = "XLA_PYTHON_CLIENT_MEM_FRACTION" if text else "jax's default XLA_PYTHON_CLIENT_MEM_FRACTION"
  return fraction * model.hbm_bytes, f"{fraction:g} of {model.hbm_bytes / 2**30:.2f} GiB: {how}"


# ------------------------------------------------------------------------------- attention


def attention_plan(cfg, seq_len: int, packed: bool) -> list[tuple[str, str, str]]:
  """Per layer of the training step: (global | local, cudnn | xla, why), by the rules
  `ops.attention` applies on a GPU (`ops.cudnn_refusal`); the compiled HLO says what happened."""
  import jax
  from bertjax.model import ops

  q = jax.ShapeDtypeStruct((1, seq_len, cfg.num_heads, cfg.head_dim), cfg.compute_dtype)
  refusal = ops.cudnn_refusal(q, dropping=cfg.attention_dropout_rate > 0)
  masks = "packed examples' segments" if packed else "key padding"
  plan = []
  for i in range(cfg.num_layers):
    is_global = cfg.local_attention == 0 or i % cfg.global_every == 0
    kind = "global" if is_global else f"local {cfg.local_attention}"
    layer_masks = masks if is_global else f"{masks} + window {cfg.local_attention}"
    if refusal is None:
      plan.append((kind, "cudnn", f"mask ({layer_masks}) as cuDNN's bias"))
    else:
      plan.append((kind, "xla", refusal))
  return plan


def describe_attention(
    plan: list[tuple[str, str, str]], calls: dict[str, int], steps: int
) -> list[str]:
  """Report lines: what each group of layers got, checked against the cuDNN calls the compiled
  step makes (`calls`, per step; `steps`: forward passes per step, the microbatches)."""
  if not plan:
    return []
  groups: dict[tuple[str, str, str], list[int]] = {}
  for i, entry in enumerate(plan):
    groups.setdefault(entry, []).append(i)
  fwd = sum(n for k, n in calls.items() if k.startswith("__cudnn$fmha") and "Backward" not in k)
  expected = sum(1 for _, kernel, _ in plan if kernel == "cudnn") * steps
  lines = []
  for (kind, kernel, why), layers in groups.items():
    where = f"{len(layers)} {kind} layer{'s' if len(layers) > 1 else ''}"
    if kernel == "cudnn" and fwd >= expected:
      lines.append(f"{where}: cuDNN flash attention, {why}")
    elif kernel == "cudnn":
      why_not = cudnn_missing() or "a check of jax.nn.dot_product_attention's cuDNN path"
      lines.append(f"{where}: XLA — JAX refused cuDNN while tracing ({why_not})")
    else:
      lines.append(f"{where}: XLA — {why}")
  if calls:
    lines.append("cuDNN calls per step: " + ", ".join(f"{k} {n}" for k, n in calls.items()))
  return lines
