"""`bertjax bench finetune`: wall time and dev accuracy of one fine-tuning run beside PyTorch.

`run_finetune(spec)` fine-tunes a random-init encoder on a labelled single-sentence TSV task
(train.tsv, dev.tsv with `sentence` and `label` columns) for `spec.epochs` and evaluates on dev,
compiles included, with bertjax (`bertjax.tasks.glue.finetune`, as `bertjax glue` runs it) and,
in the same process, transformers' BertForSequenceClassification in PyTorch on the same token
ids (`bertjax.bench.peers.run_torch_finetune`). "hf-torch-flat" is transformers' padding-free
path (`bench.peers.run_torch_flat_finetune`), timed where the installed transformers keeps the
flattened examples apart (measured each run) and otherwise reported with the measured
difference. "keras-hub" is keras-hub's BertTextClassifier on Keras's JAX backend, in a child
process (`bench.peers.run_keras_finetune_subprocess`), every batch padded to max_seq_len; it
is opt-in (its import brings TensorFlow: seconds more per run). With a persistent compile cache
the bertjax run
is timed twice: cold (every step compiled) and warm (read back, as a rerun sees it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.bench import peer_runs, peers as bench_peers
from bertjax.tasks import defaults, encoder as encoder_lib, finetuning as finetuning_lib
from bertjax.tasks.glue import features, finetune, tasks, tsv

# the fine-tuning peers (`bertjax bench` has more for pretraining): PyTorch padding each batch
# to its longest row, transformers' padding-free path (checked, see peers.py), and keras-hub on
# Keras's JAX backend (opt-in: not in DEFAULT_PEERS)
PEERS = ("hf-torch", "hf-torch-flat", "keras-hub")
DEFAULT_PEERS = ("hf-torch", "hf-torch-flat")
MAX_POSITIONS = 512  # BERT's position embeddings


@dataclasses.dataclass(frozen=True)
class FinetuneSpec:
  """One fine-tuning run of a random-init encoder on a labelled single-sentence TSV task."""

  task_dir: str  # holds train.tsv and dev.tsv (columns `sentence`, `label`)
  tokenizer: str  # .model (SentencePiece) or vocab.txt (WordPiece)
  preset: str = "mini"  # bertjax.model.PRESETS name
  epochs: int = 1
  batch_size: int = 32  # global
  eval_batch_size: int = 64
  learning_rate: float = 5e-4  # bertjax's default for hidden 256; both runs
  max_seq_len: int = 128  # longer rows are truncated
  length_bucket: int = (
      defaults.LENGTH_BUCKET
  )  # bertjax pads batches to a multiple of this; 0: to max_seq_len
  max_lengths: int = defaults.MAX_LENGTHS  # bertjax: at most this many batch lengths (compiles)
  max_train_examples: int = 0  # > 0: the first N rows (quick runs)
  seed: int = 0
  packing: int = 0  # bertjax: > 0 packs up to this many examples into a row; 0: one a row

  def __post_init__(self):
    for field, low in (
        ("epochs", 1),
        ("batch_size", 1),
        ("eval_batch_size", 1),
        ("max_seq_len", 3),  # [CLS] a token [SEP]
        ("length_bucket", 0),
        ("max_lengths", 1),
        ("max_train_examples", 0),
        ("seed", 0),
        ("packing", 0),
    ):
      if getattr(self, field) < low:
        raise errors.ConfigError(f"FinetuneSpec.{field}={getattr(self, field)} must be >= {low}")
    if self.max_seq_len > MAX_POSITIONS:
      raise errors.ConfigError(
          f"FinetuneSpec.max_seq_len={self.max_seq_len} exceeds BERT's {MAX_POSITIONS} positions "
          f"— use at most {MAX_POSITIONS}"
      )
    if not 0 < self.learning_rate < math.inf:
      raise errors.ConfigError(
          f"FinetuneSpec.learning_rate={self.learning_rate} must be a number > 0"
      )
    if self.preset not in model_lib.PRESETS:
      raise errors.ConfigError(
          f"FinetuneSpec.preset={self.preset!r} is not a model preset — valid presets: "
          f"{', '.join(model_lib.PRESETS)}"
      )

  def check_inputs(self) -> None:
    """`InputNotFoundError` naming the field when a file the run reads is missing."""
    from bertjax.runtime import fs

    for name in ("train.tsv", "dev.tsv"):
      if not (fs.path(self.task_dir) / name).is_file():
        raise errors.InputNotFoundError(
            f"FinetuneSpec.task_dir={self.task_dir}: no {name} — the task directory holds "
            "train.tsv and dev.tsv (columns sentence, label)"
        )
    if not fs.path(self.tokenizer).is_file():
      raise errors.InputNotFoundError(
          f"FinetuneSpec.tokenizer={self.tokenizer}: no such file — a .model or vocab.txt"
      )


def check_peers(compare: tuple[str, ...]) -> None:
  unknown = [p for p in compare if p not in PEERS]
  if unknown:
    raise errors.ConfigError(
        f"compare={','.join(unknown)}: unknown peer — valid: {', '.join(PEERS)}"
    )


def _finetune_data(spec: FinetuneSpec):
  """(task, encoder, features by split): the task's rows tokenized once for both runs."""
  from bertjax.runtime import fs

  train, dev = (str(fs.path(spec.task_dir) / f) for f in ("train.tsv", "dev.tsv"))
  labels = tsv.custom_labels(train, ("sentence",), "label")
  task = tasks.custom("bench", train, dev, None, ("sentence",), "label", labels)
  examples = tsv.load_task(task, "", with_test=False)
  if spec.max_train_examples:
    ex, n = examples["train"], spec.max_train_examples
    examples["train"] = features.Examples(ex.text_a[:n], None, ex.labels[:n], ex.index[:n])
  enc = encoder_lib.load_encoder("random", spec.tokenizer, spec.preset, prefix="bench finetune")
  return (
      task,
      enc,
      {k: features.encode(enc.tokenizer, v, spec.max_seq_len) for k, v in examples.items()},
  )


