"""The contrastive objective (bertjax.training.objective_contrastive): its loss and gradients
equal sentence-transformers' MultipleNegativesRankingLoss on the same weights and batch, on one
device and on the 8-device mesh; the GradCache step's gradients equal the one-pass step's."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import errors
from bertjax.interop import convert, hf_config
from bertjax.training import config_checks, objective_contrastive as oc, sharding, train_state

B, LQ, LD, H = 8, 9, 12, 32  # queries, query length, document length, hidden width


@pytest.fixture(scope="module")
def torch_encoder(tmp_path_factory):
  """A random transformers BertModel (no dropout, no pooler) with every weight moved off its
  init in a SentenceTransformer with mean Pooling, and the same network as bertjax params."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")
  torch.manual_seed(0)
  hf_cfg = transformers.BertConfig(
      vocab_size=99,
      hidden_size=H,
      num_hidden_layers=2,
      num_attention_heads=4,
      intermediate_size=64,
      max_position_embeddings=64,
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
  )
  bert = transformers.BertModel(hf_cfg, add_pooling_layer=False)
  with torch.no_grad():
    for p in bert.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  path = tmp_path_factory.mktemp("bert")
  bert.save_pretrained(path)
  cfg, params = convert.load_hf(path)
  st = pytest.importorskip("sentence_transformers")

  class Transformer(torch.nn.Module):  # sentence-transformers' first module: token embeddings

    def __init__(self):
      super().__init__()
      self.bert = bert

    def forward(self, features):
      out = self.bert(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
      return dict(features, token_embeddings=out.last_hidden_state)

  model = st.SentenceTransformer(modules=[Transformer(), modules.Pooling(H, "mean")], device="cpu")
  encoder = {k: v for k, v in params["bert"].items() if k != "pooler"}  # pooling is not BERT's
  return model, cfg, {"bert": encoder}


def _texts(rng, rows, length):
  ids = rng.integers(5, 99, size=(rows, length)).astype(np.int32)
  mask = np.ones((rows, length), np.int32)
  for r in range(0, rows, 3):  # some rows padded
    mask[r, rng.integers(3, length) :] = 0
  return ids * mask, mask


def _batch(negatives: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  q_ids, q_mask = _texts(rng, B, LQ)
  docs = [_texts(rng, B, LD) for _ in range(1 + negatives)]
  return {
      "query_ids": q_ids,
      "query_mask": q_mask,
      "doc_ids": np.stack([d[0] for d in docs], 1),  # [B, D, Ld]: positive, negatives
      "doc_mask": np.stack([d[1] for d in docs], 1),
  }


def _st_loss_and_grads(model, batch, cached_rows: int = 0):
  """MultipleNegativesRankingLoss's loss and gradients (CachedMultipleNegativesRankingLoss's
  in mini-batches of `cached_rows`, when given), as a bertjax parameter tree."""
  import torch
  from sentence_transformers.sentence_transformer import losses

  feats = [dict(input_ids=batch["query_ids"], attention_mask=batch["query_mask"])]
  for d in range(batch["doc_ids"].shape[1]):
    feats.append(dict(input_ids=batch["doc_ids"][:, d], attention_mask=batch["doc_mask"][:, d]))
  feats = [{k: torch.tensor(v, dtype=torch.long) for k, v in f.items()} for f in feats]
  if cached_rows:
    loss_fn = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=cached_rows)
  else:
    loss_fn = losses.MultipleNegativesRankingLoss(model)
  model.zero_grad()
  loss = loss_fn(feats, None)
  loss.backward()
  bert = model[0].bert
  grads = {n: p.grad.numpy() for n, p in bert.named_parameters()}
  cfg = hf_config.config_from_hf(bert.config.to_dict())
  return float(loss.detach()), convert.hf_to_params(grads, cfg)["bert"]


def _grad_fn(obj, params, batch, mesh=None):
  """`obj.grad` jitted: on one device, or on `mesh` with the parameters sharded by their
  logical axes and the batch split over data x fsdp, as the train step places them."""
  counts = obj.counts(batch)
  fn = lambda p, b: obj.grad(p, b, jax.random.PRNGKey(0), counts)
  if mesh is None:
    return jax.jit(fn)(params, batch)
  boxed = jax.eval_shape(
      functools.partial(obj.model.init, jax.random.PRNGKey(0)), batch["query_ids"][:1]
  )["params"]
  p_sh = sharding.state_shardings(boxed, mesh)
  b_sh = sharding.batch_sharding(mesh)
  step = train_state.jit_step(
      fn, mesh, in_shardings=(p_sh, b_sh), out_shardings=sharding.replicated(mesh)
  )
  return step(jax.device_put(params, p_sh), jax.device_put(batch, b_sh))


def _close(ours, theirs, rtol, what):
  for (path, a), b in zip(
      jax.tree_util.tree_leaves_with_path(ours), jax.tree_util.tree_leaves(theirs)
  ):
    a, b = np.asarray(a), np.asarray(b)
    scale = max(np.abs(b).max(), 1e-8)
    err = np.abs(a - b).max() / scale
    assert err <= rtol, f"{what} {jax.tree_util.keystr(path)}: relative error {err:.2e}"


# The scale learned from 20: the same loss as MultipleNegativesRankingLoss's fixed 20, and the
# chunked step's gradient with respect to it is checked too.
SPEC = oc.Spec(learn_scale=True)


def _with_scale(params):
  return dict(params, log_scale=jnp.log(jnp.float32(SPEC.scale)))


@pytest.fixture(scope="module")
def on_mesh(torch_encoder):
  """The one-pass step's (sums, gradients) on the data x fsdp x tensor mesh of 8 devices, with
  one hard negative per row."""
  _, cfg, params = torch_encoder
  return _grad_fn(oc.Contrastive(cfg, SPEC), _with_scale(params), _batch(1), _mesh())


MESH = None  # made at first use, after conftest's 8 fake devices


def _mesh():
  global MESH
  MESH = MESH or sharding.make_mesh(2, 2, 2)
  return MESH


@pytest.mark.slow
@pytest.mark.parametrize("negatives", [0, 1])
def test_loss_and_gradients_equal_sentence_transformers(torch_encoder, on_mesh, negatives):
  """One device, and (with a hard negative) the 8-device mesh: the loss and every encoder
  gradient equal MultipleNegativesRankingLoss's (scale 20, cosine, mean pooling)."""
  encoder, cfg, params = torch_encoder
  batch = _batch(negatives)
  ref_loss, ref_grads = _st_loss_and_grads(encoder, batch)
  results = {"1 device": _grad_fn(oc.Contrastive(cfg, SPEC), _with_scale(params), batch)}
  if negatives:
    results["8-device mesh"] = on_mesh
  for where, (sums, grads) in results.items():
    loss = float(sums["contrastive_loss"] / sums["contrastive_count"])
    assert abs(loss - ref_loss) <= 1e-4, (where, loss, ref_loss)
    _close(grads["bert"], {k: ref_grads[k] for k in grads["bert"]}, 1e-4, where)
    assert float(sums["contrastive_count"]) == B


@pytest.mark.slow
def test_chunked_step_equals_one_pass(torch_encoder, on_mesh):
  """GradCache in chunks of 2 rows, on the 8-device mesh, against CachedMultipleNegativesRanking
  Loss in mini-batches of 2 (≤ 1e-4) and against the one-pass step: the same sums and
  gradients (the learned scale's included), with a hard negative."""
  model, cfg, params = torch_encoder
  chunked = oc.Contrastive(cfg, dataclasses.replace(SPEC, chunk_size=2))
  sums_c, grads_c = _grad_fn(chunked, _with_scale(params), _batch(1), _mesh())
  sums_1, grads_1 = on_mesh
  ref_loss, ref_grads = _st_loss_and_grads(model, _batch(1), cached_rows=2)
  assert abs(float(sums_c["contrastive_loss"]) / B - ref_loss) <= 1e-4
  _close(grads_c["bert"], {k: ref_grads[k] for k in grads_c["bert"]}, 1e-4, "vs Cached MNRL")
  _close(sums_c, sums_1, 1e-6, "sums")
  _close(grads_c["bert"], grads_1["bert"], 1e-5, "gradient")
  # The scale's gradient is a sum of O(1) terms that cancel to ~0.009: float32 rounding of the
  # chunks' embeddings moves it by ~7e-7 (7e-5 of it), the same absolute error as the others.
  _close(grads_c["log_scale"], grads_1["log_scale"], 2e-4, "the scale's gradient")
  assert float(np.abs(grads_1["log_scale"])) > 1e-3  # the scale really learns


def _embeddings(seed, rows, dim=16):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(rows, dim)).astype(np.float32)


