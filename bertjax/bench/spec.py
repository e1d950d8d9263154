"""The two ends of `bertjax bench`'s pretraining benchmark (pretraining.py times it): what it
times (`BenchSpec`: the model, the batch, how long) and the table it prints (`format_report`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bertjax import errors
from bertjax import model as model_lib
from bertjax.bench import peers as bench_peers

MAX_POSITIONS = 512  # BERT's position embeddings


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
  # A prepared directory: batches from its stream (a real length distribution) instead of
  # synthetic full rows; real tokens/s then counts the tokens that are not padding.
  data: str = ""
  packing: bool = False  # with `data`: several whole examples per row (bertjax.data.packing)
  # with `data`: both steps, unpacked and packed, timed in turns in this one run
  compare_packing: bool = False

  def __post_init__(self):
    for field, low, why in (
        ("batch_size", 1, ""),
        ("seq_len", 2, " ([CLS] and a token)"),
        ("vocab_size", bench_peers.FIRST_TOKEN_ID + 1, " (ids 0-4 are the special tokens)"),
        ("warmup", 1, " (the first step compiles)"),
        ("steps", 1, ""),
        ("seed", 0, ""),
    ):
      if getattr(self, field) < low:
        raise errors.ConfigError(f"BenchSpec.{field}={getattr(self, field)} must be >= {low}{why}")
    if self.seq_len > MAX_POSITIONS:
      raise errors.ConfigError(
          f"BenchSpec.seq_len={self.seq_len} exceeds BERT's {MAX_POSITIONS} positions — use at "
          f"most {MAX_POSITIONS}"
      )
    if not 0 <= self.num_masked < self.seq_len:
      raise errors.ConfigError(
          f"BenchSpec.num_masked={self.num_masked} must be below "
          f"BenchSpec.seq_len={self.seq_len} (0: 15% of the sequence)"
      )
    if not 0 <= self.attention_dropout < 1:
      raise errors.ConfigError(
          f"BenchSpec.attention_dropout={self.attention_dropout} must be in [0, 1)"
      )
    if not 0 <= self.peak_flops < math.inf:
      raise errors.ConfigError(
          f"BenchSpec.peak_flops={self.peak_flops} must be a FLOP/s figure > 0, or 0 to measure it"
      )
    for field in ("packing", "compare_packing"):
      if getattr(self, field) and not self.data:
        raise errors.ConfigError(
            f"BenchSpec.{field} needs BenchSpec.data: a prepared directory to pack examples from"
        )
    if self.packing and self.compare_packing:
      raise errors.ConfigError(
          "BenchSpec.compare_packing times the packed and the unpacked step both — drop "
          "BenchSpec.packing"
      )
    if self.preset not in model_lib.PRESETS:
      raise errors.ConfigError(
          f"BenchSpec.preset={self.preset!r} is not a model preset — valid presets: "
          f"{', '.join(model_lib.PRESETS)}"
      )
    try:
      self.model_config()
    except ValueError as e:  # BertConfig's own checks (dtype, remat) of this spec's values
      raise errors.ConfigError("BenchSpec." + str(e).removeprefix("BertConfig: ")) from None

  def model_config(self) -> model_lib.BertConfig:
    return model_lib.from_preset(
        self.preset,
        vocab_size=self.vocab_size,
        dtype=self.dtype,
        remat=self.remat,
        scan_layers=self.scan_layers,
        attention_dropout_rate=self.attention_dropout,
    )

  def masked(self) -> int:
    return self.num_masked or bench_peers.max_predictions(self.seq_len)


def format_report(r: dict[str, Any]) -> str:
  """The human-readable table `bertjax bench` prints."""
  mem = r.get("peak_memory_bytes")
  lines = [
      f"bertjax bench: {r['preset']} (vocab {r['vocab_size']}), batch {r['batch_size']} x seq "
      f"{r['seq_len']}, P={r['num_masked']}, {r['dtype']}, remat={r['remat']}, "
      f"attention dropout {r['attention_dropout']}, attention in {r.get('attention_chunks', 1)} "
      "batch slice(s)",
      f"device {r['device']} ({r['threads']} cores), jax {r['jax']}"
      + (f"; GLIBC_TUNABLES={r['glibc_tunables']}" if r.get("glibc_tunables") else ""),
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
    lines.append(
        f"{row['name']:18}{row['step_ms']:10.1f}{row['step_ms_min']:10.1f}"
        f"{row['seq_per_sec']:9.2f}{row['tokens_per_sec']:10.0f}{row['mfu']:7.3f}"
        f"{ratio:7.2f}x"
    )
  if "packed" in r:
    p = r["packed"]
    lines.append(
        f"{'bertjax packed':18}{p['step_ms']:10.1f}{p['step_ms_min']:10.1f}"
        f"{p['seq_per_sec']:9.2f}{p['tokens_per_sec']:10.0f}{p['mfu']:7.3f}"
        f"{r['tokens_per_sec'] / p['tokens_per_sec']:7.2f}x"
    )
  for row, packed in ((r, r["packing"]), (r.get("packed"), True)):
    if row and "real_tokens_per_sec" in row:
      lines.append(
          f"data {r['data']}{' packed' if packed else ''}: {row['real_token_fraction']:.1%} "
          f"of the slots real, {row['examples_per_row']:.2f} examples per row, CPU "
          f"{row['cpu_ms']:.1f} ms/step -> {row['real_tokens_per_sec']:.0f} real tokens/s, "
          f"{row['examples_per_sec']:.2f} examples/s"
      )
  if "packed" in r:
    lines.append(
        f"packing: real tokens/s packed / unpacked {r['packing_ratio']:.2f}x (CPU time "
        f"{r['packing_ratio_cpu']:.2f}x, median of the {r['steps']} rounds' ratios "
        f"{r['packing_ratio_rounds']:.2f}x); the two steps timed in turns in this run"
    )
  lines.append(
      f"(median of {r['steps']} timed steps after {r['warmup']} warm-up; ratio = "
      "bertjax tokens/s / row tokens/s)"
  )
  for row in r["peers"].values():  # what a peer computes that bertjax does not, and back
    if row.get("differences"):
      lines.append(
          f"{row['name']} vs bertjax ({row['version']}; first step, compile included, "
          f"{row['compile_s']:.1f} s; import, not timed, {row['import_s']:.1f} s):"
      )
      lines += [f"  - {d}" for d in row["differences"]]
  return "\n".join(lines)
