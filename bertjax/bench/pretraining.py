"""How fast one BERT config trains here: tokens/s, model FLOPs, MFU, and the peers (Hugging
Face's and keras-hub's).

`run(spec)` times `bertjax.training.train`'s step (forward, MLM + NSP loss, backward, clipping, AdamW
update: exactly what `bertjax pretrain` runs) on one synthetic batch after warm-up, and returns
one flat dict (what `bertjax bench --json` prints).

Model FLOPs are `bertjax.training.flops.pretraining_flops_per_step`: 6 x encoder parameters x tokens,
+ 12 x layers x H x L per token for attention, + the MLM head on the P gathered masked rows
only, + pooler and NSP on [CLS]. Nothing recomputed (remat) or wasted (a full-sequence MLM
head, as the peers run) counts, so MFU compares implementations of the same model fairly.

MFU = model FLOPs per second / peak FLOP/s of the devices used. On CPU the peak is measured in
the same run: the best dense matmul FLOP/s that JAX reaches on this machine, all cores
(`measure_cpu_peak`, before and after the timed steps, the best of the two; fake host devices
share those cores, so it is not multiplied). On GPU/TPU it is the published dense bf16 peak per
chip (`bertjax.training.flops.PEAK_FLOPS`) x chips.

Shape letters: B batch, L sequence length, H hidden, P masked positions, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors, locations
from bertjax import model as model_lib
from bertjax.bench import peer_runs, peers as bench_peers, profile
from bertjax.bench.spec import BenchSpec
from bertjax.model import ops
from bertjax.training import flops as flops_lib, sharding, train

CPU_PEAK_SIZES = (512, 1024, 2048)  # square matmuls; the best of these is the CPU's peak


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
    return spec.peak_flops, "given"
  dev = devices[0]
  if dev.platform == "cpu":
    dtypes = sorted({"float32", spec.dtype})
    peak = max(measure_cpu_peak(d) for d in dtypes)
    cores = bench_peers.num_cores()
    return peak, f"measured: best jitted {'/'.join(dtypes)} matmul on {cores} cores"
  per_device = flops_lib.peak_flops_per_device(dev)
  if per_device:
    return per_device * len(devices), (
        f"published dense bf16 peak of {dev.device_kind} x " f"{len(devices)}"
    )
  raise errors.ConfigError(
      f"no published peak for device kind {dev.device_kind!r} — set "
      f"BenchSpec.peak_flops=FLOPS (the dense bf16 peak of all {len(devices)} devices)"
  )


# ------------------------------------------------------------------------------- train step

_PRETRAIN_CONFIG = str(locations.REPO_ROOT / "experiments" / "pretrain.py")


def train_config(spec: BenchSpec, recipe: str = ""):
  """experiments/pretrain.py's config for `spec.preset` (or for `recipe`, with the model of
  `spec.preset`), with the benchmark's shape and numerics.

  The optimizer, clipping, loss and step are exactly those of `bertjax pretrain`; only what the
  benchmark varies is overridden (a preset's paper defaults such as bf16 and scan_layers too,
  so every field means what it says).
  """
  if not os.path.exists(_PRETRAIN_CONFIG):
    raise errors.InputNotFoundError(
        f"{_PRETRAIN_CONFIG} not found — it ships in the source tree, not the wheel: run "
        "from a git checkout"
    )
  import importlib.util  # a fixed file path, not a module chosen by a string

  mod_spec = importlib.util.spec_from_file_location("bertjax_pretrain_config", _PRETRAIN_CONFIG)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  c = mod.get_config(recipe or spec.preset)
  c.model.preset = spec.preset
  c.seed = spec.seed
  c.model.vocab_size = spec.vocab_size
  c.model.dtype = spec.dtype
  c.model.remat = spec.remat
  c.model.scan_layers = spec.scan_layers
  c.model.attention_dropout_rate = spec.attention_dropout
  c.data.source = "synthetic"
  c.data.seq_len = spec.seq_len
  c.data.max_predictions_per_seq = spec.masked()
  c.train.batch_size = spec.batch_size
  c.train.microbatches = 1
  c.phase2.fraction = 0.0  # one phase: the schedule must not switch shapes mid-benchmark
  return c


def _memory_bytes(compiled, device: jax.Device) -> tuple[int | None, str]:
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  try:
    mem = compiled.memory_analysis()
    return int(mem.peak_memory_in_bytes), "XLA compiled peak (arguments + temporaries)"
  except Exception:  # not every backend implements it
    return None, "unavailable"


def _compiled_step(spec: BenchSpec, mesh: jax.sharding.Mesh | None):
  """`bertjax.training.train`'s step compiled ahead of time for one synthetic batch on the mesh."""
  mesh = mesh or sharding.make_mesh(data=-1)
  setup = train.setup(train_config(spec), mesh)
  state = setup.init_state(spec.seed)
  if spec.data:
    host_batch, shares = data_batch(spec)
  else:
    host_batch, shares = (
        bench_peers.synthetic_batch(
            spec.batch_size, spec.seq_len, spec.masked(), spec.vocab_size, spec.seed
        ),
        {},
    )
  batch = {k: jax.device_put(v, setup.batch_sharding) for k, v in host_batch.items()}
  t0 = time.perf_counter()
  compiled = setup.train_step.lower(state, batch).compile()
  return compiled, state, batch, mesh, time.perf_counter() - t0, shares


