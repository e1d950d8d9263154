"""The Hugging Face peers of `bertjax bench --compare`: the same BERT, batch and step elsewhere.

  hf-torch          transformers' `BertForPreTraining`, PyTorch eager, `torch.optim.AdamW`
  hf-torch-compile  the same module under `torch.compile` (inductor; needs a C++ compiler on CPU)
  hf-flax           `FlaxBertForPreTraining` from transformers 4.x (the last release with Flax)
                    with optax AdamW, run as a subprocess in its own virtualenv (see
                    docs/performance.md); transformers 5 dropped the Flax models.
  keras-hub         keras-hub's `BertMaskedLM` on Keras 3's JAX backend with
                    `keras.optimizers.AdamW`, run as a subprocess (KERAS_BACKEND=jax is read
                    when Keras is imported, so the bertjax process is left alone); MLM only,
                    its head on the masked positions as bertjax's (`KERAS_HUB_DIFFERENCES`).

Each Hugging Face peer trains in the same way bertjax does: forward, MLM + NSP loss, backward,
AdamW update, on the same synthetic batch (`synthetic_batch`), with dropout on. They score the
MLM head at every position (their models have no gathered head) and mask the loss with label
-100; that extra work is exactly what bertjax skips, so it is not counted in their model FLOPs
either. keras-hub's head gathers the masked positions as bertjax's does, and it has no NSP.
`bertjax bench finetune` runs `run_torch_finetune`: a whole fine-tuning epoch and dev eval, and
with `--compare keras-hub` `run_keras_finetune_subprocess` (keras-hub's `BertTextClassifier`).

Every peer returns a dict: `{"name", "status": "ok"|"unavailable"|"failed", "reason", ...}` and,
when ok, `step_ms`, `step_ms_min`, `compile_s`, `tokens_per_sec`, `seq_per_sec`, `version`.
A missing package or virtualenv is "unavailable", an exception inside a peer is "failed"; the
benchmark reports both and carries on.

This file imports nothing from bertjax (only NumPy at module level): the hf-flax peer runs it as
a script with the other virtualenv's Python: `python bench_peers.py hf-flax '<json spec>'`, the
keras-hub peers with this Python (or BERTJAX_KERAS_HUB_PYTHON's): `... keras-hub '<json spec>'`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

PEERS = ("hf-torch", "hf-torch-compile", "hf-flax", "keras-hub")
# The hf-flax virtualenv, relative to the repository root (overridable with BERTJAX_HF4_PYTHON).
HF4_VENV_PYTHON = os.path.join(".venv-hf4", "bin", "python")
# keras-hub installs beside bertjax without changing jax, keras, tensorflow or numpy (a 1.7 MB
# pure-Python wheel and kagglehub/kagglesdk), so its peers run with this Python by default.
KERAS_HUB_INSTALL = "pip install 'keras-hub>=0.32'"
FIRST_TOKEN_ID = 5  # ids 0..4 are PAD UNK CLS SEP MASK; synthetic tokens avoid them


def num_cores() -> int:
  """The cores this process may run on: XLA's CPU thread pool uses the same count."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # macOS
    return os.cpu_count() or 1


def model_spec(cfg) -> dict:
  """The shape fields of a `BertConfig` that every peer's spec carries (`_hf_config` reads them)."""
  return {
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "num_layers": cfg.num_layers,
      "num_heads": cfg.num_heads,
      "intermediate_size": cfg.intermediate_size,
      "max_position_embeddings": cfg.max_position_embeddings,
  }


def max_predictions(seq_len: int, mask_prob: float = 0.15) -> int:
  """BERT's max_predictions_per_seq: ceil(mask_prob * L), 20 at seq 128."""
  return max(1, int(np.ceil(mask_prob * seq_len - 1e-9)))


