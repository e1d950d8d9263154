"""Contrastive training of the encoder as an embedding model: each query against its positive,
its hard negatives and every other document of the *global* batch (InfoNCE; van den Oord et al.
2018, as sentence-transformers' MultipleNegativesRankingLoss). An `objective.Objective`.

The batch arrays are global `jax.Array`s on the mesh, so the [B, N] score matrix sees every
document of every device: no per-device negatives and no gather code; XLA moves the [N, H]
embeddings, which are small beside the encoder's activations.

A batch (`bertjax.data.pairs`): `query_ids`/`query_mask` [B, Lq] and `doc_ids`/`doc_mask`
[B, D, Ld], each row's positive first, then its D-1 hard negatives. The documents are scored
flattened row by row ([N, Ld], N = B·D), so row i's positive is document i·D.

Options (`config.contrastive`, `Spec`): the pooling ("mean" over real tokens or "cls": the
[CLS] token's last hidden state, as sentence-transformers' Pooling modules, not BERT's tanh
pooler), normalisation (cosine scores), the scale (sentence-transformers' 20) or a learned one
(`learn_scale`, CLIP's log-parametrised temperature), a symmetric document->query term
(averaged with the query->document one, as MultipleNegativesRankingLoss's "per_direction"),
the sigmoid loss (SigLIP, Zhai et al. 2023: one logistic term per query/document pair, with
a learned bias), Matryoshka dimensions (Kusupati et al. 2022: the loss summed over the
embedding's prefixes) and the GradCache step (Gao et al. 2021, `chunk_size`: see `grad`).

Shape letters: B queries (rows), D documents per row, N = B·D documents, L sequence length,
H hidden width, C chunks, R rows per chunk.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import errors
from bertjax.model import bert as bert_lib
from bertjax.model.config import BertConfig
from bertjax.training import fields, flops, streams
from bertjax.training.objective_mlm import grad_of_sums

Array = jax.Array
BATCH_KEYS = ("query_ids", "query_mask", "doc_ids", "doc_mask")
POOLINGS = ("mean", "cls")
LOSSES = ("infonce", "sigmoid")
MAX_SCALE = 100.0  # CLIP clips its learned scale at 100 so that training stays stable


_D = fields.DEFAULTS  # config.contrastive's defaults, written once (bertjax/training/fields.py)


@dataclasses.dataclass(frozen=True)
class Spec:
  """config.contrastive, read once."""

  pooling: str = _D["contrastive.pooling"]
  normalize: bool = _D["contrastive.normalize"]
  scale: float = _D["contrastive.scale"]  # the scale, or the learned scale's start
  learn_scale: bool = _D["contrastive.learn_scale"]
  symmetric: bool = _D["contrastive.symmetric"]
  loss: str = _D["contrastive.loss"]
  sigmoid_bias: float = _D["contrastive.sigmoid_bias"]  # SigLIP's (and its scale at 10)
  matryoshka_dims: tuple[int, ...] = _D["contrastive.matryoshka_dims"]  # (): the whole only
  chunk_size: int = _D["contrastive.chunk_size"]  # rows per GradCache chunk; 0: one pass
  hard_negatives: int = _D["contrastive.hard_negatives"]  # documents per row: 1 + this

  @classmethod
  def from_config(cls, config, hidden_size: int) -> "Spec":
    c = config.contrastive
    spec = cls(
        pooling=c.pooling,
        normalize=bool(c.normalize),
        scale=float(c.scale),
        learn_scale=bool(c.learn_scale),
        symmetric=bool(c.symmetric),
        loss=c.loss,
        sigmoid_bias=float(c.sigmoid_bias),
        matryoshka_dims=tuple(int(d) for d in (c.matryoshka_dims or ())),
        chunk_size=int(c.chunk_size),
        hard_negatives=int(c.hard_negatives),
    )
    spec.check(hidden_size)
    return spec

  def check(self, hidden_size: int) -> None:
    if self.pooling not in POOLINGS:
      raise errors.ConfigError(
          f"config.contrastive.pooling={self.pooling!r}: valid: {', '.join(POOLINGS)}"
      )
    if self.loss not in LOSSES:
      raise errors.ConfigError(f"config.contrastive.loss={self.loss!r}: valid: {', '.join(LOSSES)}")
    if not self.scale > 0:
      raise errors.ConfigError(f"config.contrastive.scale={self.scale}: must be > 0 (default 20)")
    bad = [d for d in self.matryoshka_dims if not 0 < d <= hidden_size]
    if bad:
      raise errors.ConfigError(
          f"config.contrastive.matryoshka_dims={list(self.matryoshka_dims)}: {bad[0]} is not "
          f"in 1..{hidden_size} (the encoder's width)"
      )
    if self.chunk_size < 0:
      raise errors.ConfigError(
          f"config.contrastive.chunk_size={self.chunk_size}: rows per chunk, 0 for one pass"
      )

  @property
  def dims(self) -> tuple[int, ...]:
    """The embedding prefixes scored, largest first (metrics read the first)."""
    return tuple(sorted(set(self.matryoshka_dims), reverse=True)) or (-1,)


def _scalar(value: float) -> Callable:
  return nn.with_logical_partitioning(nn.initializers.constant(value), ())


class ContrastiveModel(nn.Module):
  """The encoder (`params["bert"]`, no pooler used) with the pooling, and the learned scale
  (`log_scale`) and bias (`logit_bias`, sigmoid loss) when the spec asks for them."""

  cfg: BertConfig
  spec: Spec

  def setup(self):
    self.bert = bert_lib.BertModel(self.cfg)
    if self.spec.learn_scale:
      self.log_scale = self.param("log_scale", _scalar(math.log(self.spec.scale)), (), jnp.float32)
    if self.spec.loss == "sigmoid":
      self.logit_bias = self.param("logit_bias", _scalar(self.spec.sigmoid_bias), (), jnp.float32)

  def embed(self, ids_BxL: Array, mask_BxL: Array, deterministic: bool = True) -> Array:
    """[B, H] float32 pooled embeddings (not normalised)."""
    x_BxLxH = self.bert(
        ids_BxL, None, mask_BxL, deterministic=deterministic, pool=False
    ).sequence_output.astype(jnp.float32)
    if self.spec.pooling == "cls":
      return x_BxLxH[:, 0]
    m_BxL = mask_BxL.astype(jnp.float32)
    return jnp.einsum("blh,bl->bh", x_BxLxH, m_BxL) / jnp.maximum(m_BxL.sum(1), 1.0)[:, None]

  def head(self) -> tuple[Array, Array]:
    """(scale, bias) of the scores."""
    scale = jnp.asarray(self.spec.scale, jnp.float32)
    if self.spec.learn_scale:
      scale = jnp.minimum(jnp.exp(self.log_scale), MAX_SCALE)
    bias = self.logit_bias if self.spec.loss == "sigmoid" else jnp.zeros((), jnp.float32)
    return scale, bias

  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, masked_positions=None):
    """Init's entry: every parameter is created."""
    del token_type_ids, masked_positions
    mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
    return self.embed(input_ids, mask), self.head()