@pytest.mark.slow  # importing sentence-transformers: ~10 s on the 2 cores
@pytest.mark.parametrize("symmetric", [False, True])
def test_loss_from_embeddings_equals_sentence_transformers(symmetric):
  """On embeddings: MultipleNegativesRankingLoss with one hard negative (and its symmetric
  "per_direction" form); the metrics counted by hand from the scores."""
  torch = pytest.importorskip("torch")
  losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
  q, pos, neg = (_embeddings(s, 6) for s in range(3))
  d_NxH = np.stack([pos, neg], 1).reshape(12, -1)  # row by row: positive, negative
  sums = oc.loss_sums(oc.Spec(symmetric=symmetric), q, d_NxH, jnp.float32(20.0), 0.0)
  directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
  mnrl = losses.MultipleNegativesRankingLoss(
      None, directions=directions, partition_mode="per_direction"
  )
  ref = mnrl.compute_loss_from_embeddings([torch.tensor(x) for x in (q, pos, neg)], None)
  assert abs(float(sums["contrastive_loss"]) / 6 - float(ref)) <= 1e-5
  cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
      d_NxH / np.linalg.norm(d_NxH, axis=1, keepdims=True)
  ).T
  rank = 1 + (cos > cos[np.arange(6), np.arange(6) * 2][:, None]).sum(1)
  assert float(sums["contrastive_rank"]) == rank.sum()
  assert float(sums["contrastive_correct"]) == (rank == 1).sum()


