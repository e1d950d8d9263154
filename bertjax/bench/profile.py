"""Where a compiled train step's time goes, by model op: `bertjax bench --profile DIR`.

`trace_steps` traces warm steps with `jax.profiler` (TensorBoard's profile plugin or Perfetto
read the trace) and maps every XLA op in it back to the model op it came from (the `op_name`
metadata of the compiled HLO, layer numbers folded). It attributes *wall* time: while k ops
run at once, each gets 1/k of that interval, so concurrent ops are not double-counted. Time
when no traced op runs is `untraced`: on CPU that is mostly matmuls that XLA's runtime (YNNPACK
or Eigen) runs asynchronously, whose trace events end when they are dispatched, plus runtime
overhead.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import tempfile
import time
from typing import Any

import jax
import numpy as np

from bertjax.runtime import fs


def trace_steps(
    compiled, state, batch, out_dir: str, steps: int = 2, warmup: int = 2
) -> dict[str, Any]:
  """Run `warmup` untraced and `steps` traced calls of `compiled(state, batch)`; the trace
  goes to `out_dir` and the breakdown by model op comes back (see the module docstring). An
  `out_dir` on an object store (gs://) gets the trace when it is complete: it is written to a
  local temporary directory first."""
  for _ in range(warmup):  # warm: allocations and thread pools as in a long run
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
  remote = not fs.is_local(out_dir)
  with (
      tempfile.TemporaryDirectory(prefix="bertjax-profile-")
      if remote
      else contextlib.nullcontext(str(fs.path(out_dir)))
  ) as local_dir:
    fs.path(local_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with jax.profiler.trace(local_dir, create_perfetto_trace=True):
      for _ in range(steps):
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    # The newest: by mtime (whole seconds in epath), then by the run's timestamped directory.
    traces = sorted(
        (
            fs.path(root) / name
            for root, _, names in fs.path(local_dir).walk()
            for name in names
            if name.endswith("perfetto_trace.json.gz")
        ),
        key=lambda p: (p.stat().mtime, str(p)),
    )
    if not traces:
      raise RuntimeError(f"jax.profiler wrote no Perfetto trace under {out_dir}")
    with traces[-1].open("rb") as raw, gzip.open(raw) as f:
      events = json.load(f)
    trace = str(traces[-1])
    if remote:
      fs.upload_tree(local_dir, out_dir)
      trace = str(fs.path(out_dir) / traces[-1].relative_to(local_dir))
  events = events["traceEvents"] if isinstance(events, dict) else events
  by_op, untraced, span = _attribute(events, _op_names(compiled.as_text()))
  rows = sorted(((k, v / steps / 1e3) for k, v in by_op.items()), key=lambda kv: -kv[1])
  return {
      "trace": trace,
      "steps": steps,
      "wall_ms_per_step": wall_ms,
      "span_ms_per_step": span / steps / 1e3,
      "untraced_ms_per_step": untraced / steps / 1e3,
      "ops": [{"op": k, "ms_per_step": v} for k, v in rows],
  }


def _op_names(hlo: str) -> dict[str, str]:
  """XLA instruction name -> the model op it came from, layer numbers folded (`layer_N`)."""
  op_names = {}
  for line in hlo.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]+)\"", line)
    if m:
      name = re.sub(r"layer_\d+", "layer_N", m.group(2))
      name = re.sub(r"^jit\([^)]*\)/", "", name)
      op_names[m.group(1)] = re.sub(r"\[.*", "", name)  # parameter paths: drop the index
  return op_names


def _attribute(events: list, op_names: dict[str, str]) -> tuple[dict[str, float], float, float]:
  """(µs per model op, µs with no traced op running, µs from the first op to the last): while
  k ops run at once, each gets 1/k of the interval."""
  ops = [e for e in events if e.get("ph") == "X" and e.get("name") in op_names]
  edges = sorted(
      [(e["ts"], 1, i) for i, e in enumerate(ops)]
      + [(e["ts"] + e["dur"], -1, i) for i, e in enumerate(ops)]
  )
  share = np.zeros(len(ops))
  active: set[int] = set()
  untraced, last = 0.0, None
  for ts, kind, i in edges:
    if last is not None and ts > last:
      if active:
        for j in active:
          share[j] += (ts - last) / len(active)
      else:
        untraced += ts - last
    last = ts
    (active.add if kind == 1 else active.discard)(i)
  by_op: dict[str, float] = {}
  for i, e in enumerate(ops):
    key = op_names[e["name"]]
    by_op[key] = by_op.get(key, 0.0) + share[i]
  span = (edges[-1][0] - edges[0][0]) if edges else 0.0
  return by_op, untraced, span


def format_profile(p: dict[str, Any], top: int = 30) -> str:
  """The table `bertjax bench --profile` prints: the `top` model ops, the rest, untraced."""
  span = p["span_ms_per_step"] or 1.0
  lines = [
      f"profile: {p['steps']} steps, {p['span_ms_per_step']:.0f} ms/step from the first "
      f"op to the last (tracing adds overhead around the steps); trace {p['trace']}",
      f"{'ms/step':>9} {'share':>6}  model op (wall time; concurrent ops share it)",
  ]
  for row in p["ops"][:top]:
    lines.append(f"{row['ms_per_step']:9.1f} {100 * row['ms_per_step'] / span:5.1f}%  {row['op']}")
  rest = sum(r["ms_per_step"] for r in p["ops"][top:])
  lines.append(f"{rest:9.1f} {100 * rest / span:5.1f}%  ({max(0, len(p['ops']) - top)} more ops)")
  lines.append(
      f"{p['untraced_ms_per_step']:9.1f} {100 * p['untraced_ms_per_step'] / span:5.1f}%"
      "  untraced (on CPU: matmuls run asynchronously, runtime overhead)"
  )
  return "\n".join(lines)
