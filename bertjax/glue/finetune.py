"""Restore a pretrained encoder and fine-tune it on one task with the BERT recipe.

    enc = restore.load_encoder("runs/base")   # or a HF / Google BERT dir, or "random"
    run = finetune.train_and_evaluate(task, enc, feats, finetune.Recipe(), "out/sst2")

Data-parallel over every device there is (`sharding.make_mesh(data=-1)`); the batch (32) is
global. The state is built from `jax.eval_shape` with shardings from the model's logical axes
and created by a jitted init that takes the restored encoder as an argument, so the encoder
goes straight from the checkpoint to its place. Steps are jitted with explicit shardings and
donate the old state. No mesh context or logical-axis rules are entered around the steps: the
jit shardings place the batch and the parameters and XLA propagates the rest (under the rules,
flax's parameter shape check trips over DenseGeneral's flat [H, 3*N*D] init, see docs/glue.md).

After each epoch the dev splits are scored; the best epoch (by the task's main metric) is kept
on device for the test predictions and saved under `workdir/best/` (orbax) + `best.json`.

Shape letters: B batch, L sequence length, C classes (1 for regression).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import model as model_lib, optim, sharding
from bertjax.glue import features, metrics, tasks
from bertjax.glue.restore import Encoder


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Fine-tuning hyperparameters; the defaults are BERT's GLUE recipe."""

  learning_rate: float = 2e-5  # BERT searched {5e-5, 4e-5, 3e-5, 2e-5}
  epochs: int = 3
  batch_size: int = 32  # global, split over all devices
  eval_batch_size: int = 64  # global; only memory depends on it
  warmup_fraction: float = 0.1  # of all steps, then linear decay to 0
  weight_decay: float = 0.01  # AdamW, masked off biases and LayerNorm
  dropout: float = 0.1  # hidden and attention dropout, replacing the checkpoint's
  clip_norm: float = 1.0  # global-norm clipping, as BERT's optimizer
  seed: int = 0  # head init, dropout and data order
  max_steps: int = 0  # > 0 caps the steps per epoch (smoke tests)


@flax.struct.dataclass
class State:
  step: jax.Array
  params: Any  # {"bert": ..., "classifier": ...}
  opt_state: Any
  rng: jax.Array  # dropout key; step keys are fold_in(rng, step)
  learning_rate: jax.Array  # peak learning rate: a value, not a constant, so one compiled
  # step serves every run of a sweep


def make_optimizer(recipe: Recipe, total_steps: int) -> optax.GradientTransformation:
  """AdamW (β 0.9/0.999, ε 1e-6, decay masked off biases and LayerNorm) with the warmup/decay
  shape peaking at 1; the train step scales the update by the state's peak learning rate."""
  warmup = int(recipe.warmup_fraction * total_steps)
  shape = optim.warmup_linear_decay(1.0, warmup, total_steps)
  return optax.chain(optax.clip_by_global_norm(recipe.clip_norm),
                     optax.adamw(shape, b1=0.9, b2=0.999, eps=1e-6,
                                 weight_decay=recipe.weight_decay, mask=optim.decay_mask))


def _init(model, tx, bert_params, key, learning_rate):
  z = jnp.zeros((1, 8), jnp.int32)
  params_key, dropout_key = jax.random.split(key)
  boxed = model.init({"params": params_key}, z, z, jnp.ones_like(z))["params"]
  params = nn.unbox(boxed)
  if bert_params is not None:
    params = {**params, "bert": bert_params}  # the head stays new
  return boxed, State(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=dropout_key, learning_rate=jnp.asarray(learning_rate, jnp.float32))


def _loss(logits_BxC, labels_B, weights_B, regression: bool):
  if regression:
    per_example_B = jnp.square(logits_BxC[:, 0] - labels_B.astype(jnp.float32))
  else:
    per_example_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC,
                                                                    labels_B.astype(jnp.int32))
  return jnp.sum(per_example_B * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)


