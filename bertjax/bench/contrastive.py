"""`bertjax bench --config contrastive --compare sentence-transformers`: training steps/s of
the contrastive objective (`bertjax.training.objective_contrastive`) beside
sentence-transformers' MultipleNegativesRankingLoss trained in PyTorch, on the CPU, in one run.

Both sides train the same network from the same weights on the same batch:

- bertjax: `bertjax.training.train`'s step (both encoder passes, InfoNCE over the whole batch,
  backward, global-norm clipping, AdamW) of experiments/pretrain.py's `contrastive` recipe,
  with the benchmark's model preset, batch and length, compiled ahead of time.
- sentence-transformers: the initial parameters written as a sentence-transformers directory
  (`bertjax.interop.sentence_transformers.save`: a `BertModel`, mean pooling) and loaded by
  `SentenceTransformer`; one step is what transformers' Trainer runs per batch with
  sentence-transformers' loss: `MultipleNegativesRankingLoss` (the recipe's scale, cosine) on
  the three columns, backward, `clip_grad_norm_` at the recipe's clip, torch's fused AdamW
  (the Trainer's default optimizer at this torch) with the recipe's lr, betas, epsilon and
  weight decay (none on biases and LayerNorms, on either side), and the linear schedule.

The batch: B queries, each with its positive and one hard negative, every text a row of
`seq_len` ids (random tokens, random lengths from a quarter of the row to all of it, at least
one full row per column), the same arrays on both sides. sentence-transformers' own collator
pads each column to its longest text; here both sides get the same padded rows, as bertjax's
pair stream makes them (`bertjax.data.pairs`), so both do the same work.

The steps are timed in turns (one step of each per round, the order alternating round by
round), so that a spell of load on the shared cores falls on both; the first `warmup` rounds
(bertjax's first step is already compiled; torch's first allocates) are not timed, the median
of the others is reported. Dropout is the recipe's on both sides, so their training losses
differ by the draw; the losses compared are those of the first batch at the initial weights
with dropout off (the same computation: tests/test_contrastive.py shows the gradients agree).
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np

from bertjax import errors
from bertjax.bench import peers as bench_peers, pretraining
from bertjax.bench.spec import BenchSpec
from bertjax.training import sharding, train

RECIPES = ("contrastive",)  # experiments/pretrain.py's recipes this benchmark times
PEERS = ("sentence-transformers",)
ST = "sentence-transformers"


def check(recipe: str, compare: tuple[str, ...], spec: BenchSpec) -> None:
  """`ConfigError` for a recipe, peer or numerics this benchmark does not time."""
  if recipe not in RECIPES:
    raise errors.ConfigError(
        f"--config {recipe}: not a recipe this benchmark times — valid: {', '.join(RECIPES)} "
        "(the MLM step: --preset without --config)"
    )
  bad = [c for c in compare if c not in PEERS]
  if bad:
    raise errors.ConfigError(
        f"--compare {','.join(bad)}: with --config {recipe} — valid: {', '.join(PEERS)}"
    )
  if compare and spec.dtype != "float32":
    raise errors.ConfigError(f"--dtype {spec.dtype}: {ST} runs float32 only — drop --dtype")


def synthetic_pairs(spec: BenchSpec, hard_negatives: int) -> dict[str, np.ndarray]:
  """queries [B, L] and documents [B, 1 + hard_negatives, L] (positive first), ids and masks."""
  rng = np.random.default_rng(spec.seed)
  B, L, D = spec.batch_size, spec.seq_len, 1 + hard_negatives

  def texts(rows: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(max(L // 4, 2), L + 1, rows)
    lengths[rng.integers(rows)] = L  # the column's longest fills the row
    mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(bench_peers.FIRST_TOKEN_ID, spec.vocab_size, (rows, L), dtype=np.int32)
    return ids * mask, mask

  q_ids, q_mask = texts(B)
  docs = [texts(B) for _ in range(D)]
  return {
      "query_ids": q_ids,
      "query_mask": q_mask,
      "doc_ids": np.stack([d[0] for d in docs], 1),
      "doc_mask": np.stack([d[1] for d in docs], 1),
  }


# ---------------------------------------------------------------------------------- bertjax


def _bertjax_side(spec: BenchSpec, config, host_batch: dict) -> tuple[Any, dict, Any, dict]:
  """(a step function, its figures: first-batch loss and compile time, the `train.Setup`,
  the initial parameters as numpy for the other side)."""
  mesh = sharding.make_mesh(data=-1)
  setup = train.setup(config, mesh)
  state = setup.init_state(spec.seed)
  params = jax.tree.map(np.asarray, state.params)  # before the step donates the state
  batch = {k: jax.device_put(v, setup.batch_sharding) for k, v in host_batch.items()}
  sums = setup.eval_step(state.params, batch)  # dropout off
  loss = float(sums["contrastive_loss"] / sums["contrastive_count"])
  t0 = time.perf_counter()
  compiled = setup.train_step.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  figures = {"first_loss": loss, "compile_s": compile_s}
  return pretraining._stepper(compiled, state, batch), figures, setup, params


# --------------------------------------------------------------------- sentence-transformers


def _vocab_file(path: pathlib.Path, vocab_size: int) -> pathlib.Path:
  """A WordPiece vocabulary of `vocab_size` entries, the special tokens at bertjax's ids: the
  batch is ids already, so only `SentenceTransformer`'s loading reads it."""
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  words += [f"t{i}" for i in range(len(words), vocab_size)]
  path.write_text("\n".join(words) + "\n", encoding="utf-8")
  return path