def synthetic_batch(
    batch_size: int, seq_len: int, num_masked: int, vocab_size: int, seed: int = 0
) -> dict[str, np.ndarray]:
  """One full-length pretraining batch of random tokens, in the data pipeline's layout.

  Every row is real tokens (no padding, as packed pretraining data), two segments split at a
  random point, `num_masked` distinct masked positions (never [CLS] at 0), random NSP labels.
  """
  if num_masked > seq_len - 1:
    raise ValueError(f"synthetic_batch: num_masked={num_masked} must be < seq_len={seq_len}")
  rng = np.random.default_rng(seed)
  ids_BxL = rng.integers(FIRST_TOKEN_ID, vocab_size, (batch_size, seq_len), dtype=np.int32)
  split_B = rng.integers(seq_len // 4, 3 * seq_len // 4, batch_size)
  types_BxL = (np.arange(seq_len)[None, :] >= split_B[:, None]).astype(np.int32)
  pos_BxP = np.stack(
      [
          np.sort(rng.choice(np.arange(1, seq_len), num_masked, replace=False))
          for _ in range(batch_size)
      ]
  ).astype(np.int32)
  return dict(
      input_ids=ids_BxL,
      attention_mask=np.ones_like(ids_BxL),
      token_type_ids=types_BxL,
      masked_positions=pos_BxP,
      masked_ids=rng.integers(FIRST_TOKEN_ID, vocab_size, pos_BxP.shape, dtype=np.int32),
      masked_weights=np.ones(pos_BxP.shape, np.float32),
      nsp_labels=rng.integers(0, 2, batch_size, dtype=np.int32),
  )


def mlm_labels(batch: dict[str, np.ndarray]) -> np.ndarray:
  """[B, L] labels for a full-sequence MLM head: the masked ids at masked positions, else -100."""
  labels_BxL = np.full(batch["input_ids"].shape, -100, np.int64)
  np.put_along_axis(
      labels_BxL,
      batch["masked_positions"].astype(np.int64),
      batch["masked_ids"].astype(np.int64),
      axis=1,
  )
  return labels_BxL


def time_steps(
    step: Callable[[], Any], sync: Callable[[Any], Any], warmup: int, steps: int
) -> dict[str, float]:
  """Run `step` warmup + steps times, syncing after each; the first call's time is `compile_s`.

  Each step is synced, so a step's time is its full latency; on an accelerator the host's
  dispatch of the next step is not overlapped, which costs microseconds against a step of ms.
  """
  if steps < 1 or warmup < 1:
    raise ValueError(
        f"time_steps: need warmup >= 1 (compiles) and steps >= 1, got "
        f"warmup={warmup} steps={steps}"
    )
  times, cpu_times = [], []
  for _ in range(warmup + steps):
    t0, c0 = time.perf_counter(), time.process_time()
    sync(step())
    times.append(time.perf_counter() - t0)
    cpu_times.append(time.process_time() - c0)
  timed = times[warmup:]
  # CPU seconds of this process per step: steadier than wall time when other jobs share the
  # cores, so it is the better number for A/B comparisons on a busy machine.
  return {
      "compile_s": times[0],
      "step_ms": 1e3 * statistics.median(timed),
      "step_ms_min": 1e3 * min(timed),
      "steps_timed": len(timed),
      "cpu_ms": 1e3 * statistics.median(cpu_times[warmup:]),
  }


def _throughput(result: dict, batch_size: int, seq_len: int) -> dict:
  result["seq_per_sec"] = batch_size * 1e3 / result["step_ms"]
  result["tokens_per_sec"] = result["seq_per_sec"] * seq_len
  return result


def _hf_config(transformers, spec: dict):
  return transformers.BertConfig(
      vocab_size=spec["vocab_size"],
      hidden_size=spec["hidden_size"],
      num_hidden_layers=spec["num_layers"],
      num_attention_heads=spec["num_heads"],
      intermediate_size=spec["intermediate_size"],
      max_position_embeddings=spec["max_position_embeddings"],
      hidden_act="gelu",
      hidden_dropout_prob=spec["hidden_dropout_rate"],
      attention_probs_dropout_prob=spec["attention_dropout_rate"],
  )


def run_torch(spec: dict, compiled: bool) -> dict:
  """transformers' BertForPreTraining + torch AdamW, eager or under torch.compile."""
  name = "hf-torch-compile" if compiled else "hf-torch"
  try:  # torch and transformers are test/bench extras, imported only for their peers
    import torch
    import transformers
  except ImportError as e:
    return {"name": name, "status": "unavailable", "reason": f"{e}; pip install torch transformers"}
  try:
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(_hf_config(transformers, spec)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    b = synthetic_batch(spec["batch_size"], spec["seq_len"], spec["num_masked"], spec["vocab_size"])
    inputs = {
        k: torch.from_numpy(b[k].astype(np.int64))
        for k in ("input_ids", "attention_mask", "token_type_ids")
    }
    inputs["labels"] = torch.from_numpy(mlm_labels(b))
    inputs["next_sentence_label"] = torch.from_numpy(b["nsp_labels"].astype(np.int64))

    def train_step():
      loss = fwd(**inputs).loss
      loss.backward()
      opt.step()
      opt.zero_grad(set_to_none=True)
      return loss

    fwd = torch.compile(model) if compiled else model
    t = time_steps(train_step, lambda loss: float(loss.detach()), spec["warmup"], spec["steps"])
  except Exception as e:  # a peer's failure is reported, never fatal to the benchmark
    return {"name": name, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:500]}
  return _throughput(
      {
          "name": name,
          "status": "ok",
          "reason": "",
          **t,
          "version": f"transformers {transformers.__version__}, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, "
          f"attention {model.config._attn_implementation}",
      },
      spec["batch_size"],
      spec["seq_len"],
  )


def run_torch_finetune(
    spec: dict, train: dict[str, np.ndarray], dev: dict[str, np.ndarray]
) -> dict:
  """What a Hugging Face user runs: BertForSequenceClassification in PyTorch eager, each batch
  padded to its longest row (as DataCollatorWithPadding), AdamW (decay off biases and
  LayerNorm, ε 1e-6), linear warmup then decay, gradients clipped at 1.0 (the Trainer's
  max_grad_norm); then the dev accuracy. `train`/`dev`: input_ids, token_type_ids,
  attention_mask [N, L] and labels [N], the token ids bertjax trains on. The wall time runs
  from building the model to the last dev prediction."""
  name = "hf-torch"
  try:  # torch and transformers are test/bench extras, imported only for their peers
    import torch
    import transformers
  except ImportError as e:
    return {"name": name, "status": "unavailable", "reason": f"{e}; pip install torch transformers"}
  try:

    def padded(model, arrays, idx, labels):  # each batch padded to its longest row
      longest = int(arrays["attention_mask"][idx].sum(1).max())
      inputs = {
          k: torch.from_numpy(arrays[k][idx, :longest].astype(np.int64))
          for k in ("input_ids", "token_type_ids", "attention_mask")
      }
      out = model(**inputs, labels=labels)
      return out.loss, out.logits

    out, model = _torch_classifier_run(torch, transformers, spec, train, dev, None, padded)
  except Exception as e:  # a peer's failure is reported, never fatal to the benchmark
    return {"name": name, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:500]}
  return {
      "name": name,
      "status": "ok",
      "reason": "",
      **out,
      "version": f"transformers {transformers.__version__}, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads, attention "
      f"{model.config._attn_implementation}",
  }