def _train_step(state: State, batch: dict, *, model, tx, regression: bool):
  key = jax.random.fold_in(state.rng, state.step)

  def loss_fn(params):
    logits_BxC = model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                             batch["attention_mask"], deterministic=False,
                             rngs={"dropout": key})
    return _loss(logits_BxC, batch["labels"], batch["weights"], regression)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  updates = jax.tree.map(lambda u: u * state.learning_rate, updates)
  return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                       opt_state=opt_state), loss


def _predict_step(params, batch: dict, *, model):
  return model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                     batch["attention_mask"], deterministic=True)


class Trainer:
  """The model, optimizer, shardings and jitted steps for one (task, encoder, recipe)."""

  def __init__(self, task: tasks.Task, enc: Encoder, recipe: Recipe, total_steps: int):
    self.mesh = sharding.make_mesh(data=-1)
    shards = sharding.num_batch_shards(self.mesh)
    for name in ("batch_size", "eval_batch_size"):
      if getattr(recipe, name) % (shards * jax.process_count()):
        raise ValueError(f"glue: {name}={getattr(recipe, name)} is not divisible by the "
                         f"{shards} batch shards of this mesh; change --batch-size")
    # Fine-tuning runs unscanned, without remat, at the recipe's dropout.
    self.cfg = enc.config.replace(hidden_dropout_rate=recipe.dropout,
                                  attention_dropout_rate=recipe.dropout, scan_layers=False,
                                  remat="none")
    self.model = model_lib.BertForSequenceClassification(self.cfg, task.num_labels)
    self.tx = make_optimizer(recipe, total_steps)
    self.bert_params = enc.bert_params
    bert_abs = None
    if enc.bert_params is not None:
      bert_abs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.float32),
                              enc.bert_params)
    boxed_abs, state_abs = jax.eval_shape(functools.partial(_init, self.model, self.tx),
                                          bert_abs, jax.random.key(0), 0.0)
    _check_encoder(boxed_abs["bert"], bert_abs, enc.source)
    param_sh = sharding.state_shardings(boxed_abs, self.mesh)
    repl = sharding.replicated(self.mesh)
    opt_sh = optax.tree_utils.tree_map_params(
        self.tx, lambda _, s: s, state_abs.opt_state, param_sh,
        transform_non_params=lambda _: repl,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    self.state_sh = State(step=repl, params=param_sh, opt_state=opt_sh, rng=repl,
                          learning_rate=repl)
    self.param_sh, self.batch_sh = param_sh, sharding.batch_sharding(self.mesh)
    self._init = jax.jit(lambda b, k, lr: _init(self.model, self.tx, b, k, lr)[1],
                         in_shardings=(None if bert_abs is None else param_sh["bert"], repl,
                                       repl),
                         out_shardings=self.state_sh)
    self._train = jax.jit(functools.partial(_train_step, model=self.model, tx=self.tx,
                                            regression=task.is_regression),
                          in_shardings=(self.state_sh, self.batch_sh),
                          out_shardings=(self.state_sh, repl), donate_argnums=0)
    self._predict = jax.jit(functools.partial(_predict_step, model=self.model),
                            in_shardings=(param_sh, self.batch_sh), out_shardings=repl)

  def init_state(self, seed: int, learning_rate: float) -> State:
    """A fresh state: the restored encoder (resharded from wherever the checkpoint put it),
    a new head from `seed`."""
    bert = None
    if self.bert_params is not None:
      bert = jax.device_put(jax.tree.map(lambda x: np.asarray(x, np.float32)
                                         if not isinstance(x, jax.Array) else x,
                                         self.bert_params), self.param_sh["bert"])
    return self._init(bert, jax.random.key(seed), np.float32(learning_rate))

  def train_step(self, state: State, batch: dict) -> tuple[State, jax.Array]:
    return self._train(state, _to_global(batch, self.batch_sh))

  def predict(self, params, feats: features.Features, batch_size: int) -> np.ndarray:
    """[N, C] float32 logits of every example (the last batch padded, the padding dropped)."""
    out = []
    n = len(feats)
    for start in range(0, n, batch_size):
      idx = np.arange(start, start + batch_size) % n  # wrap-around pads the last batch
      batch = _rows(feats, idx, np.ones(batch_size, np.float32))
      out.append(np.asarray(self._predict(params, _to_global(batch, self.batch_sh))))
    return np.concatenate(out)[:n] if out else np.zeros((0, self.model.num_labels), np.float32)


def _check_encoder(want_boxed, got_abs, source: str) -> None:
  if got_abs is None:
    return
  want = dict(jax.tree_util.tree_leaves_with_path(nn.unbox(want_boxed)))
  got = dict(jax.tree_util.tree_leaves_with_path(got_abs))
  for path, w in want.items():
    name = "bert/" + "/".join(str(getattr(p, "key", p)) for p in path)
    if path not in got:
      raise ValueError(f"glue: {source}: encoder has no {name}")
    if tuple(got[path].shape) != tuple(w.shape):
      raise ValueError(f"glue: {source}: {name} has shape {tuple(got[path].shape)}, its config "
                       f"implies {tuple(w.shape)}")


def _rows(feats: features.Features, idx: np.ndarray, weights: np.ndarray) -> dict:
  labels = feats.labels_N[idx] if feats.labels_N is not None else np.zeros(len(idx), np.float32)
  return dict(input_ids=feats.input_ids_NxL[idx], token_type_ids=feats.token_type_ids_NxL[idx],
              attention_mask=feats.attention_mask_NxL[idx],
              labels=labels.astype(np.float32), weights=weights)


def _to_global(batch: dict, sh) -> dict:
  """Every process holds the whole global batch (GLUE fits in host memory); each gives its
  slice of rows."""
  pi, pc = jax.process_index(), jax.process_count()
  out = {}
  for k, v in batch.items():
    per = v.shape[0] // pc
    out[k] = jax.make_array_from_process_local_data(sh, v[pi * per:(pi + 1) * per], v.shape)
  return out


def predictions(task: tasks.Task, logits_NxC: np.ndarray) -> np.ndarray:
  """Class ids (argmax), or the regression score."""
  return logits_NxC[:, 0] if task.is_regression else np.argmax(logits_NxC, axis=-1)


# ------------------------------------------------------------------------------------ the loop


@dataclasses.dataclass
class RunResult:
  dev: dict[str, float]  # the best epoch's dev metrics
  best_epoch: int
  history: list[dict]  # per epoch: epoch, train_loss, dev metrics, seconds
  test: dict[str, np.ndarray]  # test split name -> predictions of the best epoch
  workdir: str


def train_and_evaluate(task: tasks.Task, enc: Encoder, data: dict[str, features.Features],
                       recipe: Recipe, workdir: str, progress: bool = True,
                       save_checkpoint: bool = True) -> RunResult:
  """Fine-tune for `recipe.epochs`, score the dev splits after each, predict the test splits
  with the best epoch. `data` holds "train", the task's dev splits and any test splits."""
  os.makedirs(workdir, exist_ok=True)
  train = data["train"]
  for split in ("train",) + tuple(s.name for s in task.dev):
    if len(data[split]) == 0:
      raise ValueError(f"glue: {task.name}: the {split} split has no usable rows")
  steps_per_epoch = -(-len(train) // recipe.batch_size)  # the last batch is padded, weight 0
  if recipe.max_steps:
    steps_per_epoch = min(steps_per_epoch, recipe.max_steps)
  trainer = _trainer(task, enc, recipe, recipe.epochs * steps_per_epoch)
  state = trainer.init_state(recipe.seed, recipe.learning_rate)
  rng = np.random.default_rng(recipe.seed)
  history, best, best_params = [], None, None
  log = open(os.path.join(workdir, "metrics.jsonl"), "w")
  for epoch in range(1, recipe.epochs + 1):
    t0 = time.time()
    order = rng.permutation(len(train))
    losses = []
    bar = _progress(steps_per_epoch, f"{task.name} epoch {epoch}/{recipe.epochs}", progress)
    for step in range(steps_per_epoch):
      idx = order[step * recipe.batch_size:(step + 1) * recipe.batch_size]
      weights = np.ones(recipe.batch_size, np.float32)
      weights[len(idx):] = 0.0
      idx = np.resize(idx, recipe.batch_size)  # pad by repeating rows; their weight is 0
      state, loss = trainer.train_step(state, _rows(train, idx, weights))
      losses.append(loss)
      if len(losses) >= 2:  # read the loss one step late: the device never waits on the host
        bar.set_postfix(loss=f"{float(losses[-2]):.4f}", refresh=False)
      bar.update(1)
    bar.close()
    train_loss = float(np.mean([float(l) for l in losses]))
    dev = evaluate(trainer, task, state.params, data, recipe.eval_batch_size)
    entry = dict(epoch=epoch, train_loss=train_loss, **dev, seconds=round(time.time() - t0, 1))
    history.append(entry)
    log.write(json.dumps(entry) + "\n")
    log.flush()
    improved = best is None or dev[task.main_metric] > best[task.main_metric]
    print(f"glue: {task.name} epoch {epoch}: train_loss {train_loss:.4f} "
          + " ".join(f"{k} {v:.4f}" for k, v in dev.items()) + (" (best)" if improved else ""),
          flush=True)
    if improved:
      best = dict(dev, epoch=epoch)
      best_params = jax.tree.map(jnp.copy, state.params)  # the step donates state.params
      if save_checkpoint:
        _save_best(workdir, best_params, trainer.cfg, task, enc, recipe, best)
  log.close()
  test = {}
  for split in task.test:
    if split.name in data:
      logits = trainer.predict(best_params, data[split.name], recipe.eval_batch_size)
      test[split.name] = predictions(task, logits)
  best_epoch = best.pop("epoch")
  return RunResult(dev=best, best_epoch=best_epoch, history=history, test=test, workdir=workdir)


_TRAINER_CACHE: dict = {}


def _trainer(task: tasks.Task, enc: Encoder, recipe: Recipe, total_steps: int) -> Trainer:
  """The Trainer of the last run if only the learning rate and seed changed (a sweep): its
  steps are compiled already."""
  key = (task.name, task.num_labels, task.is_regression, id(enc), total_steps,
         dataclasses.replace(recipe, learning_rate=0.0, seed=0))
  if key not in _TRAINER_CACHE:
    _TRAINER_CACHE.clear()  # one at a time: a finished task's compiled steps are not kept
    _TRAINER_CACHE[key] = Trainer(task, enc, recipe, total_steps)
  return _TRAINER_CACHE[key]


def evaluate(trainer: Trainer, task: tasks.Task, params, data: dict[str, features.Features],
             batch_size: int) -> dict[str, float]:
  out = {}
  for split in task.dev:
    feats = data[split.name]
    pred = predictions(task, trainer.predict(params, feats, batch_size))
    out.update(metrics.compute(task, split, pred, feats.labels_N))
  return out


def _progress(total: int, desc: str, enabled: bool):
  from tqdm import tqdm

  return tqdm(total=total, desc=desc, disable=not enabled or jax.process_index() != 0,
              leave=True, dynamic_ncols=True)


def _save_best(workdir: str, params, cfg: model_lib.BertConfig, task: tasks.Task, enc: Encoder,
               recipe: Recipe, dev: dict) -> None:
  """The best epoch's classifier: orbax params under best/, what it is in best.json."""
  import orbax.checkpoint as ocp

  path = os.path.abspath(os.path.join(workdir, "best"))
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path, params, force=True)
  if jax.process_index() == 0:
    meta = dict(task=task.name, labels=list(task.labels) if task.labels else None,
                num_labels=task.num_labels, init=enc.source, recipe=dataclasses.asdict(recipe),
                dev=dev, config=cfg.to_dict(),
                tokenizer=str(getattr(enc.tokenizer, "path", "")))
    with open(os.path.join(workdir, "best.json"), "w") as f:
      json.dump(meta, f, indent=2)
