"""Weight conversion between Hugging Face models and bertjax parameter trees: transformers'
`BertForPreTraining` for BERT-shaped configs, `ModernBertForMaskedLM` for ModernBERT-shaped ones
(`hf_architecture` says which a config is; a mix of the two is neither and is refused).

One table per architecture, `_hf_entries` and `_modernbert_entries`, names every tensor once;
import (`hf_to_params`) and export (`params_to_hf`) both read it, so they cannot drift apart. Files are never unpickled:
`model.safetensors` is read with safetensors; a legacy `pytorch_model.bin` only through
`torch.load(weights_only=True)`.

Layouts: a PyTorch Linear weight is [out, in]; a Flax Dense kernel is [in, out]. bertjax fuses
query/key/value into one kernel [H, 3, N, D] and keeps the attention output kernel as
[N, D, H] so heads can be sharded. ModernBERT's `Wqkv` [3·H, H] is the same fused product, and
its GLU `Wi` [2·F, H] (input half, then gate half) is bertjax's [H, 2, F] GLU kernel.

ModernBERT has no pooler and no NSP head; loading one gives bertjax's (`bert/pooler`, `nsp`)
fresh, deterministic initial values (`_fresh_heads`) and saving one drops them.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Iterator

from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.model import bert as bert_lib
from bertjax.model.config import BertConfig
from bertjax.runtime import fs

Params = dict[str, Any]

REQUIRED_HF_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)
_HF_ACT = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "relu": "relu"}


class ConversionError(errors.UserError, ValueError):
  """A checkpoint could not be converted; the message names the file and tensor."""


# ------------------------------------------------------------------------------------ configs


def config_from_hf(hf: dict[str, Any], **overrides) -> BertConfig:
  """A `BertConfig` from a Hugging Face `config.json` dict."""
  if not isinstance(hf, dict):
    raise ConversionError(f"config.json: a JSON object expected, found {type(hf).__name__}")
  for field in REQUIRED_HF_FIELDS:
    if field not in hf:
      raise ConversionError(f"config.json: field {field!r} is missing — is this a BERT config?")
  act = hf.get("hidden_act", "gelu")
  if act not in _HF_ACT:
    raise ConversionError(
        f"config.json: hidden_act={act!r} is not supported; " f"valid: {sorted(_HF_ACT)}"
    )
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(
        "config.json: position_embedding_type="
        f"{hf['position_embedding_type']!r}; only 'absolute' is BERT"
    )
  fields = dict(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=hf["num_attention_heads"],
      intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 512),
      type_vocab_size=hf.get("type_vocab_size", 2),
      hidden_act=_HF_ACT[act],
      hidden_dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
      initializer_range=hf.get("initializer_range", 0.02),
  )
  fields.update(overrides)
  return BertConfig(**fields)


def config_to_hf(cfg: BertConfig) -> dict[str, Any]:
  """The `config.json` dict that `transformers.BertConfig` reads."""
  return {
      "architectures": ["BertForPreTraining"],
      "model_type": "bert",
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.intermediate_size,
      "hidden_act": cfg.hidden_act,
      "hidden_dropout_prob": cfg.hidden_dropout_rate,
      "attention_probs_dropout_prob": cfg.attention_dropout_rate,
      "max_position_embeddings": cfg.max_position_embeddings,
      "type_vocab_size": cfg.type_vocab_size,
      "initializer_range": cfg.initializer_range,
      "layer_norm_eps": cfg.layer_norm_eps,
      "position_embedding_type": "absolute",
      "pad_token_id": 0,
      "tie_word_embeddings": True,
  }


# ----------------------------------------------------------------------- ModernBERT's configs

# The switches that tell the two architectures apart, with each one's value (BERT, ModernBERT).
_ARCH_FIELDS = {
    "norm_placement": ("post", "pre"),
    "mlp_type": ("dense", "glu"),
    "position_embedding": ("learned", "rope"),
}
_BIAS_FIELDS = ("attention_bias", "mlp_bias", "norm_bias", "classifier_bias")


def hf_architecture(cfg: BertConfig) -> str:
  """'bert' (transformers' `BertForPreTraining`) or 'modernbert' (`ModernBertForMaskedLM`).

  `norm_placement` decides which one a config means; any other field that departs from that
  architecture makes it neither: a ConversionError naming the field.
  """
  arch, name = ("bert", "BERT") if cfg.norm_placement == "post" else ("modernbert", "ModernBERT")
  i = 0 if arch == "bert" else 1
  want = {field: values[i] for field, values in _ARCH_FIELDS.items()}
  if arch == "bert":
    want["use_bias"] = True  # transformers' BERT has every bias
  else:
    want["type_vocab_size"] = 0  # ModernBERT has no token types
  for field, value in want.items():
    if getattr(cfg, field) != value:
      raise ConversionError(
          f"config is neither BERT- nor ModernBERT-shaped: norm_placement="
          f"{cfg.norm_placement!r} is {name}'s but {field}={getattr(cfg, field)!r} is not "
          f"({name}: {value!r})"
      )
  if arch == "bert" and cfg.type_vocab_size < 1:
    raise ConversionError(
        "config is neither BERT- nor ModernBERT-shaped: norm_placement='post' is BERT's but "
        "type_vocab_size=0 is not (BERT: 1 or more)"
    )
  if arch == "bert" and cfg.local_attention and cfg.global_every > 1:
    raise ConversionError(
        "config is neither BERT- nor ModernBERT-shaped: norm_placement='post' is BERT's but "
        f"local_attention={cfg.local_attention} is not (BERT: 0, every layer global)"
    )
  return arch


def _global_every(layer_types: list[str], source: str) -> int:
  """The n for which layer i is "full_attention" exactly when i % n == 0."""
  for n in range(1, len(layer_types) + 1):
    pattern = [
        "full_attention" if i % n == 0 else "sliding_attention" for i in range(len(layer_types))
    ]
    if layer_types == pattern:
      return n
  raise ConversionError(
      f"{source}: layer_types={layer_types} is not a global layer every n layers from layer 0, "
      "the pattern bertjax's global_every describes"
  )


def config_from_modernbert(
    hf: dict[str, Any], source: str = "config.json", **overrides
) -> BertConfig:
  """A `BertConfig` from a transformers ModernBERT `config.json` dict (the fields of
  transformers 5, `layer_types` and `rope_parameters`, or the older `global_attn_every_n_layers`
  and `global_rope_theta` / `local_rope_theta`)."""
  for field in REQUIRED_HF_FIELDS:
    if field not in hf:
      raise ConversionError(f"{source}: field {field!r} is missing")
  act = hf.get("hidden_activation", "gelu")
  if act not in _HF_ACT:
    raise ConversionError(
        f"{source}: hidden_activation={act!r} is not supported; valid: {sorted(_HF_ACT)}"
    )
  if hf.get("classifier_activation", act) != act:
    raise ConversionError(
        f"{source}: classifier_activation={hf['classifier_activation']!r} differs from "
        f"hidden_activation={act!r}; bertjax's MLM head uses hidden_act"
    )
  biases = {f: bool(hf.get(f, False)) for f in _BIAS_FIELDS}
  if len(set(biases.values())) > 1:
    raise ConversionError(
        f"{source}: {biases} mix biases; bertjax's use_bias is one switch for all of them"
    )
  layers = hf["num_hidden_layers"]
  every = hf.get("global_attn_every_n_layers", 3)
  layer_types = hf.get("layer_types") or [
      "sliding_attention" if i % every else "full_attention" for i in range(layers)
  ]
  global_every = _global_every(list(layer_types), source)
  rope = hf.get("rope_parameters") or {}
  theta = {}
  for kind, old_field, default in (
      ("full_attention", "global_rope_theta", 160000.0),
      ("sliding_attention", "local_rope_theta", 10000.0),
  ):
    params = rope.get(kind) or {}
    if params.get("rope_type", "default") != "default":
      raise ConversionError(
          f"{source}: rope_parameters.{kind}.rope_type={params['rope_type']!r}; only 'default' "
          "(plain RoPE) is supported"
      )
    theta[kind] = float(params.get("rope_theta", hf.get(old_field, default)))
  fields = dict(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      num_layers=layers,
      num_heads=hf["num_attention_heads"],
      intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 8192),
      type_vocab_size=0,
      hidden_act=_HF_ACT[act],
      # Dropout sits in slightly different places (transformers drops the GLU's product and
      # the embeddings separately); equal in evaluation, where there is none.
      hidden_dropout_rate=hf.get("mlp_dropout", 0.0),
      attention_dropout_rate=hf.get("attention_dropout", 0.0),
      layer_norm_eps=hf.get("norm_eps", 1e-5),
      initializer_range=hf.get("initializer_range", 0.02),
      norm_placement="pre",
      mlp_type="glu",
      position_embedding="rope",
      rope_theta=theta["full_attention"],
      local_rope_theta=theta["sliding_attention"],
      use_bias=biases["attention_bias"],
      local_attention=hf.get("local_attention", 128) if global_every > 1 else 0,
      global_every=global_every,
  )
  fields.update(overrides)
  return BertConfig(**fields)


def config_to_modernbert(cfg: BertConfig) -> dict[str, Any]:
  """The `config.json` dict that `transformers.ModernBertConfig` reads (version 5's fields, and
  the older ones beside them for transformers 4.48-4.57)."""
  local = cfg.local_attention > 0 and cfg.global_every > 1
  layer_types = [
      "full_attention" if not local or i % cfg.global_every == 0 else "sliding_attention"
      for i in range(cfg.num_layers)
  ]
  return {
      "architectures": ["ModernBertForMaskedLM"],
      "model_type": "modernbert",
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.intermediate_size,
      "hidden_activation": cfg.hidden_act,
      "classifier_activation": cfg.hidden_act,
      "max_position_embeddings": cfg.max_position_embeddings,
      "initializer_range": cfg.initializer_range,
      "norm_eps": cfg.layer_norm_eps,
      **{field: cfg.use_bias for field in _BIAS_FIELDS},
      "decoder_bias": True,
      "attention_dropout": cfg.attention_dropout_rate,
      "mlp_dropout": cfg.hidden_dropout_rate,
      "embedding_dropout": cfg.hidden_dropout_rate,
      # With every layer global the window is never used; a window over everything says so.
      "local_attention": cfg.local_attention if local else 2 * cfg.max_position_embeddings,
      "layer_types": layer_types,
      "global_attn_every_n_layers": cfg.global_every if local else 1,
      "rope_parameters": {
          "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
          "sliding_attention": {"rope_type": "default", "rope_theta": cfg.local_rope_theta},
      },
      "global_rope_theta": cfg.rope_theta,
      "local_rope_theta": cfg.local_rope_theta,
      "pad_token_id": 0,
      "bos_token_id": None,
      "eos_token_id": None,
      "cls_token_id": None,
      "sep_token_id": None,
      "tie_word_embeddings": True,
  }


# ------------------------------------------------------------------------------- tensor table

# An entry: our path (tuple of keys), the HF names it is made of, and the two layout maps.
_Entry = tuple[
    tuple[str, ...],
    tuple[str, ...],
    Callable[..., np.ndarray],
    Callable[[np.ndarray], tuple[np.ndarray, ...]],
]


def _same(x):
  return x


def _dense_in(w):  # torch [out, in] -> flax [in, out]
  return np.ascontiguousarray(w.T)


def _dense_out(k):
  return (np.ascontiguousarray(k.T),)


def _one(fn):
  return lambda x: (fn(x),)


def _hf_entries(cfg: BertConfig) -> Iterator[_Entry]:
  n, d, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size

  def ln(ours, theirs):
    yield ours + ("scale",), (theirs + ".weight",), _same, _one(_same)
    yield ours + ("bias",), (theirs + ".bias",), _same, _one(_same)

  def dense(ours, theirs):
    yield ours + ("kernel",), (theirs + ".weight",), _dense_in, _dense_out
    yield ours + ("bias",), (theirs + ".bias",), _same, _one(_same)

  emb = ("bert", "embeddings")
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    yield emb + (name, "embedding"), (f"bert.embeddings.{name}.weight",), _same, _one(_same)
  yield from ln(emb + ("layer_norm",), "bert.embeddings.LayerNorm")
  for i in range(cfg.num_layers):
    ours = ("bert", "encoder", f"layer_{i}")
    hf = f"bert.encoder.layer.{i}"
    qkv = tuple(f"{hf}.attention.self.{m}" for m in ("query", "key", "value"))
    yield (
        ours + ("attention", "qkv", "kernel"),
        tuple(q + ".weight" for q in qkv),
        lambda *ws: np.stack([w.T for w in ws], axis=1).reshape(h, 3, n, d),
        lambda k: tuple(np.ascontiguousarray(k.reshape(h, 3, h)[:, j].T) for j in range(3)),
    )
    yield (
        ours + ("attention", "qkv", "bias"),
        tuple(q + ".bias" for q in qkv),
        lambda *bs: np.stack(bs).reshape(3, n, d),
        lambda b: tuple(b.reshape(3, h)[j] for j in range(3)),
    )
    yield (
        ours + ("attention", "out", "kernel"),
        (f"{hf}.attention.output.dense.weight",),
        lambda w: np.ascontiguousarray(w.T).reshape(n, d, h),
        lambda k: (np.ascontiguousarray(k.reshape(h, h).T),),
    )
    yield (
        ours + ("attention", "out", "bias"),
        (f"{hf}.attention.output.dense.bias",),
        _same,
        _one(_same),
    )
    yield from ln(ours + ("attention_layer_norm",), f"{hf}.attention.output.LayerNorm")
    yield from dense(ours + ("intermediate",), f"{hf}.intermediate.dense")
    yield from dense(ours + ("output",), f"{hf}.output.dense")
    yield from ln(ours + ("output_layer_norm",), f"{hf}.output.LayerNorm")
  yield from dense(("bert", "pooler"), "bert.pooler.dense")
  yield from dense(("mlm_transform",), "cls.predictions.transform.dense")
  yield from ln(("mlm_layer_norm",), "cls.predictions.transform.LayerNorm")
  yield ("mlm_bias",), ("cls.predictions.bias",), _same, _one(_same)
  yield from dense(("nsp",), "cls.seq_relationship")


def _modernbert_entries(cfg: BertConfig) -> Iterator[_Entry]:
  """`ModernBertForMaskedLM`'s tensors. Layer 0 has no attention norm, in either network."""
  n, d, h, f = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
  bias = cfg.use_bias

  def norm(ours, theirs):
    yield ours + ("scale",), (theirs + ".weight",), _same, _one(_same)
    if bias:
      yield ours + ("bias",), (theirs + ".bias",), _same, _one(_same)

  def linear(ours, theirs, kernel_shape, bias_shape, inputs=1):
    # torch [out, in] <-> bertjax's kernel, whose first `inputs` axes are the input's
    fan_in = int(np.prod(kernel_shape[:inputs]))
    yield (
        ours + ("kernel",),
        (theirs + ".weight",),
        lambda w: np.ascontiguousarray(w.T).reshape(kernel_shape),
        lambda k: (np.ascontiguousarray(k.reshape(fan_in, -1).T),),
    )
    if bias:
      yield ours + ("bias",), (theirs + ".bias",), lambda b: b.reshape(bias_shape), _one(np.ravel)

  emb = ("bert", "embeddings")
  yield emb + ("word_embeddings", "embedding"), (
      "model.embeddings.tok_embeddings.weight",
  ), _same, _one(_same)
  yield from norm(emb + ("layer_norm",), "model.embeddings.norm")
  for i in range(cfg.num_layers):
    ours, hf = ("bert", "encoder", f"layer_{i}"), f"model.layers.{i}"
    if i > 0:
      yield from norm(ours + ("attention_layer_norm",), f"{hf}.attn_norm")
    yield from linear(ours + ("attention", "qkv"), f"{hf}.attn.Wqkv", (h, 3, n, d), (3, n, d))
    yield from linear(ours + ("attention", "out"), f"{hf}.attn.Wo", (n, d, h), (h,), inputs=2)
    yield from norm(ours + ("mlp_layer_norm",), f"{hf}.mlp_norm")
    yield from linear(ours + ("intermediate",), f"{hf}.mlp.Wi", (h, 2, f), (2, f))
    yield from linear(ours + ("output",), f"{hf}.mlp.Wo", (f, h), (h,))
  yield from norm(("bert", "final_layer_norm"), "model.final_norm")
  yield from linear(("mlm_transform",), "head.dense", (h, h), (h,))
  yield from norm(("mlm_layer_norm",), "head.norm")
  yield ("mlm_bias",), ("decoder.bias",), _same, _one(_same)


def _entries(cfg: BertConfig) -> Iterator[_Entry]:
  return _modernbert_entries(cfg) if hf_architecture(cfg) == "modernbert" else _hf_entries(cfg)


def _fresh_heads(cfg: BertConfig) -> Params:
  """bertjax's pooler and NSP head, which ModernBERT does not have: their initial values,
  the same on every load (seed 0)."""
  pooler_key, nsp_key = jax.random.split(jax.random.key(0))
  x_1xH = jnp.zeros((1, cfg.hidden_size), cfg.params_dtype)
  pooler = bert_lib.dense(cfg, cfg.hidden_size, ("embed", "embed_out"), use_bias=True)
  nsp = bert_lib.dense(cfg, 2, ("embed", "classes"), use_bias=True)
  to_numpy = lambda tree: jax.tree.map(np.asarray, nn.unbox(tree["params"]))
  return {
      "pooler": to_numpy(pooler.init(pooler_key, x_1xH)),
      "nsp": to_numpy(nsp.init(nsp_key, x_1xH)),
  }


def hf_tensor_names(cfg: BertConfig) -> set[str]:
  """Every HF tensor name `hf_to_params` reads for this config."""
  return {n for _, names, _, _ in _entries(cfg) for n in names}


def _legacy_names(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Old checkpoints name LayerNorm parameters gamma/beta."""
  out = {}
  for k, v in state.items():
    if ".LayerNorm." in k:
      k = k.replace(".gamma", ".weight").replace(".beta", ".bias")
    out[k] = v
  return out


def hf_to_params(
    state: dict[str, np.ndarray], cfg: BertConfig, source: str = "checkpoint"
) -> Params:
  """A bertjax `BertForPreTraining` parameter tree (unscanned) from HF tensors (numpy):
  `BertForPreTraining`'s, or `ModernBertForMaskedLM`'s for a ModernBERT-shaped config."""
  modern = hf_architecture(cfg) == "modernbert"
  if not modern:
    state = _legacy_names(state)
  if (
      not modern
      and "bert.embeddings.word_embeddings.weight" not in state
      and any(k.startswith("embeddings.") for k in state)
  ):
    state = {("bert." + k if not k.startswith("cls.") else k): v for k, v in state.items()}
  if modern and "decoder.bias" not in state:  # decoder_bias=False: a zero bias is the same
    state = dict(state, **{"decoder.bias": np.zeros(cfg.vocab_size, np.float32)})
  params: Params = {}
  used = set()
  for path, names, to_ours, _ in _entries(cfg):
    missing = [nm for nm in names if nm not in state]
    if missing:
      kind = "ModernBertForMaskedLM" if modern else "BertForPreTraining"
      raise ConversionError(
          f"{source}: tensor {missing[0]!r} is missing (is this a {kind} checkpoint?)"
      )
    value = np.asarray(to_ours(*[np.asarray(state[nm], np.float32) for nm in names]))
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
    used.update(names)
  if modern:
    params["bert"].update(pooler=_fresh_heads(cfg)["pooler"])
    params["nsp"] = _fresh_heads(cfg)["nsp"]
  decoder = state.get("decoder.weight" if modern else "cls.predictions.decoder.weight")
  if decoder is not None and not np.array_equal(
      np.asarray(decoder, np.float32), params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  ):
    raise ConversionError(
        f"{source}: the MLM decoder's weight is not tied to the word embeddings; bertjax's "
        "MLM decoder is always tied, as in BERT and ModernBERT"
    )
  _check_shapes(params, cfg, source)
  return params


def params_to_hf(params: Params, cfg: BertConfig) -> dict[str, np.ndarray]:
  """HF tensors (numpy float32) from a bertjax parameter tree: `BertForPreTraining`'s, or
  `ModernBertForMaskedLM`'s for a ModernBERT-shaped config (the pooler and NSP head dropped)."""
  if "layers" in params.get("bert", {}).get("encoder", {}):
    params = model_lib.unstack_layer_params(params)
  state: dict[str, np.ndarray] = {}
  for path, names, _, to_theirs in _entries(cfg):
    node = params
    for key in path:
      node = node[key]
    for nm, value in zip(names, to_theirs(np.asarray(node, np.float32))):
      state[nm] = np.ascontiguousarray(value)
  if hf_architecture(cfg) == "modernbert":
    state["decoder.weight"] = state["model.embeddings.tok_embeddings.weight"]
    return state
  state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
  state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
  return state


def _check_shapes(params: Params, cfg: BertConfig, source: str) -> None:
  d = model_lib.dummy_inputs()
  want = jax.eval_shape(
      lambda: model_lib.BertForPreTraining(cfg).init(
          jax.random.key(0),
          d["input_ids"],
          d["token_type_ids"],
          d["attention_mask"],
          d["masked_positions"],
      )
  )["params"]
  want = jax.tree_util.tree_leaves_with_path(nn.unbox(want))
  got = dict(jax.tree_util.tree_leaves_with_path(params))
  for path, w in want:
    name = "/".join(str(getattr(p, "key", p)) for p in path)
    g = got.get(path)
    if g is None:
      raise ConversionError(f"{source}: no tensor for {name}")
    if tuple(w.shape) != tuple(g.shape):
      raise ConversionError(
          f"{source}: {name} has shape {tuple(g.shape)}, the config implies " f"{tuple(w.shape)}"
      )


# ------------------------------------------------------------------------------------ loading


def read_hf_state(path: str | epath.Path) -> dict[str, np.ndarray]:
  """Tensors of a HF model directory: model.safetensors (preferred) or pytorch_model.bin. Any
  scheme: safetensors and torch read a local copy of a remote file."""
  path = fs.path(path)
  st = path / "model.safetensors"
  if st.exists():
    from safetensors.numpy import load_file  # the `interop` extra, only for HF files

    with fs.local_copy(st) as local:
      try:
        return load_file(local)
      except Exception as e:  # a truncated or foreign file
        raise ConversionError(f"{st}: not a readable safetensors file ({e})") from e
  shards = sorted(path.glob("model-*.safetensors"))
  if shards:
    from safetensors.numpy import load_file  # the `interop` extra, only for HF files

    state = {}
    for shard in shards:
      with fs.local_copy(shard) as local:
        state.update(load_file(local))
    return state
  binary = path / "pytorch_model.bin"
  if binary.exists():
    try:  # torch only for a legacy .bin; safetensors needs none
      import torch
    except ImportError as e:
      raise ConversionError(
          f"{binary}: reading .bin checkpoints needs torch; install "
          "bertjax[interop] and torch, or convert to safetensors"
      ) from e
    # weights_only=True never runs pickled code from the file.
    with fs.local_copy(binary) as local:
      tensors = torch.load(local, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in tensors.items()}
  raise ConversionError(f"{path}: no model.safetensors or pytorch_model.bin found")


def load_hf(path: str | epath.Path, **config_overrides) -> tuple[BertConfig, Params]:
  """Read a Hugging Face `BertForPreTraining` or `ModernBertForMaskedLM` directory (config.json
  with model_type "bert" or "modernbert", and model.safetensors or pytorch_model.bin).

  Returns the config and an unscanned float32 parameter tree for `model.BertForPreTraining`
  (for ModernBERT with a fresh pooler and NSP head, `_fresh_heads`).
  """
  path = fs.path(path)
  cfg_file = path / "config.json"
  if not cfg_file.exists():
    raise ConversionError(f"{cfg_file}: not found (expected a Hugging Face model directory)")
  try:
    hf_cfg = json.loads(cfg_file.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{cfg_file}:{e.lineno}: invalid JSON ({e.msg})") from e
  if isinstance(hf_cfg, dict) and hf_cfg.get("model_type") == "modernbert":
    cfg = config_from_modernbert(hf_cfg, str(cfg_file), **config_overrides)
  else:
    cfg = config_from_hf(hf_cfg, **config_overrides)
  return cfg, hf_to_params(read_hf_state(path), cfg, source=str(path))


def save_hf(params: Params, cfg: BertConfig, path: str | epath.Path) -> None:
  """Write config.json + model.safetensors loadable by `BertForPreTraining.from_pretrained`, or
  by `ModernBertForMaskedLM.from_pretrained` for a ModernBERT-shaped config; a config that is
  neither is refused (`hf_architecture`) before anything is written."""
  from safetensors.numpy import save_file  # the `interop` extra, only for HF files

  modern = hf_architecture(cfg) == "modernbert"
  state = params_to_hf(params, cfg)
  # safetensors refuses aliased tensors; HF re-ties the decoder to the embeddings on load.
  if modern:
    state.pop("decoder.weight")
  else:
    state.pop("cls.predictions.decoder.weight")
    state.pop("cls.predictions.decoder.bias")
  path = fs.path(path)
  path.mkdir(parents=True, exist_ok=True)
  if fs.is_local(path):
    save_file(state, os.fspath(path / "model.safetensors"), metadata={"format": "pt"})
  else:  # safetensors writes only local files: written here, then copied up
    with tempfile.TemporaryDirectory(prefix="bertjax-") as tmp:
      local = os.path.join(tmp, "model.safetensors")
      save_file(state, local, metadata={"format": "pt"})
      epath.Path(local).copy(path / "model.safetensors", overwrite=True)
  hf_cfg = config_to_modernbert(cfg) if modern else config_to_hf(cfg)
  (path / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
