"""How fast one BERT config trains here: tokens/s, model FLOPs, MFU, and the Hugging Face peers.

`run(spec)` times the full train step (forward, MLM + NSP loss, backward, AdamW update) on one
synthetic batch after warm-up and returns one flat dict (what `bertjax bench --json` prints).

Model FLOPs count only useful work (PaLM appendix B / Chinchilla convention, adapted to BERT):
  6 x (encoder parameters) x (B L tokens)          matmuls, forward (2) + backward (4)
  + 12 x layers x H x L per token                   attention scores QK^T and probs x V
  + 6 x (MLM head parameters) x (B P masked rows)   the head runs at masked positions only
  + 6 x (pooler + NSP parameters) x B               the pooler sees [CLS] only
Embedding lookups are free. Nothing recomputed (remat) or wasted (a full-sequence MLM head, as
the peers run) is counted, so MFU is comparable across implementations of the same model.

MFU = model FLOPs per second / peak FLOP/s of the devices used. On CPU the peak is measured in
the same run: the best dense matmul FLOP/s that JAX reaches here (`measure_cpu_peak`). On
GPU/TPU it is the published dense bf16 peak of the chip (`PUBLISHED_PEAK_FLOPS`).

Shape letters: B batch, L sequence length, H hidden, P masked positions, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import bench_peers
from bertjax import model as model_lib

# device_kind substring -> published dense bf16 peak FLOP/s per chip (vendor datasheets).
# Order matters: the first substring found in `device.device_kind` wins.
PUBLISHED_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 0.0),  # a different part from H100 SXM; pass --peak-flops
    ("H100", 989e12),  # SXM
    ("A100", 312e12),
    ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12),  # v5e
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),  # v5p reports itself as "TPU v5"
    ("TPU v6 lite", 918e12),  # v6e (Trillium)
)
CPU_PEAK_SIZES = (512, 1024, 2048)  # square matmuls; the best of these is the CPU's peak


@dataclasses.dataclass(frozen=True)
class BenchSpec:
  """One benchmark: the model, the batch and how long to time it."""

  preset: str = "base"  # bertjax.model.PRESETS name
  batch_size: int = 16  # global sequences per step
  seq_len: int = 128
  num_masked: int = 0  # masked positions per sequence P; 0 = ceil(0.15 L) (20 at L = 128)
  vocab_size: int = 30522  # BERT's English WordPiece vocabulary, as the peers use
  dtype: str = "float32"  # compute dtype: float32 | bfloat16
  remat: str = "none"  # none | full | dots (bertjax.model.BertConfig.remat)
  scan_layers: bool = False
  attention_dropout: float = 0.1  # BERT's recipe; 0 lets attention use dot_product_attention
  warmup: int = 2  # untimed steps; the first one includes compilation
  steps: int = 5  # timed steps (median reported)
  peak_flops: float = 0.0  # override the peak (FLOP/s of all devices used); 0 = measure/table
  seed: int = 0

  def __post_init__(self):
    for field in ("batch_size", "seq_len", "steps", "warmup"):
      if getattr(self, field) < 1:
        raise ValueError(f"bench: --{field.replace('_', '-')}={getattr(self, field)} must be >= 1")
    if self.seq_len > 512:
      raise ValueError(f"bench: --seq-len={self.seq_len} exceeds BERT's 512 positions")
    if not 0 <= self.num_masked < self.seq_len:
      raise ValueError(f"bench: --num-masked={self.num_masked} must be in [0, seq-len="
                       f"{self.seq_len})")
    self.model_config()  # unknown preset, dtype or remat: BertConfig's own error

  def model_config(self) -> model_lib.BertConfig:
    return model_lib.from_preset(self.preset, vocab_size=self.vocab_size, dtype=self.dtype,
                                 remat=self.remat, scan_layers=self.scan_layers,
                                 attention_dropout_rate=self.attention_dropout)

  def masked(self) -> int:
    return self.num_masked or bench_peers.max_predictions(self.seq_len)


# ------------------------------------------------------------------------------------ FLOPs


def param_groups(cfg: model_lib.BertConfig) -> dict[str, int]:
  """Parameter counts of BertForPreTraining by where they act (sums to `count_params`)."""
  H, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  layer = (3 * H * H + 3 * H) + (H * H + H) + 2 * H + (H * F + F) + (F * H + H) + 2 * H
  return {
      "embeddings": (V + cfg.max_position_embeddings + cfg.type_vocab_size) * H + 2 * H,
      "encoder": cfg.num_layers * layer,
      # transform dense + LayerNorm + the tied decoder (V x H, counted again: it is a matmul
      # here, a lookup in the embeddings) + output bias.
      "mlm_head": (H * H + H) + 2 * H + V * H + V,
      "pooler_nsp": (H * H + H) + (2 * H + 2),
  }


def model_flops_per_step(cfg: model_lib.BertConfig, batch_size: int, seq_len: int,
                         num_masked: int) -> float:
  """Training FLOPs of one step: see the module docstring for the formula."""
  g = param_groups(cfg)
  tokens = batch_size * seq_len
  encoder = 6 * g["encoder"] * tokens
  attention = 12 * cfg.num_layers * cfg.hidden_size * seq_len * tokens
  mlm = 6 * (g["mlm_head"] - cfg.vocab_size) * batch_size * num_masked  # the bias is an add
  cls = 6 * g["pooler_nsp"] * batch_size
  return float(encoder + attention + mlm + cls)


# ------------------------------------------------------------------------------------- peak


def measure_cpu_peak(dtype: str = "float32", sizes=CPU_PEAK_SIZES, repeats: int = 5) -> float:
  """Best FLOP/s of a jitted square matmul (2 n^3 FLOPs) over `sizes` on the default device."""
  best = 0.0
  matmul = jax.jit(lambda a, b: a @ b)
  for n in sizes:
    a = jnp.asarray(np.random.default_rng(n).standard_normal((n, n)), dtype)
    matmul(a, a).block_until_ready()  # compile
    for _ in range(repeats):
      t0 = time.perf_counter()
      matmul(a, a).block_until_ready()
      best = max(best, 2 * n**3 / (time.perf_counter() - t0))
  return best


def device_peak(devices: list[jax.Device], spec: BenchSpec) -> tuple[float, str]:
  """Peak FLOP/s of `devices` together, and where the number comes from."""
  if spec.peak_flops > 0:
    return spec.peak_flops, "--peak-flops"
  dev = devices[0]
  if dev.platform == "cpu":
    dtypes = sorted({"float32", spec.dtype})
    peak = max(measure_cpu_peak(d) for d in dtypes)
    return peak, f"measured: best jitted {'/'.join(dtypes)} matmul on {bench_peers.num_cores()} cores"
  for kind, flops in PUBLISHED_PEAK_FLOPS:
    if kind in dev.device_kind and flops > 0:
      return flops * len(devices), f"published dense bf16 peak of {dev.device_kind} x {len(devices)}"
  raise ValueError(f"bench: no published peak for device kind {dev.device_kind!r}; pass "
                   f"--peak-flops FLOPS (the dense bf16 peak of all {len(devices)} devices)")


# ------------------------------------------------------------------------------- train step


def mlm_nsp_loss(out: model_lib.PretrainingOutput, batch: dict[str, jax.Array]) -> jax.Array:
  """Mean MLM cross-entropy over real masked positions + mean NSP cross-entropy."""
  w_BxP = batch["masked_weights"].astype(jnp.float32)
  mlm_BxP = optax.softmax_cross_entropy_with_integer_labels(out.mlm_logits, batch["masked_ids"])
  nsp_B = optax.softmax_cross_entropy_with_integer_labels(out.nsp_logits, batch["nsp_labels"])
  return (mlm_BxP * w_BxP).sum() / jnp.maximum(w_BxP.sum(), 1.0) + nsp_B.mean()


def standin_step(cfg: model_lib.BertConfig, batch: dict[str, np.ndarray], seed: int):
  """(state, jitted step) for model + AdamW + MLM/NSP loss on one device, state donated."""
  model = model_lib.BertForPreTraining(cfg)
  tx = optax.adamw(1e-4, weight_decay=0.01)

  def init(key):
    params = model.init(key, batch["input_ids"][:1], batch["token_type_ids"][:1],
                        batch["attention_mask"][:1], batch["masked_positions"][:1])["params"]
    params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, params,
                          is_leaf=lambda x: hasattr(x, "unbox"))
    return {"params": params, "opt": tx.init(params), "rng": jax.random.key(seed + 1)}

  def step(state, batch):
    rng, dropout_key = jax.random.split(state["rng"])

    def loss_fn(params):
      out = model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                        batch["attention_mask"], batch["masked_positions"],
                        deterministic=False, rngs={"dropout": dropout_key})
      return mlm_nsp_loss(out, batch)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt = tx.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt": opt,
            "rng": rng}, {"loss": loss}

  state = jax.jit(init)(jax.random.key(seed))
  return state, jax.jit(step, donate_argnums=0)


def _memory_bytes(compiled, device: jax.Device) -> tuple[int | None, str]:
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  try:
    mem = compiled.memory_analysis()
    return int(mem.peak_memory_in_bytes), "XLA compiled peak (arguments + temporaries)"
  except Exception:  # not every backend implements it
    return None, "unavailable"


def time_bertjax(spec: BenchSpec) -> dict[str, Any]:
  """Compile (timed, ahead of time) and run the bertjax train step; the step's numbers."""
  cfg = spec.model_config()
  batch = {k: jnp.asarray(v) for k, v in bench_peers.synthetic_batch(
      spec.batch_size, spec.seq_len, spec.masked(), spec.vocab_size, spec.seed).items()}
  state, step = standin_step(cfg, batch, spec.seed)
  t0 = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  box = [state]

  def one():
    box[0], metrics = compiled(box[0], batch)
    return metrics["loss"]

  t = bench_peers.time_steps(one, jax.block_until_ready, spec.warmup, spec.steps)
  mem, mem_source = _memory_bytes(compiled, jax.devices()[0])
  return {**t, "compile_s": compile_s, "first_step_s": t["compile_s"],
          "peak_memory_bytes": mem, "memory_source": mem_source,
          "params": model_lib.count_params(box[0]["params"])}


