"""Per-token heads on the BERT encoder, and the fine-tuning loop they share (SQuAD, NER).

    model = heads.BertForQuestionAnswering(cfg)             # start/end logits [B, L]
    model = heads.BertForTokenClassification(cfg, num_labels)  # logits [B, L, C]
    trainer = heads.HeadTrainer(make_model, enc, recipe, total_steps, loss_fn, "squad")
    result = heads.fit(trainer, arrays, recipe, evaluate, "f1", workdir, "squad")

Both modules hold the encoder as the submodule "bert", so their "bert" parameter subtree is the
one of `BertForPreTraining` and a pretrained encoder drops in unchanged; the head is new.

`HeadTrainer` is GLUE's `finetune.Trainer` with the model and the loss as arguments: the same
optimizer recipe (`finetune.make_optimizer`), state layout (`finetune.State`), init from the
restored encoder, data-parallel mesh over every device and explicit jit shardings. Batches are
dicts of host numpy arrays with the global batch on the leading axis.

Shape letters: B batch, L sequence length, H hidden size, C classes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import model as model_lib, sharding
from bertjax.glue import finetune
from bertjax.glue.restore import Encoder

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


class BertForQuestionAnswering(nn.Module):
  """google-research/bert's SQuAD head: one dense layer from each token to (start, end)."""

  cfg: model_lib.BertConfig

  @nn.compact
  def __call__(self, input_ids_BxL, token_type_ids_BxL=None, attention_mask_BxL=None, *,
               deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
    enc = model_lib.BertModel(self.cfg, name="bert")(
        input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic)
    logits_BxLx2 = nn.Dense(2, dtype=self.cfg.compute_dtype, param_dtype=self.cfg.params_dtype,
                            kernel_init=model_lib._init(self.cfg, ("embed", "classes")),
                            bias_init=model_lib._zeros(("classes",)),
                            name="qa_outputs")(enc.sequence_output)
    logits_BxLx2 = logits_BxLx2.astype(jnp.float32)
    return logits_BxLx2[..., 0], logits_BxLx2[..., 1]


class BertForTokenClassification(nn.Module):
  """Dropout + dense from each token's last hidden state to `num_labels` tag logits."""

  cfg: model_lib.BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids_BxL, token_type_ids_BxL=None, attention_mask_BxL=None, *,
               deterministic: bool = True) -> jax.Array:
    enc = model_lib.BertModel(self.cfg, name="bert")(
        input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic)
    x_BxLxH = nn.Dropout(self.cfg.hidden_dropout_rate)(enc.sequence_output,
                                                       deterministic=deterministic)
    logits_BxLxC = nn.Dense(self.num_labels, dtype=self.cfg.compute_dtype,
                            param_dtype=self.cfg.params_dtype,
                            kernel_init=model_lib._init(self.cfg, ("embed", "classes")),
                            bias_init=model_lib._zeros(("classes",)), name="classifier")(x_BxLxH)
    return logits_BxLxC.astype(jnp.float32)


# ------------------------------------------------------------------------------- the trainer

LossFn = Callable[[Any, dict], jax.Array]  # (model outputs, batch) -> mean loss


def _train_step(state: finetune.State, batch: dict, *, model, tx, loss_fn: LossFn):
  key = jax.random.fold_in(state.rng, state.step)

  def loss_of(params):
    out = model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=False,
                      rngs={"dropout": key})
    return loss_fn(out, batch)

  loss, grads = jax.value_and_grad(loss_of)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  updates = jax.tree.map(lambda u: u * state.learning_rate, updates)
  return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                       opt_state=opt_state), loss


def _predict_step(params, batch: dict, *, model):
  return model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=True)