# ----------------------------------------------------------------------------- the loss


def _normalized(x_BxH: Array) -> Array:
  return x_BxH / jnp.maximum(jnp.linalg.norm(x_BxH, axis=-1, keepdims=True), 1e-12)


def _scores(spec: Spec, q_BxH: Array, d_NxH: Array, dim: int) -> Array:
  if dim > 0:
    q_BxH, d_NxH = q_BxH[:, :dim], d_NxH[:, :dim]
  if spec.normalize:
    q_BxH, d_NxH = _normalized(q_BxH), _normalized(d_NxH)
  return jnp.dot(q_BxH, d_NxH.T, precision=jax.lax.Precision.HIGHEST)


def loss_sums(
    spec: Spec, q_BxH: Array, d_NxH: Array, scale: Array, bias: Array
) -> dict[str, Array]:
  """Summed loss over the queries, top-1 hits and the positive's rank (1 = first) among every
  document of the batch, from the embeddings of the whole batch."""
  B, N = q_BxH.shape[0], d_NxH.shape[0]
  rows_B = jnp.arange(B)
  pos_B = rows_B * (N // B)  # row i's positive
  total = jnp.zeros((), jnp.float32)
  for k, dim in enumerate(spec.dims):
    s_BxN = scale * _scores(spec, q_BxH, d_NxH, dim)
    pos_score_B = s_BxN[rows_B, pos_B]
    if spec.loss == "sigmoid":  # +1 for the row's positive, -1 for every other document
      z_BxN = jnp.where(jnp.arange(N)[None, :] == pos_B[:, None], 1.0, -1.0)
      nll_B = -jnp.sum(jax.nn.log_sigmoid(z_BxN * (s_BxN + bias)), axis=1)
    else:
      nll_B = jax.nn.logsumexp(s_BxN, axis=1) - pos_score_B
      if spec.symmetric:  # each positive against every query
        to_query_B = jax.nn.logsumexp(s_BxN[:, pos_B], axis=0) - pos_score_B
        nll_B = (nll_B + to_query_B) / 2
    total = total + jnp.sum(nll_B)
    if k == 0:
      rank_B = 1.0 + jnp.sum(s_BxN > pos_score_B[:, None], axis=1).astype(jnp.float32)
  return {
      "contrastive_loss": total,
      "contrastive_correct": jnp.sum(rank_B == 1.0).astype(jnp.float32),
      "contrastive_rank": jnp.sum(rank_B),
      "contrastive_count": jnp.asarray(B, jnp.float32),
  }


# ----------------------------------------------------------------------------- the objective


def _chunked(x: Array, chunks: int) -> Array:
  """[B, ...] -> [C, B/C, ...] taking rows c, c+C, ...: every chunk spans every shard."""
  x = x.reshape((x.shape[0] // chunks, chunks) + x.shape[1:]).swapaxes(0, 1)
  return nn.with_logical_constraint(x, (None, "batch") + (None,) * (x.ndim - 2))


def _unchunked(x: Array) -> Array:
  """[C, B/C, ...] -> [B, ...], inverting `_chunked`."""
  return x.swapaxes(0, 1).reshape((-1,) + x.shape[2:])


def _texts(batch: dict) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
  """((ids, mask) of the queries [B, Lq], of the documents flattened [N, Ld])."""
  d_ids, d_mask = batch["doc_ids"], batch["doc_mask"]
  flat = lambda x: x.reshape((-1, x.shape[-1]))
  return (batch["query_ids"], batch["query_mask"]), (flat(d_ids), flat(d_mask))


@dataclasses.dataclass
class Contrastive:
  bert_config: BertConfig
  spec: Spec
  name: str = "contrastive"
  sum_names: tuple[str, ...] = (
      "contrastive_loss",
      "contrastive_correct",
      "contrastive_rank",
      "contrastive_count",
  )

  @classmethod
  def from_config(cls, config, bert_config: BertConfig) -> "Contrastive":
    return cls(bert_config, Spec.from_config(config, bert_config.hidden_size))

  def __post_init__(self):
    self.model = ContrastiveModel(self.bert_config, self.spec)

  def _embed(self, params, ids, mask, key, deterministic) -> Array:
    return self.model.apply(
        {"params": params}, ids, mask, deterministic, method="embed", rngs={"dropout": key}
    )

  def _head(self, params) -> tuple[Array, Array]:
    return self.model.apply({"params": params}, method="head")

  def embeddings(self, params, batch, key, deterministic) -> tuple[Array, Array]:
    """([B, H] queries, [N, H] documents) of the batch, in one pass each."""
    (q_ids, q_mask), (d_ids, d_mask) = _texts(batch)
    q_BxH = self._embed(params, q_ids, q_mask, jax.random.fold_in(key, 0), deterministic)
    d_NxH = self._embed(params, d_ids, d_mask, jax.random.fold_in(key, 1), deterministic)
    return q_BxH, d_NxH

  def prepare(self, batch: dict, step_key: Array) -> tuple[dict, Any]:
    return batch, None

  def counts(self, batch: dict) -> dict[str, Array]:
    return {"queries": jnp.asarray(batch["query_ids"].shape[0], jnp.float32)}

  def sums(self, params, batch, dropout_key, deterministic, draw=None):
    q_BxH, d_NxH = self.embeddings(params, batch, dropout_key, deterministic)
    sums = loss_sums(self.spec, q_BxH, d_NxH, *self._head(params))
    return sums, jnp.zeros((q_BxH.shape[0], 0), jnp.float32)  # no masked positions

  def loss(self, sums, counts):
    return sums["contrastive_loss"] / counts["queries"]

  def grad(self, params, batch, dropout_key, counts, draw=None):
    """(sums, gradients) of the step. With `chunk_size`, GradCache (Gao et al. 2021): the
    embeddings without gradient chunk by chunk, the loss and its gradient with respect to the
    embeddings (and the scale, bias) on the whole batch, then each chunk's backward pass from
    its embeddings' gradient; only one chunk's activations are alive at a time. Dropout draws
    per chunk (the key folded with the chunk's index), the same in both passes."""
    if not self.spec.chunk_size:
      return grad_of_sums(self, params, batch, dropout_key, counts, draw)
    texts = _texts(batch)
    keys = [jax.random.fold_in(dropout_key, i) for i in range(2)]
    chunks = [self._chunks(ids.shape[0]) for ids, _ in texts]

    def embed_chunks(p, ids, mask, key, c):  # [C, R, H]
      def one(_, xs):
        i, ids_RxL, mask_RxL = xs
        return None, self._embed(p, ids_RxL, mask_RxL, jax.random.fold_in(key, i), False)

      return jax.lax.scan(one, None, (jnp.arange(c), _chunked(ids, c), _chunked(mask, c)))[1]

    frozen = jax.lax.stop_gradient(params)
    embedded = [
        _unchunked(embed_chunks(frozen, ids, mask, k, c))
        for (ids, mask), k, c in zip(texts, keys, chunks)
    ]

    def from_embeddings(q_BxH, d_NxH, p):
      sums = loss_sums(self.spec, q_BxH, d_NxH, *self._head(p))
      return self.loss(sums, counts), sums

    (_, sums), (g_q, g_d, grads) = jax.value_and_grad(
        from_embeddings, argnums=(0, 1, 2), has_aux=True
    )(*embedded, params)

    for (ids, mask), k, c, g_TxH in zip(texts, keys, chunks, (g_q, g_d)):

      def backward(acc, xs, key=k):
        i, ids_RxL, mask_RxL, g_RxH = xs
        embed = lambda p: self._embed(p, ids_RxL, mask_RxL, jax.random.fold_in(key, i), False)
        _, vjp = jax.vjp(embed, params)
        return jax.tree.map(jnp.add, acc, vjp(g_RxH)[0]), None

      xs = (jnp.arange(c), _chunked(ids, c), _chunked(mask, c), _chunked(g_TxH, c))
      grads = jax.lax.scan(backward, grads, xs)[0]
    return sums, grads

  def _chunks(self, rows: int) -> int:
    size = min(self.spec.chunk_size, rows)
    if rows % size:
      raise errors.ConfigError(
          f"config.contrastive.chunk_size={self.spec.chunk_size} does not divide the batch's "
          f"{rows} texts — choose a divisor of the batch size"
      )
    return rows // size

  def finalize(self, sums):
    n = jnp.maximum(sums["contrastive_count"], 1.0)
    return {
        "loss": sums["contrastive_loss"] / n,
        "contrastive_accuracy": sums["contrastive_correct"] / n,
        "contrastive_mean_rank": sums["contrastive_rank"] / n,
    }

  def flops_per_step(self, batch_size, seq_len, max_predictions):
    """The encoder on the queries and on 1 + `hard_negatives` documents per row, forward and
    backward (2 + 4 FLOPs per weight and token); with `chunk_size` (GradCache) the forward
    pass runs twice, once without gradient and again inside the backward pass, 8 in all. The
    scores are negligible."""
    texts = 2 + self.spec.hard_negatives
    passes = 4 / 3 if self.spec.chunk_size else 1  # forward + backward = 3 forwards' FLOPs
    encoder = flops.encoder_flops(self.bert_config, batch_size * seq_len, seq_len)
    return float(texts * encoder * passes)

  def abstract_batch(self, batch_size: int, seq_len: int) -> dict[str, tuple[int, ...]]:
    """The shapes of a batch (`bertjax compile`)."""
    docs = (batch_size, 1 + self.spec.hard_negatives, seq_len)
    return dict(
        query_ids=(batch_size, seq_len),
        query_mask=(batch_size, seq_len),
        doc_ids=docs,
        doc_mask=docs,
    )

  def record(self) -> dict:
    return {
        "objective": self.name,
        "generator_config": None,
        "contrastive": dataclasses.asdict(self.spec),
    }

  def trained_heads(self) -> tuple[str, ...]:
    return ()  # the encoder only; the MLM head, NSP head and pooler stay as they were

  keeps_source_heads = False  # its training leaves an --init's MLM/NSP heads stale

  def stream(self, config, phase, state, split="train"):
    return streams.pair_stream(config, phase, state, split)

  def evaluate(self, config, setup, params, phase, meta):
    return streams.pairs_evaluate(config, setup, params, phase, meta)

  def has_eval_data(self, config, meta, writer):
    return streams.pairs_have_eval_data(config, meta, writer)

  def note(self) -> str:
    s = self.spec
    scale = f"learned scale from {s.scale:g}" if s.learn_scale else f"scale {s.scale:g}"
    return (
        f" (contrastive: {s.pooling} pooling, {s.loss}"
        + (", symmetric" if s.symmetric else "")
        + f", {scale}"
        + (f", chunks of {s.chunk_size}" if s.chunk_size else "")
        + ")"
    )