def run(spec: BenchSpec, compare: tuple[str, ...] = (), repo_root: str | None = None
        ) -> dict[str, Any]:
  """Benchmark bertjax (and the `compare` peers) on one spec; one flat JSON-able dict."""
  unknown = [p for p in compare if p not in bench_peers.PEERS]
  if unknown:
    raise ValueError(f"bench: unknown peer(s) {unknown} in --compare; valid: "
                     f"{', '.join(bench_peers.PEERS)}")
  cfg = spec.model_config()
  devices = jax.devices()[:1]
  peak, peak_source = device_peak(devices, spec)
  flops = model_flops_per_step(cfg, spec.batch_size, spec.seq_len, spec.masked())
  res = time_bertjax(spec)
  out = {"name": "bertjax", **dataclasses.asdict(spec), "num_masked": spec.masked(),
         "device": f"{devices[0].device_kind} x {len(devices)}", "platform": devices[0].platform,
         "threads": bench_peers.num_cores(), "jax": jax.__version__,
         "xla_flags": os.environ.get("XLA_FLAGS", ""), "peak_flops": peak,
         "peak_source": peak_source, "model_flops_per_step": flops, **res}
  _add_rates(out, spec, flops, peak)
  peers = {}
  for name in compare:
    peers[name] = _run_peer(name, spec, cfg, repo_root)
    if peers[name]["status"] == "ok":
      _add_rates(peers[name], spec, flops, peak)
      out[f"ratio_{name}"] = out["tokens_per_sec"] / peers[name]["tokens_per_sec"]
  out["peers"] = peers
  return out


