"""Weight conversion between Hugging Face `BertForPreTraining` and bertjax parameter trees.

One table, `_hf_entries`, names every tensor once; import (`hf_to_params`) and export
(`params_to_hf`) both read it, so they cannot drift apart. Files are never unpickled:
`model.safetensors` is read with safetensors; a legacy `pytorch_model.bin` only through
`torch.load(weights_only=True)`.

Layouts: a PyTorch Linear weight is [out, in]; a Flax Dense kernel is [in, out]. bertjax fuses
query/key/value into one kernel [H, 3, N, D] and keeps the attention output kernel as
[N, D, H] so heads can be sharded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.model.config import BertConfig

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


def hf_tensor_names(cfg: BertConfig) -> set[str]:
  """Every HF tensor name `hf_to_params` reads for this config."""
  return {n for _, names, _, _ in _hf_entries(cfg) for n in names}


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
  """A bertjax `BertForPreTraining` parameter tree (unscanned) from HF tensors (numpy)."""
  state = _legacy_names(state)
  if "bert.embeddings.word_embeddings.weight" not in state and any(
      k.startswith("embeddings.") for k in state
  ):
    state = {("bert." + k if not k.startswith("cls.") else k): v for k, v in state.items()}
  params: Params = {}
  used = set()
  for path, names, to_ours, _ in _hf_entries(cfg):
    missing = [nm for nm in names if nm not in state]
    if missing:
      raise ConversionError(
          f"{source}: tensor {missing[0]!r} is missing "
          f"(is this a BertForPreTraining checkpoint?)"
      )
    value = np.asarray(to_ours(*[np.asarray(state[nm], np.float32) for nm in names]))
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
    used.update(names)
  decoder = state.get("cls.predictions.decoder.weight")
  if decoder is not None and not np.array_equal(
      np.asarray(decoder, np.float32), params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  ):
    raise ConversionError(
        f"{source}: cls.predictions.decoder.weight is not tied to the word "
        "embeddings; bertjax's MLM decoder is always tied, as in BERT"
    )
  _check_shapes(params, cfg, source)
  return params


def params_to_hf(params: Params, cfg: BertConfig) -> dict[str, np.ndarray]:
  """HF `BertForPreTraining` tensors (numpy float32) from a bertjax parameter tree."""
  if "layers" in params.get("bert", {}).get("encoder", {}):
    params = model_lib.unstack_layer_params(params)
  state: dict[str, np.ndarray] = {}
  for path, names, _, to_theirs in _hf_entries(cfg):
    node = params
    for key in path:
      node = node[key]
    for nm, value in zip(names, to_theirs(np.asarray(node, np.float32))):
      state[nm] = np.ascontiguousarray(value)
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


def read_hf_state(path: str | Path) -> dict[str, np.ndarray]:
  """Tensors of a HF model directory: model.safetensors (preferred) or pytorch_model.bin."""
  path = Path(path)
  st = path / "model.safetensors"
  if st.exists():
    from safetensors.numpy import load_file  # the `interop` extra, only for HF files

    try:
      return load_file(str(st))
    except Exception as e:  # a truncated or foreign file
      raise ConversionError(f"{st}: not a readable safetensors file ({e})") from e
  shards = sorted(path.glob("model-*.safetensors"))
  if shards:
    from safetensors.numpy import load_file  # the `interop` extra, only for HF files

    state = {}
    for shard in shards:
      state.update(load_file(str(shard)))
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
    tensors = torch.load(str(binary), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in tensors.items()}
  raise ConversionError(f"{path}: no model.safetensors or pytorch_model.bin found")


def load_hf(path: str | Path, **config_overrides) -> tuple[BertConfig, Params]:
  """Read a Hugging Face `BertForPreTraining` directory (config.json + weights).

  Returns the config and an unscanned float32 parameter tree for `model.BertForPreTraining`.
  """
  path = Path(path)
  cfg_file = path / "config.json"
  if not cfg_file.exists():
    raise ConversionError(f"{cfg_file}: not found (expected a Hugging Face model directory)")
  try:
    hf_cfg = json.loads(cfg_file.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{cfg_file}:{e.lineno}: invalid JSON ({e.msg})") from e
  cfg = config_from_hf(hf_cfg, **config_overrides)
  return cfg, hf_to_params(read_hf_state(path), cfg, source=str(path))


def save_hf(params: Params, cfg: BertConfig, path: str | Path) -> None:
  """Write config.json + model.safetensors loadable by `BertForPreTraining.from_pretrained`."""
  from safetensors.numpy import save_file  # the `interop` extra, only for HF files

  path = Path(path)
  path.mkdir(parents=True, exist_ok=True)
  state = params_to_hf(params, cfg)
  # safetensors refuses aliased tensors; HF re-ties the decoder to the embeddings on load.
  state.pop("cls.predictions.decoder.weight")
  state.pop("cls.predictions.decoder.bias")
  save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
  (path / "config.json").write_text(json.dumps(config_to_hf(cfg), indent=2) + "\n")
