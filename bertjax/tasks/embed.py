"""Sentence embeddings: one float32 vector per text, as sentence-transformers computes them.

The library behind `bertjax embed` and `bertjax retrieval`. A text is prefixed with its prompt
(if any), lower-cased if the model declares it, tokenized as [CLS] text [SEP] and cut at the
declared length; the encoder's last layer is pooled over the text's tokens (`POOLINGS`; with
`include_prompt=False` the prompt's tokens, [CLS] included, are left out, as
sentence-transformers leaves them out), then the model's Dense layers and, if asked,
normalised to unit length.

Texts of mixed length are packed several to a row (`batching.pack_examples`; attention kept
within each by segment ids, positions counted from each text's start), so one compiled shape
serves every batch; rows are sharded over the mesh's batch axes.

Shape letters: R packed rows, L row length, E texts per row at most, H hidden size, D output
size, S = R·E slots.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.interop import sentence_transformers as st_lib
from bertjax.tasks import batching, inputs
from bertjax.tasks.encoder import Encoder
from bertjax.training import sharding

POOLINGS = st_lib.POOLINGS
# Texts per packed row at most: queries and short texts run ~8-16 tokens, so a row of L tokens
# holds L // 8 of them; empty slots cost only a few pooled sums.
TOKENS_PER_TEXT = 8
# Texts tokenized, packed and encoded together: their vectors come out in input order once the
# whole group is done, and the host never holds more than one group's tokens.
GROUP_TEXTS = 8192


@dataclasses.dataclass(frozen=True)
class EmbedSpec:
  """How texts become vectors: the directory's declarations, overridden by flags."""

  max_seq_len: int  # tokens per text, [CLS] and [SEP] included
  pooling: str = "mean"  # one of POOLINGS
  include_prompt: bool = True  # False: the prompt's tokens are not pooled
  normalize: bool = False  # unit-length vectors
  lower_case: bool = False  # lower-case the text before tokenizing (sentence_bert_config.json)
  dense: tuple[st_lib.Dense, ...] = ()  # the directory's Dense modules, in order
  prompt: str = ""  # prepended to every text


def spec_for(
    enc: Encoder,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_seq_len: int | None = None,
    prompt: str | None = None,
) -> EmbedSpec:
  """The encoder's declared embedding (a sentence-transformers directory's; mean pooling, no
  normalisation and the model's full length otherwise), with the given overrides. `prompt` is
  a name from the directory's prompts or a literal text; None takes its default prompt."""
  head = enc.sentence or st_lib.SentenceHead()
  limit = enc.config.max_seq_len
  length = max_seq_len or min(head.max_seq_length or limit, limit)
  if length > limit:
    raise errors.ConfigError(
        f"--max-seq-len {length} exceeds the model's max_position_embeddings={limit}"
    )
  if pooling is not None and pooling not in POOLINGS:
    raise errors.ConfigError(f"--pooling {pooling!r}; valid: {', '.join(POOLINGS)}")
  return EmbedSpec(
      max_seq_len=length,
      pooling=pooling or head.pooling,
      include_prompt=head.include_prompt,
      normalize=head.normalize if normalize is None else normalize,
      lower_case=head.do_lower_case,
      dense=head.dense,
      prompt=resolve_prompt(head, prompt),
  )