DATA_BATCHES = 32  # batches of the prepared stream whose real-token share is averaged


def data_batch(spec: BenchSpec) -> tuple[dict, dict]:
  """The first of `DATA_BATCHES` batches of `spec.data`'s stream (the step's time does not
  depend on the values, only the shapes) and the mean real-token share and examples per row
  over all of them."""
  from bertjax.data import packing as packing_lib, pretraining

  cfg = pretraining.InputConfig(
      source="prepared",
      path=spec.data,
      seq_len=spec.seq_len,
      max_predictions_per_seq=spec.masked(),
      vocab_size=spec.vocab_size,
      seed=spec.seed,
      packing=spec.packing,
      reader="python",
  )
  stream = pretraining.make_stream(
      cfg, global_batch_size=spec.batch_size, process_index=0, process_count=1
  )
  batches = [next(stream) for _ in range(DATA_BATCHES)]
  real = np.mean([packing_lib.real_token_fraction(b["attention_mask"]) for b in batches])
  examples = np.mean(
      [b["nsp_weights"].sum() / spec.batch_size if "nsp_weights" in b else 1.0 for b in batches]
  )
  return batches[0], {"real_token_fraction": float(real), "examples_per_row": float(examples)}


def time_bertjax(
    spec: BenchSpec, mesh: jax.sharding.Mesh | None = None, profile_dir: str = ""
) -> dict[str, Any]:
  """Compile (timed, ahead of time) and run `bertjax.training.train`'s step on one synthetic batch.

  With `profile_dir`, the same compiled step is then traced (`profile_bertjax`) and the
  breakdown returned under "profile".
  """
  compiled, state, batch, mesh, compile_s, shares = _compiled_step(spec, mesh)
  box = [state]

  def one():
    box[0], metrics = compiled(box[0], batch)
    return metrics["loss"]

  t = bench_peers.time_steps(one, jax.block_until_ready, spec.warmup, spec.steps)
  mem, mem_source = _memory_bytes(compiled, mesh.devices.flat[0])
  out = {
      **t,
      "compile_s": compile_s,
      "first_step_s": t["compile_s"],
      "peak_memory_bytes": mem,
      "memory_source": mem_source,
      "params": model_lib.count_params(box[0].params),
      "devices": mesh.devices.size,
      **shares,
  }
  if profile_dir:
    _progress(f"profiling into {profile_dir} ...")
    # the step has just run warmup + steps times: warm already
    out["profile"] = profile.trace_steps(compiled, box[0], batch, profile_dir, warmup=0)
  return out


PACKING_VARIANTS = ("unpacked", "packed")