def _add_rates(r: dict, spec: BenchSpec, flops: float, peak: float) -> None:
  r["seq_per_sec"] = spec.batch_size * 1e3 / r["step_ms"]
  r["tokens_per_sec"] = r["seq_per_sec"] * spec.seq_len
  r["model_flops_per_sec"] = flops * 1e3 / r["step_ms"]
  r["mfu"] = r["model_flops_per_sec"] / peak


def _run_peer(name: str, spec: BenchSpec, cfg: model_lib.BertConfig,
              repo_root: str | None) -> dict:
  if spec.dtype != "float32":
    return {"name": name, "status": "unavailable",
            "reason": f"peers run float32 only (asked for {spec.dtype})"}
  pspec = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "num_layers": cfg.num_layers, "num_heads": cfg.num_heads,
           "intermediate_size": cfg.intermediate_size,
           "max_position_embeddings": cfg.max_position_embeddings,
           "hidden_dropout_rate": cfg.hidden_dropout_rate,
           "attention_dropout_rate": cfg.attention_dropout_rate,
           "batch_size": spec.batch_size, "seq_len": spec.seq_len, "num_masked": spec.masked(),
           "warmup": spec.warmup, "steps": spec.steps, "threads": bench_peers.num_cores(),
           "xla_flags": os.environ.get("XLA_FLAGS", "")}
  if name == "hf-torch":
    return bench_peers.run_torch(pspec, compiled=False)
  if name == "hf-torch-compile":
    return bench_peers.run_torch(pspec, compiled=True)
  if name == "hf-flax":
    root = repo_root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return bench_peers.run_flax_subprocess(pspec, root)
  raise ValueError(f"bench: unknown peer {name!r}; valid: {', '.join(bench_peers.PEERS)}")