def test_sigmoid_and_matryoshka_losses():
  """SigLIP's loss (Zhai et al. 2023, eq. 1: -sum log sigmoid(z (t x.y + b)) over pairs, / B)
  written out in numpy; Matryoshka: the sum of the losses on each prefix."""
  q, d = _embeddings(0, 4), _embeddings(1, 8)  # two documents per row
  n = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  z = -np.ones((4, 8))
  z[np.arange(4), np.arange(4) * 2] = 1
  logits = 10.0 * n(q) @ n(d).T - 10.0
  want = -np.log(1 / (1 + np.exp(-z * logits))).sum()
  spec = oc.Spec(loss="sigmoid")
  got = oc.loss_sums(spec, q, d, jnp.float32(10.0), jnp.float32(-10.0))["contrastive_loss"]
  np.testing.assert_allclose(float(got), want, rtol=1e-5)

  one = lambda dim: float(
      oc.loss_sums(oc.Spec(), q[:, :dim], d[:, :dim], 20.0, 0.0)["contrastive_loss"]
  )
  both = oc.loss_sums(oc.Spec(matryoshka_dims=(8, 16)), q, d, 20.0, 0.0)
  np.testing.assert_allclose(float(both["contrastive_loss"]), one(16) + one(8), rtol=1e-5)


