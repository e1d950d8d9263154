"""Run output: a progress line, WORKDIR/metrics.jsonl and TensorBoard event files.

Only process 0 writes; the others get a writer whose methods do nothing. TensorBoard uses
`tf.summary` when TensorFlow imports, and is skipped (with one notice) when it does not, so
training still runs where only JAX is installed.

metrics.jsonl in a local workdir is appended to, one flushed line per record. An object store
(gs://) cannot append to an object, so there the writer keeps the file's lines and rewrites the
whole object: at once for the first record, then at most every `REMOTE_FLUSH_S` seconds, and
whenever `flush()` is called (the loop calls it as it saves a checkpoint, so the records of the
steps a checkpoint holds are stored before it) and at `close()`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Mapping

from etils import epath

from bertjax.runtime import fs

REMOTE_FLUSH_S = 30.0  # an object-store metrics.jsonl is rewritten at most this often

# Columns of the progress line: (metrics key, label, format).
_PROGRESS = (
    ("loss", "loss", ".4f"),
    ("mlm_accuracy", "mlm_acc", ".3f"),
    ("nsp_accuracy", "nsp_acc", ".3f"),
    ("disc_accuracy_replaced", "disc_acc_replaced", ".3f"),  # ELECTRA
    ("disc_accuracy_original", "disc_acc_original", ".3f"),
    ("contrastive_accuracy", "top1", ".3f"),  # contrastive: in-batch top-1, the positive's rank
    ("contrastive_mean_rank", "rank", ".2f"),
    ("rows_held_back", "held_back", ".0f"),  # pairs sharing a text with their batch (so far)
    ("learning_rate", "lr", ".2e"),
)


def format_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(step: int, total: int, m: Mapping[str, float]) -> str:
  """`step 100/2000 | loss 7.1 | mlm_acc ... | 310 seq/s | 40k tok/s | 96% real | MFU 12.3% |
  ETA 3m10s`: seq/s counts examples (a packed row holds several), tok/s real tokens (padding
  left out), "real" is the share of the batch's token slots that are not padding."""
  parts = [f"step {step}/{total}"]
  parts += [f"{label} {m[k]:{fmt}}" for k, label, fmt in _PROGRESS if k in m]
  if "seq_per_sec" in m:
    parts.append(f"{m['seq_per_sec']:.1f} seq/s")
    parts.append(f"{m['tokens_per_sec'] / 1e3:.1f}k tok/s")
  if "real_token_fraction" in m:
    parts.append(f"{100 * m['real_token_fraction']:.0f}% real")
  mfu = m.get("mfu")
  parts.append(f"MFU {100 * mfu:.1f}%" if mfu is not None else "MFU -")
  if "eta_sec" in m:
    parts.append(f"ETA {format_duration(m['eta_sec'])}")
  return " | ".join(parts)


class MetricsWriter:
  """Writes scalars to metrics.jsonl and TensorBoard (WORKDIR/tensorboard) on process 0."""

  def __init__(
      self,
      workdir: str,
      enabled: bool = True,
      tensorboard: bool = True,
      keep_through: int | None = None,
  ):
    """`keep_through`: drop the records of metrics.jsonl after this step first (a resume from
    that step's checkpoint writes them again; 0 = a fresh run, None = keep everything)."""
    self.enabled = enabled
    self.workdir = fs.path(workdir)
    self._tb = None
    self._start = time.time()
    if not enabled:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    path = self.workdir / "metrics.jsonl"
    if keep_through is not None and path.exists():
      _truncate_after(path, keep_through)
    self._path = path
    self._jsonl = None
    self._lines: list[str] = []  # object stores: the whole file, rewritten on flush
    self._unsaved, self._saved_at = False, 0.0
    if fs.is_local(path):
      self._jsonl = path.open("a")
    elif path.exists():
      self._lines = [line + "\n" for line in path.read_text().splitlines() if line]
    if tensorboard:
      try:
        import tensorflow as tf  # only when TensorBoard is on; the loop runs without TF

        self._tf = tf
        self._tb = tf.summary.create_file_writer(str(self.workdir / "tensorboard"))
      except ImportError:
        print(
            "metrics: TensorFlow not installed, no TensorBoard logs "
            "(metrics.jsonl is still written)",
            file=sys.stderr,
        )

  def write(self, step: int, metrics: Mapping[str, float | Mapping | None]) -> None:
    """One JSON line {"step": ..., **metrics} and one TensorBoard scalar per number (a
    mapping, such as `time_to_target`, goes to the JSON line as it is)."""
    if not self.enabled:
      return
    row = {"step": int(step), **{k: _json_value(v) for k, v in metrics.items()}}
    # JSON has no inf/nan: such values are written as null and named under "nonfinite".
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    for k in bad:
      row[k] = None
    if bad:
      row["nonfinite"] = bad
    row["elapsed_sec"] = round(time.time() - self._start, 3)
    line = json.dumps(row, allow_nan=False) + "\n"
    if self._jsonl is not None:
      self._jsonl.write(line)
      self._jsonl.flush()
    else:
      self._lines.append(line)
      self._unsaved = True
      if time.time() - self._saved_at >= REMOTE_FLUSH_S:
        self.flush()
    if self._tb is not None:
      with self._tb.as_default(step=int(step)):
        for k, v in metrics.items():
          if v is not None and not isinstance(v, Mapping) and math.isfinite(float(v)):
            self._tf.summary.scalar(k, float(v))
      self._tb.flush()

  def log(self, line: str) -> None:
    if self.enabled:
      print(line, flush=True)

  def flush(self) -> None:
    """Store every record written so far (a local file already holds them)."""
    if self.enabled and self._jsonl is None and self._unsaved:
      fs.write_atomic(self._path, "".join(self._lines))
      self._unsaved, self._saved_at = False, time.time()

  def close(self) -> None:
    if self.enabled:
      if self._jsonl is not None:
        self._jsonl.close()
      self.flush()
      if self._tb is not None:
        self._tb.close()


def _json_value(v):
  if v is None or isinstance(v, Mapping):
    return None if v is None else dict(v)
  return float(v)


def _truncate_after(path: epath.Path, step: int) -> None:
  """Rewrite `path` without its records after `step` (and without a torn last line)."""
  kept, dropped = [], 0
  for line in path.read_text().splitlines():
    try:
      keep = int(json.loads(line)["step"]) <= step
    except (ValueError, KeyError, TypeError):
      keep = False  # a line cut by a kill mid-write
    if keep:
      kept.append(line)
    else:
      dropped += 1
  if dropped:
    fs.write_atomic(path, "".join(line + "\n" for line in kept))
    print(
        f"metrics: dropped {dropped} record(s) of {path} after step {step} (the steps this "
        "run trains again)",
        flush=True,
    )


def time_to_target_line(target: float, reached: Mapping | None) -> str:
  """`time to target (held-out MLM accuracy >= 0.4): step 300, 1m12s, 1.23M tokens`."""
  head = f"time to target (held-out MLM accuracy >= {target:g}):"
  if reached is None:
    return f"{head} not reached"
  return (
      f"{head} step {reached['step']}, {format_duration(reached['wall_s'])} "
      f"({reached['wall_s']:.1f}s), {reached['tokens'] / 1e6:.2f}M tokens"
  )
