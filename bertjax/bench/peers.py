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
benchmark reports both and carries on. bertjax's side of them, the PyTorch peers (run in
its process) and the child processes that run this file, is peer_runs.py.

This file imports nothing from bertjax (only NumPy at module level): the hf-flax peer runs it as
a script with the other virtualenv's Python: `python bench_peers.py hf-flax '<json spec>'`, the
keras-hub peers with this Python (or BERTJAX_KERAS_HUB_PYTHON's): `... keras-hub '<json spec>'`.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

PEERS = ("hf-torch", "hf-torch-compile", "hf-flax", "keras-hub")
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
  """The shape fields of a `BertConfig` that every peer's spec carries (`hf_config` reads them)."""
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


def throughput(result: dict, batch_size: int, seq_len: int) -> dict:
  result["seq_per_sec"] = batch_size * 1e3 / result["step_ms"]
  result["tokens_per_sec"] = result["seq_per_sec"] * seq_len
  return result


def hf_config(transformers, spec: dict):
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


def run_flax_inline(spec: dict) -> dict:
  """FlaxBertForPreTraining (transformers 4.x) + optax AdamW; runs inside the 4.x virtualenv."""
  import transformers  # the 4.x virtualenv's, only for this peer
  from transformers import FlaxBertForPreTraining

  model = FlaxBertForPreTraining(hf_config(transformers, spec), seed=0, dtype=jnp.float32)
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
  return throughput(
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
  return throughput(
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
