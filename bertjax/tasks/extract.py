"""Per-token and pooled BERT features: the library behind `bertjax extract`.

As google-research/bert's `extract_features.py`: each input line is one example ("text" or
"text_a ||| text_b"), tokenized as [CLS] a [SEP] (b [SEP]) and truncated to `max_seq_len`;
the encoder's hidden states of the chosen layers are returned per token, optionally
concatenated (the "last four layers" representation of the BERT paper's feature-based NER
experiment) or pooled to one vector per example ([CLS] or mean over real tokens).

Layers are named as in google's `--layers`: indexes into the Transformer layers
(`all_encoder_layers`), 0 the first, L - 1 the last, and negative ones from the last (-1), so
"-1,-2,-3,-4" are the last four. The embedding output, which google's script cannot output, is
`embeddings`.

Shape letters: B batch, L length, K chosen layers, H hidden size.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.data.tokenizer import Tokenizer
from bertjax.tasks import batching, inputs
from bertjax.tasks import embed as embed_lib
from bertjax.tasks.encoder import Encoder
from bertjax.training import sharding

POOLINGS = ("none",) + embed_lib.POOLINGS  # pooled as `bertjax embed` pools (embed.pool_slots)


@dataclasses.dataclass
class Example:
  index: int  # line number in the input, from 0
  tokens: list[str]  # pieces, [CLS] and [SEP] included
  input_ids: list[int]
  token_type_ids: list[int]
  cut: bool = False  # longer than max_seq_len: truncated


EMBEDDINGS = "embeddings"  # the --layers name of the embedding output


def parse_layers(spec: str, num_layers: int, name: str = "layers") -> list[int | str]:
  """ "-1,-2,embeddings" -> [-1, -2, "embeddings"]: google's Transformer layer indexes (0 =
  first, -1 = last) or EMBEDDINGS, checked against a `num_layers`-layer model. Messages call
  `spec` `name` (a command passes its flag)."""
  example = "e.g. -1,-2,-3,-4 (the last four layers) or embeddings,-1"
  items = [x.strip() for x in spec.split(",") if x.strip()]
  if not items:
    raise errors.ConfigError(f"{name} is empty — {example}")
  layers = []
  for item in items:
    if item == EMBEDDINGS:
      layers.append(item)
      continue
    try:
      i = int(item)
    except ValueError:
      raise errors.ConfigError(
          f"{name} {spec!r}: {item!r} is not a layer index or {EMBEDDINGS!r} — {example}"
      ) from None
    if not -num_layers <= i < num_layers:
      raise errors.ConfigError(
          f"{name}: {i} is out of range for a {num_layers}-layer model — valid: 0 = first .. "
          f"{num_layers - 1}, -1 = last .. -{num_layers}, or {EMBEDDINGS}"
      )
    layers.append(i)
  return layers


def hidden_state_index(layer: int | str, num_layers: int) -> int:
  """Where a parsed layer is in `hidden_states` ([embeddings, layer 1, ..., layer L])."""
  if layer == EMBEDDINGS:
    return 0
  return layer + 1 if layer >= 0 else num_layers + 1 + layer


def default_layers(num_layers: int) -> list[int]:
  """google's default -1,-2,-3,-4, or every layer of a model with fewer than four."""
  return [-k for k in range(1, min(4, num_layers) + 1)]


def make_example(index: int, line: str, tok: Tokenizer, max_seq_len: int) -> Example:
  """[CLS] a [SEP] (b [SEP]) for "a" or "a ||| b"; the longer side is truncated first."""
  a, _, b = line.partition(" ||| ")
  a_ids, b_ids = tok.encode(a.strip()), tok.encode(b.strip()) if b else None
  ids, types = inputs.segments(a_ids, b_ids, max_seq_len, tok)
  whole = len(a_ids) + len(b_ids or ()) + (3 if b else 2)
  return Example(index, [tok.id_to_piece(i) for i in ids], ids, types, cut=whole > len(ids))


def _padded_len(n: int, max_seq_len: int) -> int:
  """Round up to a power of two (>= 16): a handful of compiled shapes, little padding."""
  return min(max_seq_len, max(16, 1 << (n - 1).bit_length()))