# transformers' attention implementations a BertModel may be built with; the padding-free path
# (DataCollatorWithFlattening) needs one that keeps the flattened examples apart.
FLAT_ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2")
FLAT_TOLERANCE = 1e-5  # float32: an example alone and in a padded batch agree to ~1e-7


def torch_flattening_check(spec: dict) -> dict:
  """Does transformers' padding-free path keep BERT's examples apart? Measured, not assumed.

  Two examples are flattened as `DataCollatorWithFlattening` does (one row, position_ids
  restarting at each example) and run through `BertModel` with each attention implementation;
  the result is the largest |difference| of each example's hidden states from those of the
  example run alone (None with the reason where the implementation cannot be built). Two
  controls: the same two examples in an ordinary padded batch (`padded`, must agree) and the
  flattened row without its position_ids (`joined`, one sequence: must differ). The
  padding-free peer is only worth running where some implementation stays within
  `FLAT_TOLERANCE`; which ones do depends on the installed transformers (5.24.0: none on CPU;
  5.25.0: eager, sdpa and flex_attention), so it is measured in every run, never assumed.
  """
  import torch
  import transformers

  torch.manual_seed(spec["seed"])
  rng = np.random.default_rng(spec["seed"])
  lengths = (9, 5)
  ids = [[2, *rng.integers(FIRST_TOKEN_ID, spec["vocab_size"], n - 2).tolist(), 3] for n in lengths]
  flat = transformers.DataCollatorWithFlattening(return_position_ids=True)(
      [{"input_ids": x} for x in ids]
  )
  padded = torch.zeros((2, max(lengths)), dtype=torch.long)
  for i, x in enumerate(ids):
    padded[i, : len(x)] = torch.tensor(x)
  out = {"transformers": transformers.__version__, "diff": {}, "reason": {}}
  for impl in FLAT_ATTENTION:
    cfg = _hf_config(
        transformers, {**spec, "hidden_dropout_rate": 0.0, "attention_dropout_rate": 0.0}
    )
    try:
      model = transformers.BertModel._from_config(cfg, attn_implementation=impl).eval()
      with torch.inference_mode():
        alone = [model(input_ids=torch.tensor([x])).last_hidden_state[0] for x in ids]
        got = model(
            input_ids=flat["input_ids"], position_ids=flat["position_ids"]
        ).last_hidden_state[0]
        out["diff"][impl] = float((got - torch.cat(alone)).abs().max())
        if impl == "eager":
          both = model(input_ids=padded, attention_mask=(padded > 0).long()).last_hidden_state
          out["padded"] = max(
              float((both[i, : len(x)] - alone[i]).abs().max()) for i, x in enumerate(ids)
          )
          # the other control: the same row without position_ids is one sequence, so the
          # examples must see each other; a check that missed this could not detect a crossing
          joined = model(input_ids=flat["input_ids"]).last_hidden_state[0]
          out["joined"] = float((joined - torch.cat(alone)).abs().max())
    except Exception as e:  # not installed / not on this device: said, not fatal
      out["diff"][impl] = None
      out["reason"][impl] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
  return out