def _st_model(setup, params: dict, out: pathlib.Path, seq_len: int):
  """`params` (the contrastive model's encoder) saved as a sentence-transformers directory by
  bertjax's export, loaded by `SentenceTransformer`."""
  import transformers
  from sentence_transformers import SentenceTransformer

  from bertjax.interop import hf_tensors, sentence_transformers as st_lib

  cfg = setup.bert_config
  heads = hf_tensors.fresh_heads(cfg)  # the export writes the encoder; these stay out of it
  pooler = heads.pop("pooler")
  full = dict(heads, bert=dict(params["bert"], pooler=pooler))
  pooling = setup.objective.spec.pooling
  st_lib.save(out, cfg, full, st_lib.SentenceHead(pooling=pooling, max_seq_length=seq_len))
  vocab = _vocab_file(out / "vocab.txt", cfg.vocab_size)
  transformers.BertTokenizerFast(str(vocab), do_lower_case=False).save_pretrained(str(out))
  model = SentenceTransformer(str(out), device="cpu")
  hf = model[0].auto_model.config
  loaded = (hf.hidden_dropout_prob, hf.attention_probs_dropout_prob)
  if loaded != (cfg.hidden_dropout_rate, cfg.attention_dropout_rate):  # a bug of the export
    raise AssertionError(f"{ST} loaded dropout {loaded}, bertjax trains with {cfg}")
  return model


def _st_side(spec: BenchSpec, config, setup, params: dict, host_batch: dict, tmp: str):
  """(a step function, its figures: first-batch loss, versions)."""
  import sentence_transformers
  import torch
  import transformers
  from sentence_transformers.sentence_transformer import losses
  from sentence_transformers import util

  torch.set_num_threads(bench_peers.num_cores())
  model = _st_model(setup, params, pathlib.Path(tmp) / "st", spec.seq_len)
  oc = setup.objective.spec
  similarity = util.cos_sim if oc.normalize else util.dot_score
  loss_fn = losses.MultipleNegativesRankingLoss(model, scale=oc.scale, similarity_fct=similarity)
  columns = [(host_batch["query_ids"], host_batch["query_mask"])]
  for d in range(host_batch["doc_ids"].shape[1]):
    columns.append((host_batch["doc_ids"][:, d], host_batch["doc_mask"][:, d]))
  features = [
      {"input_ids": torch.from_numpy(ids.astype(np.int64)), "attention_mask": torch.from_numpy(m)}
      for ids, m in columns
  ]
  model.eval()
  with torch.no_grad():
    first_loss = float(loss_fn(features, None))
  model.train()

  t = config.train
  no_decay = ("bias", "LayerNorm.weight")  # transformers' Trainer; bertjax's AdamW mask alike
  named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
  groups = [
      {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": t.weight_decay},
      {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
  ]
  opt = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps, fused=True)
  schedule = transformers.get_linear_schedule_with_warmup(opt, t.warmup_steps, t.steps)

  def step():
    loss = loss_fn(features, None)
    loss.backward()
    if t.clip_norm:
      torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
    opt.step()
    schedule.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())

  figures = {
      "first_loss": first_loss,
      "version": f"sentence-transformers {sentence_transformers.__version__}, transformers "
      f"{transformers.__version__}, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads, attention "
      f"{model[0].auto_model.config._attn_implementation}",
  }
  return step, figures


# --------------------------------------------------------------------------------------- run


def _progress(msg: str) -> None:
  print(f"bench: {msg}", file=sys.stderr, flush=True)  # stdout stays the report


def _step_figures(spec: BenchSpec, wall: list[float], cpu: list[float]) -> dict:
  times, cpu_times = wall[spec.warmup :], cpu[spec.warmup :]
  step_ms = 1e3 * statistics.median(times)
  return {
      "step_ms": step_ms,
      "step_ms_min": 1e3 * min(times),
      "cpu_ms": 1e3 * statistics.median(cpu_times),
      "steps_per_s": 1e3 / step_ms,
  }