def _recipe(spec: FinetuneSpec) -> finetuning_lib.Recipe:
  return finetuning_lib.Recipe(
      learning_rate=spec.learning_rate,
      epochs=spec.epochs,
      batch_size=spec.batch_size,
      eval_batch_size=spec.eval_batch_size,
      optimizer="adamw",
      seed=spec.seed,
      length_bucket=spec.length_bucket,
      max_lengths=spec.max_lengths,
  )


def _bertjax_runs(task, enc, feats, recipe, packing) -> dict[str, tuple[float, float, Any]]:
  """{"cold": (wall s, CPU s, run)} and, with a persistent compile cache, "warm" too."""
  cache = jax.config.jax_compilation_cache_dir
  runs = {}
  for name in ("cold", "warm") if cache else ("cold",):
    # warm: what a rerun in a new process sees, the compiled steps read back from the
    # persistent cache (bertjax.runtime.compile_cache) instead of compiled
    jax.clear_caches()  # no Trainer outlives a run: none is kept without a TrainerCache
    with tempfile.TemporaryDirectory() as workdir:
      t0, c0 = time.perf_counter(), time.process_time()
      # the trainer's epoch lines go with the benchmark's progress: stdout is the result (--json)
      with contextlib.redirect_stdout(sys.stderr):
        run = finetune.train_and_evaluate(
            task,
            enc,
            feats,
            recipe,
            workdir,
            progress=False,
            save_checkpoint=False,
            packing=packing,
        )
      runs[name] = (time.perf_counter() - t0, time.process_time() - c0, run)
    _progress(f"bertjax ({name} compile cache): {runs[name][0]:.1f} s")
  return runs


