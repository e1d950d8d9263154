"""`bert_adamw` and the `bert` schedule against google-research/bert's optimization.py, run (never
copied) under tf.compat.v1: the same parameters, named as in Google's checkpoints so that its
exclude_from_weight_decay regexes meet its own names, the same gradients, step by step."""

from unittest import mock

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.interop import convert, google_ckpt
from bertjax.training import optim
from experiments import pretrain

STEPS, WARMUP, PEAK = 10, 3, 1e-2  # a short run of BERT's schedule; lr large enough to measure


def _tiny():
  cfg = model_lib.from_preset("tiny", vocab_size=64, max_position_embeddings=32)
  d = model_lib.dummy_inputs()
  params = nn.unbox(
      jax.jit(model_lib.BertForPreTraining(cfg).init)(
          jax.random.key(0),
          d["input_ids"],
          d["token_type_ids"],
          d["attention_mask"],
          d["masked_positions"],
      )["params"]
  )
  return cfg, params


def _google_named(tree, cfg) -> dict[str, np.ndarray]:
  """A parameter-shaped tree as Google's variables (name -> array in their layout)."""
  state = convert.params_to_hf(tree, cfg)
  del state["cls.predictions.decoder.weight"], state["cls.predictions.decoder.bias"]  # tied
  out = {}
  for hf_name, value in state.items():
    name, transpose = google_ckpt.hf_to_google_name(hf_name)
    out[name] = np.ascontiguousarray(value.T if transpose else value)
  return out


def _config():
  c = pretrain.get_config("base")  # the paper recipe: bert_adamw on the bert schedule
  c.train.steps, c.train.warmup_steps, c.train.learning_rate = STEPS, WARMUP, PEAK
  return c


def _create_optimizer(
    opt, tf, variables: dict, grads_ph: dict, steps: int, warmup: int, peak: float
):
  """create_optimizer on the loss sum(g * w), whose gradient is the fed g: (train_op, lr)."""
  loss = tf.add_n([tf.reduce_sum(grads_ph[n] * v) for n, v in variables.items()])
  init, learning_rates = opt.AdamWeightDecayOptimizer.__init__, []

  def recording_init(self, learning_rate, **kw):  # keeps the tensor create_optimizer builds
    learning_rates.append(learning_rate)
    init(self, learning_rate=learning_rate, **kw)

  with mock.patch.object(opt.AdamWeightDecayOptimizer, "__init__", recording_init):
    train_op = opt.create_optimizer(loss, peak, steps, warmup, use_tpu=False)
  return train_op, learning_rates[0]


@pytest.mark.slow
def test_bert_adamw_steps_as_create_optimizer(bert_reference):
  """8 steps of clipping + schedule + AdamWeightDecayOptimizer; gradients of global norm below
  and above the clip; our updates (the scanned layout, as the paper recipe) <= 1e-6 of theirs."""
  opt = bert_reference("optimization")
  tf = pytest.importorskip("tensorflow").compat.v1
  cfg, params = _tiny()
  rng = np.random.default_rng(0)
  grads_seq = []
  for norm in (0.5, 3.0, 0.9, 10.0, 0.2, 2.0, 1.5, 0.7):
    g = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), params)
    scale = norm / float(
        np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in jax.tree.leaves(g)))
    )
    grads_seq.append(jax.tree.map(lambda x: (x * scale).astype(np.float32), g))
  start = _google_named(params, cfg)
  assert sum(x.size for x in start.values()) == model_lib.count_params(params)  # all, once

  graph = tf.Graph()
  with graph.as_default():
    variables = {n: tf.get_variable(n, initializer=tf.constant(x)) for n, x in start.items()}
    grads_ph = {n: tf.placeholder(tf.float32, x.shape) for n, x in start.items()}
    train_op, _ = _create_optimizer(opt, tf, variables, grads_ph, STEPS, WARMUP, PEAK)
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      theirs = []
      for grads in grads_seq:
        before = sess.run(variables)
        sess.run(train_op, {grads_ph[n]: g for n, g in _google_named(grads, cfg).items()})
        after = sess.run(variables)
        # Their update, and the float32 resolution it is read at (one ulp of the new param).
        theirs.append(
            {
                n: (after[n].astype(np.float64) - before[n], np.abs(np.spacing(after[n])))
                for n in variables
            }
        )

  c = _config()
  tx = optim.make_optimizer(c.train, optim.make_schedule(c.train, c.phase2))
  stack = lambda tree: model_lib.stack_layer_params(tree, cfg.num_layers)
  ours_params = stack(params)
  state = tx.init(ours_params)
  for step, (grads, theirs_step) in enumerate(zip(grads_seq, theirs)):
    updates, state = tx.update(stack(grads), state, ours_params)
    ours_params = jax.tree.map(lambda p, u: p + u, ours_params, updates)
    for name, got in _google_named(updates, cfg).items():
      want, ulp = theirs_step[name]
      # <= 1e-6 of the variable's largest update (0 at step 0: lr 0 there, in both).
      err = np.abs(got - want) - ulp
      assert err.max() <= 1e-6 * np.abs(want).max(), (step, name, err.max(), np.abs(want).max())


@pytest.mark.parametrize(
    "step", [0, 1, 5_000, 9_999, 10_000, 10_001, 500_000, 900_000, 999_999, 1_000_000]
)
def test_bert_schedule_is_create_optimizers_learning_rate(bert_reference, step):
  """The paper recipe's schedule (1M steps, 10k warmup, one schedule over both phases) against
  create_optimizer's learning-rate tensor at that global step."""
  opt = bert_reference("optimization")
  tf = pytest.importorskip("tensorflow").compat.v1
  c = pretrain.get_config("base")
  graph = tf.Graph()
  with graph.as_default():
    w = {"bert/pooler/dense/kernel": tf.get_variable("bert/pooler/dense/kernel", [2])}
    g = {"bert/pooler/dense/kernel": tf.placeholder(tf.float32, [2])}
    _, lr = _create_optimizer(
        opt, tf, w, g, c.train.steps, c.train.warmup_steps, c.train.learning_rate
    )
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(tf.train.get_global_step().assign(step))
      want = sess.run(lr)
  got = float(optim.make_schedule(c.train, c.phase2)(step))
  assert got == pytest.approx(float(want), rel=1e-6, abs=1e-12)