def run(spec: BenchSpec, recipe: str = "contrastive", compare: tuple[str, ...] = ()) -> dict:
  """The benchmark's figures, one flat JSON-able dict."""
  check(recipe, compare, spec)
  config = pretraining.train_config(spec, recipe)  # the recipe with the benchmark's shape
  hard_negatives = int(config.contrastive.hard_negatives)
  host_batch = synthetic_pairs(spec, hard_negatives)
  _progress(
      f"bertjax: {recipe} on {spec.preset}, batch {spec.batch_size} x (query, positive, "
      f"{hard_negatives} hard negative) x seq {spec.seq_len}: compiling ..."
  )
  ours, figures, setup, params = _bertjax_side(spec, config, host_batch)
  steps = {"bertjax": ours}
  with tempfile.TemporaryDirectory(prefix="bertjax-bench-contrastive-") as tmp:
    if ST in compare:
      _progress(f"{ST}: loading the same weights ...")
      steps[ST], st_figures = _st_side(spec, config, setup, params, host_batch, tmp)
    rounds = spec.warmup + spec.steps
    _progress(f"timing {rounds} rounds ({spec.warmup} warm-up) of {' and '.join(steps)} ...")
    wall = pretraining._interleaved(steps, rounds)
  devices = jax.devices()
  masks = [host_batch["query_mask"], host_batch["doc_mask"]]
  out = {
      "config": recipe,
      "preset": spec.preset,
      "batch_size": spec.batch_size,
      "seq_len": spec.seq_len,
      "hard_negatives": hard_negatives,
      "texts_per_step": spec.batch_size * (2 + hard_negatives),
      "real_token_fraction": float(sum(m.sum() for m in masks) / sum(m.size for m in masks)),
      "vocab_size": spec.vocab_size,
      "dtype": spec.dtype,
      "hidden_dropout": config.model.hidden_dropout_rate,
      "attention_dropout": config.model.attention_dropout_rate,
      "warmup": spec.warmup,
      "steps": spec.steps,
      "device": f"{devices[0].device_kind} x {len(devices)}",
      "threads": bench_peers.num_cores(),
      "jax": jax.__version__,
      "compile_s": figures["compile_s"],
      "first_loss_bertjax": figures["first_loss"],
  }
  out.update({f"bertjax_{k}": v for k, v in _step_figures(spec, *wall["bertjax"]).items()})
  if ST in compare:
    out.update({f"{ST}_{k}": v for k, v in _step_figures(spec, *wall[ST]).items()})
    out[f"speedup_{ST}"] = out[f"{ST}_step_ms"] / out["bertjax_step_ms"]
    # CPU seconds of this process: steadier than wall time when other work shares the cores
    out[f"speedup_{ST}_cpu"] = out[f"{ST}_cpu_ms"] / out["bertjax_cpu_ms"]
    out[f"first_loss_{ST}"] = st_figures["first_loss"]
    out["first_loss_abs_diff"] = abs(figures["first_loss"] - st_figures["first_loss"])
    out[f"{ST}_version"] = st_figures["version"]
  return out


def format_report(r: dict) -> str:
  """The table `bertjax bench --config contrastive` prints."""
  lines = [
      f"bertjax bench --config {r['config']}: {r['preset']} (vocab {r['vocab_size']}), "
      f"{r['batch_size']} queries x (query, positive, {r['hard_negatives']} hard negative) x seq "
      f"{r['seq_len']} = {r['texts_per_step']} texts/step ({r['real_token_fraction']:.0%} real "
      f"tokens), {r['dtype']}, dropout {r['hidden_dropout']}/{r['attention_dropout']}",
      f"device {r['device']} ({r['threads']} cores), jax {r['jax']}; compile {r['compile_s']:.1f} s",
  ]
  if f"{ST}_version" in r:
    lines.append(f"{ST}: {r[f'{ST}_version']}")
  loss = f"first-batch loss, dropout off: bertjax {r['first_loss_bertjax']:.6f}"
  if f"first_loss_{ST}" in r:
    loss += f", {ST} {r[f'first_loss_{ST}']:.6f} (|diff| {r['first_loss_abs_diff']:.1e})"
  lines += [loss, "", f"{'':24}{'ms/step':>10}{'(best)':>10}{'steps/s':>10}{'CPU ms':>10}"]
  for name in ("bertjax", ST):
    if f"{name}_step_ms" in r:
      lines.append(
          f"{name:24}{r[f'{name}_step_ms']:10.1f}{r[f'{name}_step_ms_min']:10.1f}"
          f"{r[f'{name}_steps_per_s']:10.3f}{r[f'{name}_cpu_ms']:10.1f}"
      )
  if f"speedup_{ST}" in r:
    lines.append(
        f"speedup over {ST}: {r[f'speedup_{ST}']:.2f}x ({ST}' step time / bertjax's; in CPU "
        f"time {r[f'speedup_{ST}_cpu']:.2f}x)"
    )
  turns = ", the sides in turns" if f"speedup_{ST}" in r else ""
  lines.append(f"(median of {r['steps']} timed steps after {r['warmup']} warm-up{turns})")
  return "\n".join(lines)
