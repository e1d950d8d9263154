"""bertjax's side of the peers of `bertjax bench --compare` (peers.py has what a peer is).

The PyTorch peers run in this process: hf-torch and hf-torch-compile (`run_torch`), and the
fine-tuning epoch of `bertjax bench finetune` (`run_torch_finetune`, and `run_torch_flat_finetune`
on flattened rows). hf-flax and keras-hub run peers.py as a script in a child process
(`run_flax_subprocess`, `run_keras_subprocess`, `run_keras_finetune_subprocess`): their one
JSON line is the answer, a missing Python or package is "unavailable".
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from bertjax.bench import peers
from bertjax.bench.peers import (
    FIRST_TOKEN_ID,
    hf_config,
    KERAS_HUB_INSTALL,
    mlm_labels,
    synthetic_batch,
    throughput,
    time_steps,
)

# The hf-flax virtualenv, relative to the repository root (overridable with BERTJAX_HF4_PYTHON).
HF4_VENV_PYTHON = os.path.join(".venv-hf4", "bin", "python")


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
    model = transformers.BertForPreTraining(hf_config(transformers, spec)).train()
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
  return throughput(
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
    cfg = hf_config(
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
  hf = hf_config(transformers, spec)
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
        [python, os.path.abspath(peers.__file__), peer, json.dumps(spec)],
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