def with_weights(enc: Encoder, seed: int = 0) -> Encoder:
  """`enc` itself, or, for `--init random` (no weights), fresh ones as the model initialises
  them (seeded): the no-pretraining baseline."""
  if enc.bert_params is not None:
    return enc
  model = model_lib.BertModel(enc.config.replace(scan_layers=False))
  ids_1xL = jnp.zeros((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.key(seed), ids_1xL, ids_1xL)["params"]
  return dataclasses.replace(enc, bert_params=jax.tree.map(np.asarray, nn.unbox(params)))


def resolve_prompt(head: st_lib.SentenceHead, prompt: str | None) -> str:
  """The prompt text: a name of the directory's prompts, else `prompt` itself; None is the
  directory's default prompt (or none)."""
  if prompt is None:
    return head.prompts.get(head.default_prompt_name, "") if head.default_prompt_name else ""
  return head.prompts.get(prompt, prompt)


def tokenize(tok, texts: Sequence[str], spec: EmbedSpec) -> tuple[list[list[int]], int, int]:
  """(ids of [CLS] prompt+text [SEP] per text, cut at spec.max_seq_len; how many texts were
  cut; the prompt's length in tokens with [CLS], which pooling skips if the model excludes it)."""
  cls, sep, _ = inputs.special_ids(tok)
  full = [spec.prompt + t for t in texts]
  if spec.lower_case:
    full = [t.lower() for t in full]
  budget = spec.max_seq_len - 2
  pieces = tok.encode_batch(full)
  cut = sum(len(p) > budget for p in pieces)
  ids = [[cls] + p[:budget] + [sep] for p in pieces]
  prompt = spec.prompt.lower() if spec.lower_case else spec.prompt
  prompt_len = min(1 + len(tok.encode(prompt)), spec.max_seq_len) if prompt else 0
  return ids, cut, prompt_len


def pool_slots(
    x_RxLxF: jax.Array,
    segment_ids_RxL: jax.Array,
    cls_RxE: jax.Array,
    pooling: str,
    skip: jax.Array | int = 0,
) -> jax.Array:
  """[R, E, F] one vector per packed text (slot), pooled over its own tokens from its
  `skip`-th on (sentence-transformers' Pooling on one text per row): cls = its first pooled
  token, lasttoken its last, mean / mean_sqrt_len / weightedmean (weights 1, 2, ... by position
  in the text) / max over them. Empty slots are 0 (max: -inf)."""
  r, length = segment_ids_RxL.shape
  e = cls_RxE.shape[1]
  slot_RxL = jnp.maximum(segment_ids_RxL - 1, 0)
  start_RxL = jnp.take_along_axis(cls_RxE, slot_RxL, axis=1)
  pos_RxL = jnp.arange(length)[None, :] - start_RxL  # each token's place in its text
  keep_RxL = (segment_ids_RxL > 0) & (pos_RxL >= skip)
  # each kept token's slot in [0, S); the rest go to a slot S that is dropped
  seg_RxL = jnp.where(keep_RxL, jnp.arange(r)[:, None] * e + slot_RxL, r * e)
  seg_T, x_TxF = seg_RxL.reshape(-1), x_RxLxF.reshape(r * length, -1).astype(jnp.float32)
  num = r * e + 1
  if pooling in ("cls", "lasttoken"):
    flat_T = jnp.arange(r * length)
    reduce = jax.ops.segment_min if pooling == "cls" else jax.ops.segment_max
    at_S = jnp.clip(reduce(flat_T, seg_T, num_segments=num)[:-1], 0, r * length - 1)
    found_S = jax.ops.segment_sum(jnp.ones_like(seg_T), seg_T, num_segments=num)[:-1] > 0
    y_SxF = jnp.where(found_S[:, None], x_TxF[at_S], 0.0)
  elif pooling == "max":
    y_SxF = jax.ops.segment_max(x_TxF, seg_T, num_segments=num)[:-1]
  elif pooling in ("mean", "mean_sqrt_len", "weightedmean"):
    w_T = (pos_RxL + 1 if pooling == "weightedmean" else jnp.ones_like(pos_RxL)).reshape(-1)
    w_T = w_T.astype(jnp.float32)
    sum_SxF = jax.ops.segment_sum(x_TxF * w_T[:, None], seg_T, num_segments=num)[:-1]
    n_Sx1 = jnp.maximum(jax.ops.segment_sum(w_T, seg_T, num_segments=num)[:-1, None], 1e-9)
    y_SxF = sum_SxF / (jnp.sqrt(n_Sx1) if pooling == "mean_sqrt_len" else n_Sx1)
  else:
    raise errors.ConfigError(f"pooling {pooling!r}; valid: {', '.join(POOLINGS)}")
  return y_SxF.reshape(r, e, -1)


def make_embed_fn(cfg: model_lib.BertConfig, spec: EmbedSpec, mesh: jax.sharding.Mesh | None):
  """jit(fn(params, dense, ids, types, segment_ids, cls_positions, skip)) -> float32 [R, E, D]
  on packed rows (`batching.packed_batch`); `dense` the [(kernel, bias)] of spec.dense."""
  model = model_lib.BertModel(cfg.replace(scan_layers=False))
  acts = tuple(d.activation for d in spec.dense)

  def fn(params, dense, ids_RxL, types_RxL, segment_ids_RxL, cls_RxE, skip):
    out = model.apply(
        {"params": params},
        ids_RxL,
        types_RxL,
        segment_ids=segment_ids_RxL,
        deterministic=True,
        pool=False,
    )
    y = pool_slots(out.sequence_output, segment_ids_RxL, cls_RxE, spec.pooling, skip)
    for (kernel, bias), act in zip(dense, acts):
      y = y @ kernel + (0.0 if bias is None else bias)
      y = jnp.tanh(y) if act == "tanh" else y
    if spec.normalize:
      y = y / jnp.maximum(jnp.linalg.norm(y, axis=-1, keepdims=True), 1e-12)
    return y

  if mesh is None:
    return jax.jit(fn)
  rows, rep = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  return jax.jit(fn, in_shardings=(rep, rep, rows, rows, rows, rows, rep), out_shardings=rows)


@dataclasses.dataclass
class Counts:
  texts: int = 0
  cut: int = 0  # texts longer than max_seq_len, truncated


def embed_groups(
    enc: Encoder,
    texts: Iterable[str],
    spec: EmbedSpec,
    *,
    batch_rows: int = 32,
    mesh: jax.sharding.Mesh | None = None,
    counts: Counts | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[np.ndarray]:
  """float32 [n, D] vectors of `texts`, in input order, a group (up to GROUP_TEXTS) at a time.
  `batch_rows` packed rows of spec.max_seq_len per forward pass (rounded up to a multiple of
  the mesh's batch shards); `counts` is updated as groups finish; `progress(n)` after each
  batch, with the texts it held."""
  counts = counts if counts is not None else Counts()
  per_row = max(1, spec.max_seq_len // TOKENS_PER_TEXT)
  params, dense = enc.bert_params, [(d.kernel, d.bias) for d in spec.dense]
  if mesh is not None:
    shards = sharding.num_batch_shards(mesh)
    batch_rows = -(-batch_rows // shards) * shards
    params = jax.device_put(params, sharding.replicated(mesh))
  fn = make_embed_fn(enc.config, spec, mesh)

  def run(group: list[str]) -> np.ndarray:
    ids, cut, skip = tokenize(enc.tokenizer, group, spec)
    counts.texts += len(group)
    counts.cut += cut
    skip = 0 if spec.include_prompt else skip
    return _embed_ids(
        fn, (params, dense), ids, spec.max_seq_len, skip, batch_rows, per_row, progress
    )

  group: list[str] = []
  for text in texts:
    group.append(text)
    if len(group) == GROUP_TEXTS:
      yield run(group)
      group = []
  if group:
    yield run(group)


def _embed_ids(fn, weights, ids, max_seq_len, skip, batch_rows, per_row, progress):
  """float32 [N, D] of tokenized texts, packed into batches of `batch_rows` rows."""
  lengths_N = np.array([len(x) for x in ids])
  arrays = dict(
      input_ids=np.zeros((len(ids), max_seq_len), np.int32),
      token_type_ids=np.zeros((len(ids), max_seq_len), np.int32),
  )
  for i, x in enumerate(ids):
    arrays["input_ids"][i, : len(x)] = x
  rows = batching.pack_examples(lengths_N, max_seq_len, per_row)
  out_NxD = None
  for i in range(0, len(rows), batch_rows):
    batch, example_RxE = batching.packed_batch(
        arrays, lengths_N, rows[i : i + batch_rows], per_row, batch_rows
    )
    y_RxExD = np.asarray(
        fn(
            *weights,
            batch["input_ids"],
            batch["token_type_ids"],
            batch["segment_ids"],
            batch["cls_positions"],
            np.int32(skip),
        )
    )
    idx_P, y_PxD = batching.unpack_outputs(
        y_RxExD, example_RxE, batch["cls_positions"], lengths_N, per_token=False
    )
    if out_NxD is None:
      out_NxD = np.zeros((len(ids), y_PxD.shape[-1]), np.float32)
    out_NxD[idx_P] = y_PxD
    if progress:
      progress(len(idx_P))
  return out_NxD


def embed(enc: Encoder, texts: Sequence[str], spec: EmbedSpec, **kw) -> np.ndarray:
  """float32 [N, D]: `embed_groups` gathered."""
  parts = list(embed_groups(enc, texts, spec, **kw))
  return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