def format_report(r: dict[str, Any]) -> str:
  """The human-readable table `bertjax bench` prints."""
  mem = r.get("peak_memory_bytes")
  lines = [
      f"bertjax bench: {r['preset']} (vocab {r['vocab_size']}), batch {r['batch_size']} x seq "
      f"{r['seq_len']}, P={r['num_masked']}, {r['dtype']}, remat={r['remat']}, "
      f"attention dropout {r['attention_dropout']}",
      f"device {r['device']} ({r['threads']} cores), jax {r['jax']}",
      f"peak {r['peak_flops'] / 1e12:.3f} TFLOP/s ({r['peak_source']})",
      f"model FLOPs/step {r['model_flops_per_step'] / 1e9:.2f} G; compile {r['compile_s']:.1f} s;"
      f" peak memory {'n/a' if mem is None else f'{mem / 2**20:.0f} MiB'} ({r['memory_source']})",
      "",
      f"{'':18}{'ms/step':>10}{'(best)':>10}{'seq/s':>9}{'tokens/s':>10}{'MFU':>7}{'ratio':>8}",
  ]
  rows = [r] + [p for p in r["peers"].values()]
  for row in rows:
    if row.get("status", "ok") != "ok":
      lines.append(f"{row['name']:18}{row['status']}: {row['reason']}")
      continue
    ratio = r["tokens_per_sec"] / row["tokens_per_sec"]
    lines.append(f"{row['name']:18}{row['step_ms']:10.1f}{row['step_ms_min']:10.1f}"
                 f"{row['seq_per_sec']:9.2f}{row['tokens_per_sec']:10.0f}{row['mfu']:7.3f}"
                 f"{ratio:7.2f}x")
  lines.append(f"(median of {r['steps']} timed steps after {r['warmup']} warm-up; ratio = "
               "bertjax tokens/s / row tokens/s)")
  return "\n".join(lines)