def run_torch_flat_finetune(
    spec: dict, train: dict[str, np.ndarray] | None = None, dev: dict[str, np.ndarray] | None = None
) -> dict:
  """The padding-free Hugging Face peer: transformers' flattened rows, timed where the installed
  transformers keeps flattened BERT examples apart; otherwise "unavailable" with the measured
  differences (`torch_flattening_check`).

  Where an attention implementation keeps them apart (measured each run: 5.24.0 none on CPU,
  5.25.0 eager, sdpa and flex_attention), each batch is what `DataCollatorWithFlattening`
  makes: the examples' real tokens one after another in a single row, position_ids restarting
  at each. `BertForSequenceClassification` pools the row's first token only, one prediction per
  row, so the classifier is run as a user of the flattened path writes it: its own `bert`,
  pooler, dropout and classifier, the pooler read at each example's first token ([CLS]). The
  rest is `run_torch_finetune`'s: optimizer, schedule, clipping, the dev accuracy."""
  name = "hf-torch-flat"
  try:
    import torch
    import transformers
  except ImportError as e:
    return {"name": name, "status": "unavailable", "reason": f"{e}; pip install torch transformers"}
  try:
    check = torch_flattening_check(spec)
  except Exception as e:  # a peer's failure is reported, never fatal to the benchmark
    return {"name": name, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:500]}
  said = ", ".join(
      f"{impl} {d:.1e}" if d is not None else f"{impl} not available"
      for impl, d in check["diff"].items()
  )
  passing = [i for i, d in check["diff"].items() if d is not None and d <= FLAT_TOLERANCE]
  if not passing or train is None:
    return {
        "name": name,
        "status": "unavailable",
        "reason": (
            f"transformers {check['transformers']}: DataCollatorWithFlattening rows of BERT "
            f"differ from each example alone by max |diff| {said} (padded batch "
            f"{check.get('padded', float('nan')):.1e}, without position_ids "
            f"{check.get('joined', float('nan')):.1e}; tolerance {FLAT_TOLERANCE:g})"
            + ("" if passing else "; no attention here keeps the examples apart")
        ),
        "flattening_check": check,
    }
  impl = "sdpa" if "sdpa" in passing else passing[0]
  try:
    out = _torch_flat_run(torch, transformers, spec, train, dev, impl)
  except Exception as e:  # a peer's failure is reported, never fatal to the benchmark
    return {"name": name, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:500]}
  return {
      "name": name,
      **out,
      "reason": f"flattened rows, attention {impl} (keeps examples apart: max |diff| {said})",
      "flattening_check": check,
  }


def flat_batch(torch, arrays: dict[str, np.ndarray], idx) -> tuple[dict, Any]:
  """Rows `idx` as DataCollatorWithFlattening lays them out (their real tokens one after
  another in a single row, position_ids restarting at each) and where each [CLS] sits."""
  lengths = arrays["attention_mask"][idx].sum(1)
  cat = lambda k: np.concatenate([arrays[k][i, :m] for i, m in zip(idx, lengths)])
  to = lambda x: torch.from_numpy(x.astype(np.int64))[None]
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
  inputs = dict(
      input_ids=to(cat("input_ids")),
      token_type_ids=to(cat("token_type_ids")),
      position_ids=to(np.concatenate([np.arange(m) for m in lengths])),
  )
  return inputs, torch.from_numpy(starts)


def flat_logits(model, inputs: dict, starts):
  """`BertForSequenceClassification`'s logits of every example of a flattened row: its own
  encoder, then its pooler, dropout and classifier at each example's [CLS]."""
  h = model.bert(**inputs).last_hidden_state[0]  # [T, H]: all the examples' tokens
  pooled = model.bert.pooler.activation(model.bert.pooler.dense(h[starts]))
  return model.classifier(model.dropout(pooled))


def _torch_flat_run(torch, transformers, spec, train, dev, impl: str) -> dict:
  def flattened(model, arrays, idx, labels):
    logits = flat_logits(model, *flat_batch(torch, arrays, idx))
    loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
    return loss, logits

  out, _ = _torch_classifier_run(torch, transformers, spec, train, dev, impl, flattened)
  return {
      "status": "ok",
      **out,
      "version": f"transformers {transformers.__version__}, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads, attention {impl}, flattened rows",
  }