def _torch_spec(spec: FinetuneSpec, task, cfg, recipe) -> dict:
  return {
      **bench_peers.model_spec(cfg),
      "hidden_dropout_rate": recipe.dropout,
      "attention_dropout_rate": recipe.dropout,
      "num_labels": task.num_labels,
      "batch_size": spec.batch_size,
      "eval_batch_size": spec.eval_batch_size,
      "epochs": spec.epochs,
      "learning_rate": spec.learning_rate,
      "weight_decay": recipe.weight_decay,
      "warmup_fraction": recipe.warmup_fraction,
      "seed": spec.seed,
      "threads": bench_peers.num_cores(),
  }


def _torch_peer(spec: FinetuneSpec, task, cfg, recipe, feats) -> dict:
  _progress("hf-torch ...")
  return peer_runs.run_torch_finetune(
      _torch_spec(spec, task, cfg, recipe),
      finetune.arrays(feats["train"]),
      finetune.arrays(feats["dev"]),
  )


def run_finetune(spec: FinetuneSpec, compare: tuple[str, ...] = DEFAULT_PEERS) -> dict[str, Any]:
  """Wall time and dev accuracy of `spec.epochs` of fine-tuning + dev eval with bertjax
  (compiles included) and, in the same process, the `compare` peers on the same token ids."""
  check_peers(compare)
  spec.check_inputs()
  task, enc, feats = _finetune_data(spec)
  real_N = feats["train"].attention_mask_NxL.sum(1)
  recipe = _recipe(spec)
  out = {
      "name": "bertjax",
      **dataclasses.asdict(spec),
      "train_rows": len(feats["train"]),
      "dev_rows": len(feats["dev"]),
      "tokens_mean": float(real_N.mean()),
      "tokens_p90": float(np.percentile(real_N, 90)),
      "tokens_max": int(real_N.max()),
      "devices": jax.device_count(),
      "threads": bench_peers.num_cores(),
      "jax": jax.__version__,
  }
  _progress(
      f"bertjax: {spec.preset}, {len(feats['train'])} rows (mean {real_N.mean():.1f} "
      f"tokens), batch {spec.batch_size}, {spec.epochs} epoch(s) + dev eval"
  )
  runs = _bertjax_runs(task, enc, feats, recipe, spec.packing)
  out["wall_s"], out["cpu_s"], run = runs["cold"]
  if "warm" in runs:
    out["warm_wall_s"], out["warm_cpu_s"], warm = runs["warm"]
    out["warm_accuracy"] = warm.dev["accuracy"]
  out.update(
      accuracy=run.dev["accuracy"],
      train_loss=run.history[-1]["train_loss"],
      compiled_train_shapes=run.compiled_shapes[0],
      compiled_predict_shapes=run.compiled_shapes[1],
      compile_cache="warm" in runs,
  )
  peers = {}
  if "hf-torch" in compare:
    peer = peers["hf-torch"] = _torch_peer(spec, task, enc.config, recipe, feats)
    if peer["status"] == "ok":
      out["speedup_hf-torch"] = peer["wall_s"] / out["wall_s"]
      out["cpu_speedup_hf-torch"] = peer["cpu_s"] / out["cpu_s"]
      if "warm_wall_s" in out:
        out["warm_speedup_hf-torch"] = peer["wall_s"] / out["warm_wall_s"]
        out["warm_cpu_speedup_hf-torch"] = peer["cpu_s"] / out["warm_cpu_s"]
  if "hf-torch-flat" in compare:
    _progress("hf-torch-flat: the padding-free path (where it keeps examples apart) ...")
    peer = peers["hf-torch-flat"] = peer_runs.run_torch_flat_finetune(
        _torch_spec(spec, task, enc.config, recipe),
        finetune.arrays(feats["train"]),
        finetune.arrays(feats["dev"]),
    )
    if peer["status"] == "ok":
      out["speedup_hf-torch-flat"] = peer["wall_s"] / out["wall_s"]
      out["cpu_speedup_hf-torch-flat"] = peer["cpu_s"] / out["cpu_s"]
  if "keras-hub" in compare:
    _progress("keras-hub: BertTextClassifier on Keras's JAX backend, in a child process ...")
    kspec = _torch_spec(spec, task, enc.config, recipe)
    kspec.update(clip_norm=recipe.clip_norm, eps=1e-6)  # bertjax's (tasks.recipe)
    peer = peers["keras-hub"] = peer_runs.run_keras_finetune_subprocess(
        kspec, finetune.arrays(feats["train"]), finetune.arrays(feats["dev"])
    )
    if peer["status"] == "ok":
      out["speedup_keras-hub"] = peer["wall_s"] / out["wall_s"]
      out["cpu_speedup_keras-hub"] = peer["cpu_s"] / out["cpu_s"]
      if "warm_wall_s" in out:
        out["warm_speedup_keras-hub"] = peer["wall_s"] / out["warm_wall_s"]
  out["peers"] = peers
  return out