def time_packing_pair(
    spec: BenchSpec, mesh: jax.sharding.Mesh | None = None
) -> tuple[dict[str, dict[str, Any]], list[float]]:
  """The unpacked and the packed step on `spec.data`, both compiled, then timed in turns.

  On a machine shared with other jobs a step's time can double for seconds at a time (see
  docs/performance.md), so two separate runs cannot say which is faster. Here each round runs
  one step of each, the order alternating round by round, so a spell of load falls on both
  alike. Returns ({variant: `time_bertjax`-like figures}, the per-round ratios of real tokens/s
  packed / unpacked).
  """
  runs, rows = {}, {}
  for name in PACKING_VARIANTS:
    one = dataclasses.replace(spec, packing=name == "packed", compare_packing=False)
    compiled, state, batch, mesh, compile_s, shares = _compiled_step(one, mesh)
    runs[name] = _stepper(compiled, state, batch)
    mem, mem_source = _memory_bytes(compiled, mesh.devices.flat[0])
    rows[name] = {
        "compile_s": compile_s,
        "peak_memory_bytes": mem,
        "memory_source": mem_source,
        "num_masked": int(batch["masked_positions"].shape[1]),
        "devices": mesh.devices.size,
        **shares,
    }
  wall = _interleaved(runs, spec.warmup + spec.steps)
  for name, row in rows.items():
    times, cpu_times = (np.array(t[spec.warmup :]) for t in wall[name])
    row.update(
        first_step_s=wall[name][0][0],
        step_ms=1e3 * float(np.median(times)),
        step_ms_min=1e3 * float(times.min()),
        steps_timed=len(times),
        cpu_ms=1e3 * float(np.median(cpu_times)),
        round_ms=(1e3 * times).tolist(),
    )
  u, p = rows["unpacked"], rows["packed"]
  per_round = [
      (p["real_token_fraction"] / tp) / (u["real_token_fraction"] / tu)
      for tu, tp in zip(u["round_ms"], p["round_ms"])
  ]
  return rows, per_round


def _stepper(compiled, state, batch):
  """One train step on `batch` per call, the state carried from call to call."""
  box = [state]

  def one():
    box[0], metrics = compiled(box[0], batch)
    return metrics["loss"]

  return one


def _interleaved(steps: dict[str, Any], rounds: int) -> dict[str, tuple[list, list]]:
  """{name: (wall s, CPU s) of each round}: every step once a round, synced, the order of
  the names reversed on every other round."""
  out = {name: ([], []) for name in steps}
  names = list(steps)
  for r in range(rounds):
    for name in names if r % 2 == 0 else names[::-1]:
      t0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(steps[name]())
      out[name][0].append(time.perf_counter() - t0)
      out[name][1].append(time.process_time() - c0)
  return out


# ----------------------------------------------------------------------------------- profile


def profile_bertjax(
    spec: BenchSpec, out_dir: str, steps: int = 2, mesh: jax.sharding.Mesh | None = None
) -> dict[str, Any]:
  """Trace `steps` warm train steps with `jax.profiler` into `out_dir` and break the time down
  by model op (`bertjax.bench.profile`)."""
  compiled, state, batch, _, _, _ = _compiled_step(spec, mesh)
  return profile.trace_steps(compiled, state, batch, out_dir, steps)


# --------------------------------------------------------------------------------------- run


def check_peers(compare: tuple[str, ...]) -> None:
  """`ConfigError` naming the peers of `compare` that `bench_peers.PEERS` does not have."""
  unknown = [p for p in compare if p not in bench_peers.PEERS]
  if unknown:
    raise errors.ConfigError(
        f"compare={','.join(unknown)}: unknown peer — valid: {', '.join(bench_peers.PEERS)}"
    )


def run(
    spec: BenchSpec,
    compare: tuple[str, ...] = (),
    repo_root: str | None = None,
    profile_dir: str = "",
) -> dict[str, Any]:
  """Benchmark bertjax (and the `compare` peers) on one spec; one flat JSON-able dict.

  With `profile_dir`, bertjax's timed step is also traced there (`profile_bertjax`) and the
  breakdown is under "profile".
  """
  check_peers(compare)
  cfg = spec.model_config()
  devices = jax.devices()
  peak, peak_source = device_peak(devices, spec)
  flops = flops_lib.pretraining_flops_per_step(cfg, spec.batch_size, spec.seq_len, spec.masked())
  _progress(
      f"bertjax: {spec.preset}, batch {spec.batch_size} x {spec.seq_len}, "
      f"peak {peak / 1e12:.3f} TFLOP/s"
  )
  if spec.compare_packing:
    if profile_dir:
      raise errors.ConfigError("profile_dir traces one step: run it without compare_packing")
    rows, per_round = time_packing_pair(spec)
    res = rows["unpacked"]
  else:
    res = time_bertjax(spec, profile_dir=profile_dir)
  peers = {}
  for name in compare:
    _progress(f"{name} ...")
    peers[name] = _run_peer(name, spec, cfg, repo_root)
  if peak_source.startswith("measured"):
    # On a shared machine the matmul peak can drop to half for seconds at a time (measured here:
    # 110 instead of ~200 GFLOP/s on 2 vCPUs); a peak measured in such a spell would inflate
    # every MFU. So it is measured again after the timed steps and the peers; the best is kept.
    again, _ = device_peak(devices, spec)
    if again > peak:
      _progress(f"peak measured again after the steps: {again / 1e12:.3f} TFLOP/s")
    peak = max(peak, again)
    peak_source += " (best of before and after the timed steps)"
  out = {
      "name": "bertjax",
      **dataclasses.asdict(spec),
      "num_masked": spec.masked(),
      "device": f"{devices[0].device_kind} x {len(devices)}",
      "platform": devices[0].platform,
      "threads": bench_peers.num_cores(),
      "jax": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
      "peak_flops": peak,
      "peak_source": peak_source,
      "model_flops_per_step": flops,
      "attention_chunks": ops.attention_chunks(0, spec.batch_size),
      **res,
  }
  _add_rates(out, spec, flops, peak)
  if spec.compare_packing:
    _add_packed(out, rows["packed"], per_round, cfg, spec, peak)
  for name, peer in peers.items():
    if peer["status"] == "ok":
      _add_rates(peer, spec, flops, peak)
      out[f"ratio_{name}"] = out["tokens_per_sec"] / peer["tokens_per_sec"]
  out["peers"] = peers
  return out