def test_config_refuses_microbatches_and_bad_options():
  from experiments import pretrain

  c = pretrain.get_config("tiny")
  c.objective = "contrastive"
  with pytest.raises(errors.ConfigError, match="set config.data.path=P"):
    config_checks.check_inputs(c, "run")
  c.train.microbatches = 2
  with pytest.raises(errors.ConfigError, match="config.contrastive.chunk_size"):
    config_checks.validate(c)
  c.train.microbatches = 1
  c.contrastive.pooling = "max"
  with pytest.raises(errors.ConfigError, match="contrastive.pooling='max': valid: mean, cls"):
    config_checks.validate(c)
  c.contrastive.pooling = "cls"
  c.contrastive.matryoshka_dims = (64, 2000)
  with pytest.raises(errors.ConfigError, match="2000 is not in 1..128"):
    oc.Spec.from_config(c, 128)


@pytest.mark.slow
def test_compile_the_chunked_step_needs_less_memory(capsys):
  """`bertjax compile --config contrastive` (a tiny network, batch 32 x seq 128, one hard
  negative, 2 devices): in chunks of 8 rows the step's temporaries are smaller."""
  from bertjax.commands import compile as compile_cmd

  temporaries = []
  for chunk in (0, 8):
    argv = ["--config", "contrastive", "--config.model.preset=tiny"]
    argv += ["--config.model.vocab_size=1000", "--config.train.batch_size=32"]
    argv += [f"--config.contrastive.chunk_size={chunk}", "--mesh", "data=2", "--devices", "2"]
    assert compile_cmd.main(argv) == 0
    out = capsys.readouterr().out
    assert "phase 1: contrastive" in out
    temporaries.append(float(out.split("temporaries ")[1].split(" GiB")[0]))
  assert temporaries[1] < temporaries[0], temporaries


def _dot_flops(jaxpr) -> float:
  """FLOPs of the matrix products of `jaxpr` (2 per multiply-add), a scan's body counted once
  per iteration, nested calls included."""
  from jax.extend import core as jcore

  total = 0.0
  for eqn in jaxpr.eqns:
    assert eqn.primitive.name != "while"  # no trip count to multiply by
    if eqn.primitive.name == "dot_general":
      (contracting, _), _ = eqn.params["dimension_numbers"]
      k = np.prod([eqn.invars[0].aval.shape[d] for d in contracting])
      total += 2.0 * np.prod(eqn.outvars[0].aval.shape) * k
    times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jcore.ClosedJaxpr):
          sub = sub.jaxpr
        if isinstance(sub, jcore.Jaxpr):
          total += times * _dot_flops(sub)
  return total


def test_flops_count_gradcache_second_forward():
  """`flops_per_step` against the matrix products the step really traces: one pass, and in
  GradCache chunks (the forward twice: 4/3 of the one-pass FLOPs), within 3%."""
  from bertjax import model as model_lib

  cfg = model_lib.BertConfig(
      vocab_size=64, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128
  )
  rows, length = 8, 32
  docs = jnp.ones((rows, 2, length), jnp.int32)
  batch = dict(query_ids=docs[:, 0], query_mask=docs[:, 0], doc_ids=docs, doc_mask=docs)
  counted, traced = {}, {}
  for chunk in (0, 4):
    obj = oc.Contrastive(cfg, oc.Spec(chunk_size=chunk))
    params = jax.eval_shape(
        lambda: obj.model.init(jax.random.PRNGKey(0), docs[:, 0], None, docs[:, 0])["params"]
    )
    step = lambda p, b: obj.grad(p, b, jax.random.PRNGKey(0), {"queries": jnp.float32(rows)})
    traced[chunk] = _dot_flops(jax.make_jaxpr(step)(params, batch).jaxpr)
    counted[chunk] = obj.flops_per_step(rows, length, 0)
    assert counted[chunk] == pytest.approx(traced[chunk], rel=0.03), (chunk, counted, traced)
  assert traced[4] / traced[0] == pytest.approx(4 / 3, rel=0.01)  # the forward, twice
  assert counted[4] / counted[0] == pytest.approx(4 / 3)