class HeadTrainer:
  """Model, optimizer, shardings and jitted steps for one (head, encoder, recipe)."""

  def __init__(self, make_model: Callable[[model_lib.BertConfig], nn.Module], enc: Encoder,
               recipe: finetune.Recipe, total_steps: int, loss_fn: LossFn, name: str):
    self.name = name
    self.mesh = sharding.make_mesh(data=-1)
    shards = sharding.num_batch_shards(self.mesh) * jax.process_count()
    for field in ("batch_size", "eval_batch_size"):
      if getattr(recipe, field) % shards:
        raise ValueError(f"{name}: --{field.replace('_', '-')}={getattr(recipe, field)} is not "
                         f"divisible by the {shards} batch shards; use a multiple of {shards}")
    self.cfg = enc.config.replace(hidden_dropout_rate=recipe.dropout,
                                  attention_dropout_rate=recipe.dropout, scan_layers=False,
                                  remat="none")
    self.model = make_model(self.cfg)
    self.tx = finetune.make_optimizer(recipe, total_steps)
    self.bert_params = enc.bert_params
    bert_abs = None
    if enc.bert_params is not None:
      bert_abs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.float32),
                              enc.bert_params)
    boxed_abs, state_abs = jax.eval_shape(functools.partial(finetune._init, self.model, self.tx),
                                          bert_abs, jax.random.key(0), 0.0)
    finetune._check_encoder(boxed_abs["bert"], bert_abs, enc.source)
    param_sh = sharding.state_shardings(boxed_abs, self.mesh)
    repl = sharding.replicated(self.mesh)
    opt_sh = optax.tree_utils.tree_map_params(
        self.tx, lambda _, s: s, state_abs.opt_state, param_sh,
        transform_non_params=lambda _: repl,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    self.state_sh = finetune.State(step=repl, params=param_sh, opt_state=opt_sh, rng=repl,
                                   learning_rate=repl)
    self.param_sh, self.batch_sh = param_sh, sharding.batch_sharding(self.mesh)
    self._init = jax.jit(lambda b, k, lr: finetune._init(self.model, self.tx, b, k, lr)[1],
                         in_shardings=(None if bert_abs is None else param_sh["bert"], repl,
                                       repl),
                         out_shardings=self.state_sh)
    self._train = jax.jit(functools.partial(_train_step, model=self.model, tx=self.tx,
                                            loss_fn=loss_fn),
                          in_shardings=(self.state_sh, self.batch_sh),
                          out_shardings=(self.state_sh, repl), donate_argnums=0)
    self._predict = jax.jit(functools.partial(_predict_step, model=self.model),
                            in_shardings=(param_sh, self.batch_sh), out_shardings=repl)

  def init_state(self, seed: int, learning_rate: float) -> finetune.State:
    """The restored encoder (placed on this mesh) and a new head from `seed`."""
    bert = None
    if self.bert_params is not None:
      bert = jax.device_put(jax.tree.map(lambda x: x if isinstance(x, jax.Array)
                                         else np.asarray(x, np.float32), self.bert_params),
                            self.param_sh["bert"])
    return self._init(bert, jax.random.key(seed), np.float32(learning_rate))

  def train_step(self, state: finetune.State, batch: dict) -> tuple[finetune.State, jax.Array]:
    return self._train(state, finetune._to_global(batch, self.batch_sh))

  def predict(self, params, arrays: dict[str, np.ndarray], batch_size: int, progress=False):
    """The model's outputs for every row of `arrays` as numpy, [N, ...] per leaf."""
    n = len(arrays["input_ids"])
    out = []
    bar = finetune._progress(-(-n // batch_size), f"{self.name} predict", progress)
    for start in range(0, n, batch_size):
      idx = np.arange(start, start + batch_size) % n  # wrap-around pads the last batch
      batch = {k: arrays[k][idx] for k in MODEL_INPUTS}
      out.append(jax.tree.map(np.asarray,
                              self._predict(params, finetune._to_global(batch, self.batch_sh))))
      bar.update(1)
    bar.close()
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:n], *out)


# ---------------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class FitResult:
  best: dict[str, float]  # the best epoch's dev metrics
  best_epoch: int
  best_params: Any  # on device
  history: list[dict]  # per epoch (0 = before training, if asked): train_loss, dev metrics


def fit(trainer: HeadTrainer, train: dict[str, np.ndarray], recipe: finetune.Recipe,
        evaluate: Callable[[Any], dict[str, float]], main_metric: str, workdir: str,
        eval_untrained: bool = False, progress: bool = True) -> FitResult:
  """Train for `recipe.epochs` on the rows of `train`, scoring `evaluate(params)` after each
  epoch; the epoch with the highest `main_metric` is kept. Writes workdir/metrics.jsonl."""
  os.makedirs(workdir, exist_ok=True)
  n = len(train["input_ids"])
  steps = steps_per_epoch(n, recipe)
  state = trainer.init_state(recipe.seed, recipe.learning_rate)
  rng = np.random.default_rng(recipe.seed)
  history, best, best_params = [], None, None
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as log:
    if eval_untrained:
      entry = dict(epoch=0, **evaluate(state.params))
      history.append(entry)
      log.write(json.dumps(entry) + "\n")
      print(f"{trainer.name}: untrained: " + _fmt(entry), flush=True)
    for epoch in range(1, recipe.epochs + 1):
      t0 = time.time()
      order = rng.permutation(n)
      losses = []
      bar = finetune._progress(steps, f"{trainer.name} epoch {epoch}/{recipe.epochs}",
                               progress)
      for step in range(steps):
        idx = order[step * recipe.batch_size:(step + 1) * recipe.batch_size]
        weights = np.ones(recipe.batch_size, np.float32)
        weights[len(idx):] = 0.0
        idx = np.resize(idx, recipe.batch_size)  # pad by repeating rows; their weight is 0
        batch = {k: v[idx] for k, v in train.items()}
        state, loss = trainer.train_step(state, dict(batch, weights=weights))
        losses.append(loss)
        if len(losses) >= 2:  # read one step late: the device never waits on the host
          bar.set_postfix(loss=f"{float(losses[-2]):.4f}", refresh=False)
        bar.update(1)
      bar.close()
      dev = evaluate(state.params)
      entry = dict(epoch=epoch, train_loss=float(np.mean([float(l) for l in losses])), **dev,
                   seconds=round(time.time() - t0, 1))
      history.append(entry)
      log.write(json.dumps(entry) + "\n")
      log.flush()
      improved = best is None or dev[main_metric] > best[main_metric]
      print(f"{trainer.name}: epoch {epoch}: " + _fmt(entry) + (" (best)" if improved else ""),
            flush=True)
      if improved:
        best, best_epoch = dev, epoch
        best_params = jax.tree.map(jnp.copy, state.params)  # the step donates state.params
  return FitResult(best=best, best_epoch=best_epoch, best_params=best_params, history=history)


def steps_per_epoch(n: int, recipe: finetune.Recipe) -> int:
  steps = -(-n // recipe.batch_size)  # the last batch is padded, weight 0
  return min(steps, recipe.max_steps) if recipe.max_steps else steps


def _fmt(entry: dict) -> str:
  return " ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                  for k, v in entry.items() if k != "epoch")


def save_params(workdir: str, params, meta: dict) -> None:
  """The fine-tuned parameters (orbax) under workdir/best/, what they are in best.json."""
  import orbax.checkpoint as ocp

  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.abspath(os.path.join(workdir, "best")), params, force=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "best.json"), "w") as f:
      json.dump(meta, f, indent=2)


def masked_mean(per_example: jax.Array, weights: jax.Array) -> jax.Array:
  return jnp.sum(per_example * weights) / jnp.maximum(jnp.sum(weights), 1.0)