def _torch_classifier_run(torch, transformers, spec, train, dev, impl, forward):
  """The fine-tuning both PyTorch peers run: BertForSequenceClassification (attention `impl`,
  None: transformers' default), AdamW without decay on biases and LayerNorm, ε 1e-6, linear
  warmup then decay, gradients clipped at 1.0, then the dev accuracy. `forward(model, arrays,
  idx, labels)` -> (loss or None, logits) is how a batch of rows `idx` reaches the model.
  Returns the timings and figures (model build to the last dev prediction) and the model."""
  torch.set_num_threads(spec["threads"])
  torch.manual_seed(spec["seed"])
  rng = np.random.default_rng(spec["seed"])
  t0, c0 = time.perf_counter(), time.process_time()
  hf = _hf_config(transformers, spec)
  hf.num_labels = spec["num_labels"]
  if impl is None:
    model = transformers.BertForSequenceClassification(hf)
  else:
    model = transformers.BertForSequenceClassification._from_config(hf, attn_implementation=impl)
  no_decay = lambda n: n.endswith("bias") or "LayerNorm" in n
  groups = [
      {
          "params": [p for n, p in model.named_parameters() if not no_decay(n)],
          "weight_decay": spec["weight_decay"],
      },
      {"params": [p for n, p in model.named_parameters() if no_decay(n)], "weight_decay": 0.0},
  ]
  opt = torch.optim.AdamW(groups, lr=spec["learning_rate"], eps=1e-6)
  n, bs = len(train["labels"]), spec["batch_size"]
  total = spec["epochs"] * -(-n // bs)
  sched = transformers.get_linear_schedule_with_warmup(
      opt, int(spec["warmup_fraction"] * total), total
  )
  model.train()
  losses = []
  for _ in range(spec["epochs"]):
    order = rng.permutation(n)
    for start in range(0, n, bs):
      idx = order[start : start + bs]
      labels = torch.from_numpy(train["labels"][idx].astype(np.int64))
      loss, _ = forward(model, train, idx, labels)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      sched.step()
      opt.zero_grad(set_to_none=True)
      losses.append(loss.detach())
  model.eval()
  pred = []
  with torch.inference_mode():
    for start in range(0, len(dev["labels"]), spec["eval_batch_size"]):
      idx = np.arange(start, min(start + spec["eval_batch_size"], len(dev["labels"])))
      pred.append(forward(model, dev, idx, None)[1].argmax(-1).numpy())
  accuracy = float(np.mean(np.concatenate(pred) == dev["labels"]))
  wall, cpu = time.perf_counter() - t0, time.process_time() - c0
  out = {
      "wall_s": wall,
      "cpu_s": cpu,
      "accuracy": accuracy,
      "train_loss": float(torch.stack(losses).mean()),
      "steps": len(losses),
  }
  return out, model


def run_flax_inline(spec: dict) -> dict:
  """FlaxBertForPreTraining (transformers 4.x) + optax AdamW; runs inside the 4.x virtualenv."""
  import transformers  # the 4.x virtualenv's, only for this peer
  from transformers import FlaxBertForPreTraining

  model = FlaxBertForPreTraining(_hf_config(transformers, spec), seed=0, dtype=jnp.float32)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  b = synthetic_batch(spec["batch_size"], spec["seq_len"], spec["num_masked"], spec["vocab_size"])
  labels_BxL = jnp.asarray(mlm_labels(b), jnp.int32)
  inputs = {k: jnp.asarray(b[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
  nsp_B = jnp.asarray(b["nsp_labels"])

  def loss_fn(params, rng):
    out = model(**inputs, params=params, dropout_rng=rng, train=True)
    weights_BxL = (labels_BxL >= 0).astype(jnp.float32)
    mlm = optax.softmax_cross_entropy_with_integer_labels(
        out.prediction_logits, jnp.maximum(labels_BxL, 0)
    )
    nsp = optax.softmax_cross_entropy_with_integer_labels(out.seq_relationship_logits, nsp_B)
    return (mlm * weights_BxL).sum() / weights_BxL.sum() + nsp.mean()

  @functools.partial(jax.jit, donate_argnums=(0, 1))  # as bertjax: the old state is donated
  def train_step(params, opt_state, rng):
    rng, sub = jax.random.split(rng)
    loss, grads = jax.value_and_grad(loss_fn)(params, sub)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, rng, loss

  state = [model.params, tx.init(model.params), jax.random.PRNGKey(0)]

  def step():
    *new, loss = train_step(*state)
    state[:] = new
    return loss

  t = time_steps(step, jax.block_until_ready, spec["warmup"], spec["steps"])
  return _throughput(
      {
          "name": "hf-flax",
          "status": "ok",
          "reason": "",
          **t,
          "version": f"transformers {transformers.__version__}, jax {jax.__version__}",
      },
      spec["batch_size"],
      spec["seq_len"],
  )


# What the keras-hub peers compute differently from bertjax: in the report and docs/performance.md.
KERAS_HUB_COMMON = (
    "AdamW as bertjax's: b1 0.9, b2 0.999, eps 1e-6, weight decay off biases and LayerNorm, "
    "the global gradient norm clipped at 1.0 (global_clipnorm); Keras adds eps to sqrt(v) "
    "before the bias correction, optax after",
    "keras-hub's encoder GELU is the tanh approximation, bertjax's the exact erf",
    "keras-hub has one dropout rate, for the hidden states and attention alike",
)
KERAS_HUB_DIFFERENCES = (
    "NSP: bertjax also trains the next-sentence head (pooler + 2-way classifier on [CLS]) "
    "and adds its loss; keras-hub's BertMaskedLM has no NSP head (its pooler is built and "
    "updated by AdamW, but unused)",
    "MLM head: both score the P masked positions only (gathered), tied to the token "
    "embeddings; the hf peers score every position",
    *KERAS_HUB_COMMON,
    "keras-hub runs at a constant lr (bertjax's peak), bertjax on its warmup-linear schedule",
    "train_on_batch returns the loss to Python each step, as bertjax's timed step is synced",
)
KERAS_HUB_FINETUNE_DIFFERENCES = (
    "padding: keras-hub gets every batch padded to --max-seq-len (as its "
    "BertTextClassifierPreprocessor pads); bertjax pads each batch to its length bucket",
    "model: BertTextClassifier (pooled [CLS], dropout, dense), as bertjax's GLUE head",
    *KERAS_HUB_COMMON,
    "both: linear warmup over the warmup fraction, then linear decay to 0; the rows shuffled "
    "each epoch (keras-hub's fit does not shuffle arrays: they are permuted before it)",
    "a partial last batch is compiled again in model.fit and model.predict (Keras compiles "
    "per shape)",
)


def _keras_optimizer(keras, spec: dict, learning_rate):
  """keras.optimizers.AdamW with bertjax's hyperparameters (KERAS_HUB_COMMON)."""
  clip = spec.get("clip_norm", 1.0)
  opt = keras.optimizers.AdamW(
      learning_rate=learning_rate,
      weight_decay=spec.get("weight_decay", 0.01),
      beta_1=0.9,
      beta_2=0.999,
      epsilon=spec.get("eps", 1e-6),
      global_clipnorm=clip if clip > 0 else None,
  )
  # Keras names a LayerNorm's parameters gamma and beta; the MLM head's bias is output_bias
  opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
  return opt


def _keras_backbone(keras_hub, spec: dict):
  """keras-hub's BertBackbone built from the spec's shape (random init, no preset download)."""
  return keras_hub.models.BertBackbone(
      vocabulary_size=spec["vocab_size"],
      num_layers=spec["num_layers"],
      num_heads=spec["num_heads"],
      hidden_dim=spec["hidden_size"],
      intermediate_dim=spec["intermediate_size"],
      dropout=spec["hidden_dropout_rate"],
      max_sequence_length=spec["max_position_embeddings"],
      dtype="float32",
  )


def _import_keras_hub():
  """(keras, keras_hub, seconds to import them); keras must have picked the JAX backend."""
  t0 = time.perf_counter()
  import keras
  import keras_hub

  if keras.backend.backend() != "jax":
    raise RuntimeError(f"Keras runs the {keras.backend.backend()} backend: set KERAS_BACKEND=jax")
  return keras, keras_hub, time.perf_counter() - t0


def _keras_version(keras, keras_hub) -> str:
  return (
      f"keras-hub {keras_hub.__version__}, keras {keras.__version__}, jax {jax.__version__}, "
      "JAX backend"
  )


def _keras_inputs(arrays: dict) -> dict:
  return {
      "token_ids": arrays["input_ids"],
      "segment_ids": arrays["token_type_ids"],
      "padding_mask": arrays["attention_mask"],
  }


def run_keras_inline(spec: dict) -> dict:
  """keras-hub's BertMaskedLM + keras AdamW, `train_on_batch` on the synthetic batch (its
  masked positions and ids); runs in a process whose Keras has the JAX backend."""
  keras, keras_hub, import_s = _import_keras_hub()
  keras.utils.set_random_seed(0)
  model = keras_hub.models.BertMaskedLM(
      backbone=_keras_backbone(keras_hub, spec), preprocessor=None
  )
  model.compile(
      optimizer=_keras_optimizer(keras, spec, spec.get("learning_rate", 1e-4)),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      weighted_metrics=[],  # the loss alone, as bertjax's step returns
  )
  b = synthetic_batch(spec["batch_size"], spec["seq_len"], spec["num_masked"], spec["vocab_size"])
  x = {k: jnp.asarray(v) for k, v in _keras_inputs(b).items()}  # on the device once, as bertjax
  x["mask_positions"] = jnp.asarray(b["masked_positions"])
  y, w = jnp.asarray(b["masked_ids"]), jnp.asarray(b["masked_weights"])

  def step():
    return model.train_on_batch(x, y, sample_weight=w, return_dict=True)

  t = time_steps(step, lambda logs: float(logs["loss"]), spec["warmup"], spec["steps"])
  return _throughput(
      {
          "name": "keras-hub",
          "status": "ok",
          "reason": "",
          **t,
          "import_s": import_s,
          "params": int(model.count_params()),
          "differences": list(KERAS_HUB_DIFFERENCES),
          "version": _keras_version(keras, keras_hub),
      },
      spec["batch_size"],
      spec["seq_len"],
  )


def run_keras_finetune_inline(spec: dict, train: dict, dev: dict) -> dict:
  """keras-hub's BertTextClassifier: `model.fit` for the epochs, then `model.predict` on dev;
  every batch padded to the arrays' length. The wall time runs from building the model to the
  last dev prediction (the import is `import_s`), as `run_torch_finetune`'s."""
  keras, keras_hub, import_s = _import_keras_hub()
  if spec["num_labels"] < 2:
    raise ValueError("the keras-hub peer fine-tunes classification tasks (2 labels or more)")
  keras.utils.set_random_seed(spec["seed"])
  ops = keras.ops
  n, bs = len(train["labels"]), spec["batch_size"]
  total = spec["epochs"] * -(-n // bs)
  warmup = int(spec["warmup_fraction"] * total)
  peak = spec["learning_rate"]

  class WarmupLinear(keras.optimizers.schedules.LearningRateSchedule):
    """0 -> peak over the warmup steps, then linearly to 0 at the last step (as the others)."""

    def __call__(self, step):
      step = ops.cast(step, "float32")
      up = step / max(warmup, 1)
      down = ops.maximum(0.0, (total - step) / max(total - warmup, 1))
      return peak * ops.where(step < warmup, up, down)

  t0, c0 = time.perf_counter(), time.process_time()
  model = keras_hub.models.BertTextClassifier(
      backbone=_keras_backbone(keras_hub, spec),
      num_classes=spec["num_labels"],
      preprocessor=None,
      dropout=spec["hidden_dropout_rate"],
  )
  model.compile(
      optimizer=_keras_optimizer(keras, spec, WarmupLinear()),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[],
  )
  # keras-hub's fit batches arrays into a grain dataset in the given order and Keras does not
  # shuffle a dataset, so each epoch gets its own permutation here, as the other runs shuffle
  rng = np.random.default_rng(spec["seed"])
  losses = []
  for epoch in range(spec["epochs"]):
    order = rng.permutation(n)
    history = model.fit(
        _keras_inputs({k: v[order] for k, v in train.items()}),
        train["labels"][order].astype(np.int32),
        batch_size=bs,
        initial_epoch=epoch,
        epochs=epoch + 1,
        shuffle=False,  # ignored for the dataset it makes (with a warning): permuted above
        verbose=0,
    )
    losses += history.history["loss"]
  logits = model.predict(_keras_inputs(dev), batch_size=spec["eval_batch_size"], verbose=0)
  accuracy = float(np.mean(np.argmax(logits, -1) == dev["labels"]))
  return {
      "name": "keras-hub",
      "status": "ok",
      "reason": "",
      "wall_s": time.perf_counter() - t0,
      "cpu_s": time.process_time() - c0,
      "accuracy": accuracy,
      "train_loss": float(np.mean(losses)),
      "steps": total,
      "import_s": import_s,
      "params": int(model.count_params()),
      "differences": list(KERAS_HUB_FINETUNE_DIFFERENCES),
      "version": _keras_version(keras, keras_hub),
  }


def keras_hub_python() -> str:
  return os.environ.get("BERTJAX_KERAS_HUB_PYTHON", sys.executable)


def _keras_hub_missing(python: str) -> dict | None:
  """The "unavailable" answer when keras-hub's Python lacks it (checked here where it is this
  Python, saving a subprocess); None when the subprocess should run."""
  if not os.path.exists(python):
    reason = f"no Python at {python} (BERTJAX_KERAS_HUB_PYTHON)"
  elif python == sys.executable and importlib.util.find_spec("keras_hub") is None:
    reason = "keras-hub is not installed"
  else:
    return None
  return {
      "name": "keras-hub",
      "status": "unavailable",
      "reason": f"{reason}: {KERAS_HUB_INSTALL} (or set BERTJAX_KERAS_HUB_PYTHON to a Python "
      "that has it)",
  }


def run_keras_subprocess(spec: dict, timeout_s: float = 1800) -> dict:
  """`run_keras_inline` in a child process with KERAS_BACKEND=jax; its one JSON line."""
  python = keras_hub_python()
  missing = _keras_hub_missing(python)
  if missing:
    return missing
  return _run_script("keras-hub", python, "keras-hub", spec, timeout_s, keras=True)


def run_keras_finetune_subprocess(
    spec: dict, train: dict[str, np.ndarray], dev: dict[str, np.ndarray], timeout_s: float = 3600
) -> dict:
  """`run_keras_finetune_inline` in a child process with KERAS_BACKEND=jax, on `train`/`dev`
  (input_ids, token_type_ids, attention_mask [N, L], labels [N]) handed over in a .npz."""
  python = keras_hub_python()
  missing = _keras_hub_missing(python)
  if missing:
    return missing
  import tempfile

  with tempfile.TemporaryDirectory(prefix="bertjax-keras-") as tmp:
    data = os.path.join(tmp, "data.npz")
    np.savez(
        data, **{f"{s}/{k}": v for s, a in (("train", train), ("dev", dev)) for k, v in a.items()}
    )
    return _run_script(
        "keras-hub", python, "keras-hub-finetune", {**spec, "data": data}, timeout_s, keras=True
    )


def hf4_python(repo_root: str) -> str:
  return os.environ.get("BERTJAX_HF4_PYTHON", os.path.join(repo_root, HF4_VENV_PYTHON))


def run_flax_subprocess(spec: dict, repo_root: str, timeout_s: float = 1800) -> dict:
  """Run `run_flax_inline` in the transformers-4.x virtualenv; parse its one JSON line."""
  python = hf4_python(repo_root)
  if not os.path.exists(python):
    return {
        "name": "hf-flax",
        "status": "unavailable",
        "reason": f"no transformers-4.x virtualenv at {python}: create it as in "
        f"docs/performance.md, or set BERTJAX_HF4_PYTHON",
    }
  return _run_script("hf-flax", python, "hf-flax", spec, timeout_s, keras=False)


def _run_script(
    name: str, python: str, peer: str, spec: dict, timeout_s: float, keras: bool
) -> dict:
  """`python bench_peers.py PEER '<json spec>'` with the XLA flags bertjax ran with; the
  child's last JSON line, or a "failed" answer with the tail of its output."""
  # the other virtualenv must not see this one's packages; keras-hub's Python is this one
  # unless BERTJAX_KERAS_HUB_PYTHON says otherwise, and it was looked for on this path
  dropped = ("XLA_FLAGS",) if keras else ("XLA_FLAGS", "PYTHONPATH")
  env = {k: v for k, v in os.environ.items() if k not in dropped}
  env["XLA_FLAGS"] = spec.get("xla_flags", "")  # the same XLA flags bertjax ran with
  env["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS", "")
  if keras:  # Keras reads its backend once, at import: the child's alone
    env["KERAS_BACKEND"] = "jax"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keras-hub imports TensorFlow (text ops)
  try:
    proc = subprocess.run(
        [python, os.path.abspath(__file__), peer, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
  except subprocess.TimeoutExpired:
    return {"name": name, "status": "failed", "reason": f"timed out after {timeout_s:.0f} s"}
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode != 0 or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {
        "name": name,
        "status": "failed",
        "reason": f"{python} exited {proc.returncode}: {' | '.join(tail)}"[:500],
    }
  return json.loads(lines[-1])


SCRIPT_PEERS = ("hf-flax", "keras-hub", "keras-hub-finetune")


def _script_main(argv: list[str]) -> int:
  if len(argv) != 2 or argv[0] not in SCRIPT_PEERS:
    print(f"usage: bench_peers.py {'|'.join(SCRIPT_PEERS)} '<json spec>'", file=sys.stderr)
    return 2
  peer, spec = argv[0], json.loads(argv[1])
  name = peer.removesuffix("-finetune")
  try:
    if peer == "hf-flax":
      result = run_flax_inline(spec)
    elif peer == "keras-hub":
      result = run_keras_inline(spec)
    else:
      with np.load(spec["data"]) as z:
        split = lambda s: {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(s + "/")}
        train, dev = split("train"), split("dev")
      result = run_keras_finetune_inline(spec, train, dev)
  except ImportError as e:
    needs = (
        "this virtualenv needs 'transformers<5' flax jax optax"
        if peer == "hf-flax"
        else KERAS_HUB_INSTALL
    )
    result = {"name": name, "status": "unavailable", "reason": f"{e}; {needs}"}
  except Exception as e:  # reported by the parent, never a crash
    result = {"name": name, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:500]}
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(_script_main(sys.argv[1:]))