def _progress(msg: str) -> None:
  print(f"bench: {msg}", file=sys.stderr, flush=True)  # stdout stays one JSON object


def _add_rates(r: dict, spec: BenchSpec, flops: float, peak: float) -> None:
  r["seq_per_sec"] = spec.batch_size * 1e3 / r["step_ms"]
  r["tokens_per_sec"] = r["seq_per_sec"] * spec.seq_len
  r["model_flops_per_sec"] = flops * 1e3 / r["step_ms"]
  r["mfu"] = r["model_flops_per_sec"] / peak
  if "real_token_fraction" in r:  # batches of a prepared stream: what the padding leaves
    r["real_tokens_per_sec"] = r["tokens_per_sec"] * r["real_token_fraction"]
    r["examples_per_sec"] = r["seq_per_sec"] * r["examples_per_row"]


def _add_packed(
    out: dict, packed: dict, per_round: list[float], cfg, spec: BenchSpec, peak: float
) -> None:
  """The packed row under out["packed"] and how it compares: real tokens/s packed / unpacked
  from the medians of wall time (`packing_ratio`), of CPU time (`packing_ratio_cpu`, steadier
  when other jobs share the cores) and the median of the per-round ratios."""
  flops = flops_lib.pretraining_flops_per_step(
      cfg, spec.batch_size, spec.seq_len, packed["num_masked"]
  )
  packed["model_flops_per_step"] = flops
  _add_rates(packed, spec, flops, peak)
  out["packed"] = packed
  out["packing_ratio"] = packed["real_tokens_per_sec"] / out["real_tokens_per_sec"]
  out["packing_ratio_cpu"] = (packed["real_token_fraction"] / packed["cpu_ms"]) / (
      out["real_token_fraction"] / out["cpu_ms"]
  )
  out["packing_ratio_rounds"] = float(np.median(per_round))


def _run_peer(name: str, spec: BenchSpec, cfg: model_lib.BertConfig, repo_root: str | None) -> dict:
  if spec.dtype != "float32":
    return {
        "name": name,
        "status": "unavailable",
        "reason": f"peers run float32 only (asked for {spec.dtype})",
    }
  pspec = {
      **bench_peers.model_spec(cfg),
      "hidden_dropout_rate": cfg.hidden_dropout_rate,
      "attention_dropout_rate": cfg.attention_dropout_rate,
      "batch_size": spec.batch_size,
      "seq_len": spec.seq_len,
      "num_masked": spec.masked(),
      "warmup": spec.warmup,
      "steps": spec.steps,
      "threads": bench_peers.num_cores(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }
  if name == "hf-torch":
    return peer_runs.run_torch(pspec, compiled=False)
  if name == "hf-torch-compile":
    return peer_runs.run_torch(pspec, compiled=True)
  if name == "hf-flax":
    root = repo_root or str(locations.REPO_ROOT)
    return peer_runs.run_flax_subprocess(pspec, root)
  if name == "keras-hub":
    t = train_config(spec).train  # bertjax's optimizer, which keras AdamW is given
    pspec.update(
        learning_rate=t.learning_rate, weight_decay=t.weight_decay, eps=t.eps, clip_norm=t.clip_norm
    )
    return peer_runs.run_keras_subprocess(pspec)
  check_peers((name,))  # an unknown name is the caller's mistake
  raise AssertionError(f"peer {name} is in bench_peers.PEERS but has no runner here")