def _progress(msg: str) -> None:
  print(f"bench: {msg}", file=sys.stderr, flush=True)  # stdout: the report alone


def format_finetune_report(r: dict[str, Any]) -> str:
  """The table `bertjax bench finetune` prints."""
  lines = [
      f"bertjax bench finetune: {r['preset']}, {r['train_rows']} train / {r['dev_rows']} "
      f"dev rows (tokens mean {r['tokens_mean']:.1f}, p90 {r['tokens_p90']:.0f}, max "
      f"{r['tokens_max']}), batch {r['batch_size']}, lr {r['learning_rate']:g}, "
      f"{r['epochs']} epoch(s) + dev eval",
      f"{r['devices']} device(s), {r['threads']} cores, jax {r['jax']}; bertjax compiled "
      f"{r['compiled_train_shapes']} train and {r['compiled_predict_shapes']} predict "
      f"shapes ("
      + (
          f"packed, up to {r['packing']} examples a row"
          if r.get("packing")
          else f"length bucket {r['length_bucket']}"
      )
      + ")",
      "",
      f"{'':14}{'wall s':>9}{'CPU s':>9}{'dev acc':>9}{'speedup':>9}{'(CPU)':>8}",
  ]
  peers = [p for p in r["peers"].values()]
  ok = [p for p in peers if p.get("status", "ok") == "ok"]
  ours = [("bertjax", r["wall_s"], r["cpu_s"], r["accuracy"])]
  if "warm_wall_s" in r:
    ours = [
        ("bertjax cold", r["wall_s"], r["cpu_s"], r["accuracy"]),
        ("bertjax warm", r["warm_wall_s"], r["warm_cpu_s"], r["warm_accuracy"]),
    ]
  for name, wall, cpu, acc in ours:
    speed = ""
    if ok:  # the peer's time over ours: above 1 is faster than the peer
      speed = f"{ok[0]['wall_s'] / wall:8.2f}x{ok[0]['cpu_s'] / cpu:7.2f}x"
    lines.append(f"{name:14}{wall:9.1f}{cpu:9.1f}{acc:9.4f}{speed}")
  for row in peers:
    if row.get("status", "ok") != "ok":
      lines.append(f"{row['name']:14}{row['status']}: {row['reason']}")
      continue
    lines.append(f"{row['name']:14}{row['wall_s']:9.1f}{row['cpu_s']:9.1f}{row['accuracy']:9.4f}")
  for peer in ok[1:]:  # the speedups above are over the first; the others' here
    lines.append(
        f"speedup over {peer['name']}: {peer['wall_s'] / r['wall_s']:.2f}x wall, "
        f"{peer['cpu_s'] / r['cpu_s']:.2f}x CPU" + (" (bertjax cold)" if len(ours) > 1 else "")
    )
  lines.append(
      "(model build to the last dev prediction; cold compiles every step, warm reads them "
      "from the compile cache as a rerun does; speedup = the peer's time / bertjax's; CPU s, "
      "the process's CPU time, is steadier on a shared machine)"
  )
  for row in ok:  # what a peer computes that bertjax does not, and back
    if row.get("differences"):
      lines.append(
          f"{row['name']} vs bertjax ({row['version']}; its import, not timed: "
          f"{row['import_s']:.1f} s):"
      )
      lines += [f"  - {d}" for d in row["differences"]]
  return "\n".join(lines)