def make_extract_fn(
    cfg: model_lib.BertConfig,
    layers: Sequence[int | str],
    pooling: str,
    mesh: jax.sharding.Mesh | None = None,
    packed: bool = False,
    normalize: bool = False,
):
  """jit(fn(bert_params, ids, types, mask)) -> float32 [B, L, K, H] (pooling none) or [B, K, H]
  for `layers` as `parse_layers` returns them. `packed`: fn(bert_params, ids, types,
  segment_ids, cls_positions) on packed rows (`batching.packed_batch`) -> [B, L, K, H] or,
  pooled, one vector per slot [B, E, K, H], each example pooled over its own tokens. Pooling
  is `embed.pool_slots` (an unpacked row is one slot); `normalize` scales each pooled
  layer's vector to unit length."""
  if pooling not in POOLINGS:
    raise errors.ConfigError(f"pooling {pooling!r}; valid: {', '.join(POOLINGS)}")
  model = model_lib.BertModel(cfg.replace(scan_layers=False))
  layers = tuple(hidden_state_index(i, cfg.num_layers) for i in layers)

  def fn(params, ids_BxL, types_BxL, mask_BxL):
    out = model.apply(
        {"params": params},
        ids_BxL,
        types_BxL,
        mask_BxL,
        deterministic=True,
        output_hidden_states=True,
    )
    x_BxLxKxH = jnp.stack([out.hidden_states[i] for i in layers], axis=2).astype(jnp.float32)
    if pooling == "none":
      return x_BxLxKxH
    cls_Bx1 = jnp.zeros((x_BxLxKxH.shape[0], 1), jnp.int32)
    return pool(x_BxLxKxH, (mask_BxL > 0).astype(jnp.int32), cls_Bx1)[:, 0]

  def packed_fn(params, ids_BxL, types_BxL, segment_ids_BxL, cls_BxE):
    out = model.apply(
        {"params": params},
        ids_BxL,
        types_BxL,
        segment_ids=segment_ids_BxL,
        deterministic=True,
        output_hidden_states=True,
    )
    x_BxLxKxH = jnp.stack([out.hidden_states[i] for i in layers], axis=2).astype(jnp.float32)
    return x_BxLxKxH if pooling == "none" else pool(x_BxLxKxH, segment_ids_BxL, cls_BxE)

  def pool(x_BxLxKxH, segment_ids_BxL, cls_BxE):
    b, length, k, h = x_BxLxKxH.shape
    x_BxLxF = x_BxLxKxH.reshape(b, length, k * h)
    y_BxExKxH = embed_lib.pool_slots(x_BxLxF, segment_ids_BxL, cls_BxE, pooling).reshape(
        b, -1, k, h
    )
    if normalize:
      norm_BxExKx1 = jnp.linalg.norm(y_BxExKxH, axis=-1, keepdims=True)
      y_BxExKxH = y_BxExKxH / jnp.maximum(norm_BxExKx1, 1e-12)
    return y_BxExKxH

  step = packed_fn if packed else fn
  if mesh is None:
    return jax.jit(step)
  rows = sharding.batch_sharding(mesh)
  row_args = (rows,) * (4 if packed else 3)
  return jax.jit(step, in_shardings=(sharding.replicated(mesh),) + row_args, out_shardings=rows)


def extract(
    encoder: Encoder,
    examples: Sequence[Example],
    layers: Sequence[int | str],
    pooling: str = "none",
    batch_size: int = 32,
    max_seq_len: int = 128,
    mesh: jax.sharding.Mesh | None = None,
    packing: int = 0,
    normalize: bool = False,
) -> Iterator[tuple[Example, np.ndarray]]:
  """Yields (example, features) in input order; features [len, K, H] or [K, H] (pooled).

  Batches are padded to `batch_size` rows (a multiple of the mesh's batch shards) and to a
  power-of-two length, so only a few shapes are compiled. `packing` > 0 packs up to that
  many examples into each row of `max_seq_len` tokens instead (`_extract_packed`): one
  compiled shape.
  """
  if mesh is not None:
    shards = sharding.num_batch_shards(mesh)
    batch_size = -(-batch_size // shards) * shards
    params = jax.device_put(encoder.bert_params, sharding.replicated(mesh))
  else:
    params = encoder.bert_params
  fn = make_extract_fn(
      encoder.config, layers, pooling, mesh, packed=packing > 0, normalize=normalize
  )
  if packing:
    yield from _extract_packed(fn, params, examples, pooling, batch_size, max_seq_len, packing)
    return
  for start in range(0, len(examples), batch_size):
    chunk = examples[start : start + batch_size]
    length = _padded_len(max(len(e.input_ids) for e in chunk), max_seq_len)
    ids_BxL = np.zeros((batch_size, length), np.int32)
    types_BxL = np.zeros_like(ids_BxL)
    mask_BxL = np.zeros_like(ids_BxL)
    for r, e in enumerate(chunk):
      n = len(e.input_ids)
      ids_BxL[r, :n], types_BxL[r, :n], mask_BxL[r, :n] = e.input_ids, e.token_type_ids, 1
    feats = np.asarray(fn(params, ids_BxL, types_BxL, mask_BxL))
    for r, e in enumerate(chunk):
      yield e, (feats[r] if pooling != "none" else feats[r, : len(e.input_ids)])


# Examples packed together at a time, in batches of packed rows: the features of one such
# group wait on the host until all of it is done (so they come out in input order).
PACKED_GROUP_BATCHES = 4


def _extract_packed(fn, params, examples, pooling, batch_size, max_seq_len, packing):
  """`extract` on packed rows: groups of examples (about PACKED_GROUP_BATCHES batches' worth)
  packed first-fit-decreasing into `batch_size` rows of `max_seq_len`, each example's
  features read from its own tokens (or slot) and yielded in input order."""
  group = PACKED_GROUP_BATCHES * batch_size * packing
  for start in range(0, len(examples), group):
    part = examples[start : start + group]
    lengths_N = np.array([len(e.input_ids) for e in part])
    arrays = dict(
        input_ids=np.zeros((len(part), max_seq_len), np.int32),
        token_type_ids=np.zeros((len(part), max_seq_len), np.int32),
    )
    for i, e in enumerate(part):
      arrays["input_ids"][i, : len(e.input_ids)] = e.input_ids
      arrays["token_type_ids"][i, : len(e.input_ids)] = e.token_type_ids
    rows = batching.pack_examples(lengths_N, max_seq_len, packing)
    feats = [None] * len(part)
    for i in range(0, len(rows), batch_size):
      batch, example_RxE = batching.packed_batch(
          arrays, lengths_N, rows[i : i + batch_size], packing, batch_size
      )
      cls_RxE = batch["cls_positions"]
      out = np.asarray(
          fn(params, batch["input_ids"], batch["token_type_ids"], batch["segment_ids"], cls_RxE)
      )
      idx_P, x_P = batching.unpack_outputs(
          out, example_RxE, cls_RxE, lengths_N, per_token=pooling == "none"
      )
      for j, x in zip(idx_P, x_P):
        feats[j] = x if pooling != "none" else x[: lengths_N[j]]
    yield from zip(part, feats)
