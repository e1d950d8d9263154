"""Weight conversion between Hugging Face models and bertjax parameter trees: transformers'
`BertForPreTraining` for BERT-shaped configs, `RobertaForMaskedLM` for RoBERTa-shaped ones (BERT's
network, positions offset by 2; XLM-R's directories read the same), `ModernBertForMaskedLM` for
ModernBERT-shaped ones (`hf_architecture` says which a config is; a mix is refused).

One table per architecture, `_hf_entries` and `_modernbert_entries`, names every tensor once;
import (`hf_to_params`) and export (`params_to_hf`) both read it, so they cannot drift apart. Files are never unpickled:
`model.safetensors` is read with safetensors; a legacy `pytorch_model.bin` only through
`torch.load(weights_only=True)`.

Layouts: a PyTorch Linear weight is [out, in]; a Flax Dense kernel is [in, out]. bertjax fuses
query/key/value into one kernel [H, 3, N, D] and keeps the attention output kernel as
[N, D, H] so heads can be sharded. ModernBERT's `Wqkv` [3·H, H] is the same fused product, and
its GLU `Wi` [2·F, H] (input half, then gate half) is bertjax's [H, 2, F] GLU kernel.

ModernBERT has no pooler and no NSP head; loading one gives bertjax's (`bert/pooler`, `nsp`)
fresh, deterministic initial values (`_fresh_heads`) and saving one drops them. A BERT
directory may lack heads too: `BertForMaskedLM` (what transformers' `run_mlm.py` saves) has no
pooler and no NSP head, `BertModel` no MLM or NSP head; those heads start fresh the same way,
and `load_hf(..., fresh=[])` says which.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Callable, Iterator

from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import model as model_lib
from bertjax.model import bert as bert_lib
from bertjax.model.config import BertConfig
from bertjax.runtime import fs

# The configs (importable from here, where callers have always found them).
from bertjax.interop.hf_config import (  # noqa: F401
    REQUIRED_HF_FIELDS,
    ROBERTA_TYPES,
    ConversionError,
    config_from_hf,
    config_from_modernbert,
    config_from_roberta,
    config_to_hf,
    config_to_modernbert,
    config_to_roberta,
    hf_architecture,
)

Params = dict[str, Any]

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


# The names of BERT's and RoBERTa's tensors (the same encoder under another prefix; RoBERTa's MLM
# head is `lm_head`, and it has no NSP head).
_NAMES = {
    "bert": {
        "encoder": "bert",
        "mlm": "cls.predictions.",
        "mlm_dense": "cls.predictions.transform.dense",
        "mlm_norm": "cls.predictions.transform.LayerNorm",
        "mlm_bias": "cls.predictions.bias",
        "decoder": "cls.predictions.decoder",
        "nsp": "cls.seq_relationship",
    },
    "roberta": {
        "encoder": "roberta",
        "mlm": "lm_head.",
        "mlm_dense": "lm_head.dense",
        "mlm_norm": "lm_head.layer_norm",
        "mlm_bias": "lm_head.bias",
        "decoder": "lm_head.decoder",
        "nsp": None,
    },
}


def _hf_entries(cfg: BertConfig, family: str = "bert") -> Iterator[_Entry]:
  """`BertForPreTraining`'s tensors, or `RobertaForMaskedLM`'s (family "roberta")."""
  n, d, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size
  names = _NAMES[family]
  enc = names["encoder"]

  def ln(ours, theirs):
    yield ours + ("scale",), (theirs + ".weight",), _same, _one(_same)
    yield ours + ("bias",), (theirs + ".bias",), _same, _one(_same)

  def dense(ours, theirs):
    yield ours + ("kernel",), (theirs + ".weight",), _dense_in, _dense_out
    yield ours + ("bias",), (theirs + ".bias",), _same, _one(_same)

  emb = ("bert", "embeddings")
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    yield emb + (name, "embedding"), (f"{enc}.embeddings.{name}.weight",), _same, _one(_same)
  yield from ln(emb + ("layer_norm",), f"{enc}.embeddings.LayerNorm")
  for i in range(cfg.num_layers):
    ours = ("bert", "encoder", f"layer_{i}")
    hf = f"{enc}.encoder.layer.{i}"
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
  yield from dense(("bert", "pooler"), f"{enc}.pooler.dense")
  yield from dense(("mlm_transform",), names["mlm_dense"])
  yield from ln(("mlm_layer_norm",), names["mlm_norm"])
  yield ("mlm_bias",), (names["mlm_bias"],), _same, _one(_same)
  if names["nsp"]:
    yield from dense(("nsp",), names["nsp"])


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
  arch = hf_architecture(cfg)
  return _modernbert_entries(cfg) if arch == "modernbert" else _hf_entries(cfg, arch)


def _fresh_heads(cfg: BertConfig) -> Params:
  """bertjax's pooler, NSP head and MLM head (its transform, LayerNorm and output bias; the
  decoder is the tied word embeddings), for checkpoints without them: their initial values as
  the model initialises them, the same on every load (seed 0)."""
  pooler_key, nsp_key, mlm_key = jax.random.split(jax.random.key(0), 3)
  x_1xH = jnp.zeros((1, cfg.hidden_size), cfg.params_dtype)
  pooler = bert_lib.dense(cfg, cfg.hidden_size, ("embed", "embed_out"), use_bias=True)
  nsp = bert_lib.dense(cfg, 2, ("embed", "classes"), use_bias=True)
  transform = bert_lib.dense(cfg, cfg.hidden_size, ("embed", "embed_out"))
  to_numpy = lambda tree: jax.tree.map(np.asarray, nn.unbox(tree["params"]))
  h = cfg.hidden_size
  return {
      "pooler": to_numpy(pooler.init(pooler_key, x_1xH)),
      "nsp": to_numpy(nsp.init(nsp_key, x_1xH)),
      "mlm_transform": to_numpy(transform.init(mlm_key, x_1xH)),
      "mlm_layer_norm": {"scale": np.ones(h, np.float32), "bias": np.zeros(h, np.float32)},
      "mlm_bias": np.zeros(cfg.vocab_size, np.float32),
  }


def _optional_heads(family: str) -> tuple:
  """A BERT or RoBERTa checkpoint's optional heads: what each is called, the prefix of its
  tensors (None: the family never has it), and the parameters it fills."""
  names = _NAMES[family]
  return (
      ("the pooler", f"{names['encoder']}.pooler.", (("bert", "pooler"),)),
      ("the NSP head", f"{names['nsp']}." if names["nsp"] else None, (("nsp",),)),
      (
          "the MLM head",
          names["mlm"],
          (("mlm_transform",), ("mlm_layer_norm",), ("mlm_bias",)),
      ),
  )


# The heads a `BertForPreTraining` tree holds beside its encoder. One that never trained (it
# started fresh and no step has updated it) is not exported: `hf_class` picks the transformers
# class that holds only what was trained, and transformers reports the rest as missing.
HEADS = ("mlm", "nsp", "pooler")
_HEAD_IDS = {
    "the MLM head": "mlm",
    "the NSP head": "nsp",
    "the pooler": "pooler",
    "the discriminator head": "discriminator",
}


def head_ids(fresh: list[str]) -> list[str]:
  """The head ids (`HEADS`, "discriminator") of `fresh`'s names ("the MLM head", ...)."""
  return sorted({_HEAD_IDS[name] for name in fresh if name in _HEAD_IDS})


def hf_class(cfg: BertConfig, untrained=()) -> str:
  """The transformers class an export of `cfg` is written as: the one that holds every trained
  head and no untrained one (`BertForPreTraining`, `BertForMaskedLM`, `BertModel`; RoBERTa's
  and ModernBERT's `...ForMaskedLM` or `...Model`)."""
  arch, u = hf_architecture(cfg), set(untrained)
  if arch == "modernbert":
    return "ModernBertModel" if "mlm" in u else "ModernBertForMaskedLM"
  if arch == "roberta":
    return "RobertaModel" if "mlm" in u else "RobertaForMaskedLM"
  if "mlm" in u:
    return "BertModel"
  return "BertForMaskedLM" if "nsp" in u else "BertForPreTraining"


def _trained_only(state: dict, cfg: BertConfig, cls: str, untrained) -> dict:
  """`params_to_hf`'s tensors as `cls` names them, without an untrained head's."""
  arch, u = hf_architecture(cfg), set(untrained)
  if arch == "modernbert":
    enc, mlm, nsp = "model.", ("head.", "decoder."), ()
  else:
    names = _NAMES[arch]
    enc, mlm = names["encoder"] + ".", (names["mlm"],)
    nsp = (names["nsp"] + ".",) if names["nsp"] else ()
  drop = (f"{enc}pooler.",) if "pooler" in u else ()
  if cls == "BertForMaskedLM":  # transformers' BertForMaskedLM has no pooler
    drop = nsp + (f"{enc}pooler.",)
  elif cls.endswith("Model"):  # the encoder alone, its tensors without the prefix
    drop += mlm + nsp
    return {k.removeprefix(enc): v for k, v in state.items() if not k.startswith(drop)}
  return {k: v for k, v in state.items() if not k.startswith(drop)} if drop else state


def hf_tensor_names(cfg: BertConfig) -> set[str]:
  """Every HF tensor name `hf_to_params` reads for this config."""
  return {n for _, names, _, _ in _entries(cfg) for n in names}


class LazyTensors(Mapping):
  """The tensors of safetensors files, each read from its file when asked for: a checkpoint is
  converted a tensor at a time, never held whole beside its converted copy."""

  def __init__(self, where: dict[str, tuple[Any, str, str]]):
    self._where = where  # name -> (an open safe_open handle, the name in its file, the file)

  def __getitem__(self, name: str) -> np.ndarray:
    handle, key, file = self._where[name]
    try:
      return handle.get_tensor(key)
    except Exception as e:  # a truncated file: its header promises more than it holds
      raise ConversionError(f"{file}: not a readable safetensors file ({e})") from e

  def __iter__(self):
    return iter(self._where)

  def __len__(self) -> int:
    return len(self._where)

  def renamed(self, fn: Callable[[str], str]) -> "LazyTensors":
    return LazyTensors({fn(k): v for k, v in self._where.items()})


def _rename(state: Mapping, fn: Callable[[str], str]) -> Mapping:
  """`state` with every name passed through `fn`, without reading a lazy state's tensors."""
  if isinstance(state, LazyTensors):
    return state.renamed(fn)
  return {fn(k): v for k, v in state.items()}


def _legacy_name(k: str) -> str:
  """Old checkpoints name LayerNorm parameters gamma/beta."""
  if ".LayerNorm." in k:
    return k.replace(".gamma", ".weight").replace(".beta", ".bias")
  return k


def _legacy_names(state: Mapping) -> Mapping:
  return _rename(state, _legacy_name)


def _normalised(state: Mapping, arch: str) -> Mapping:
  """A BERT or RoBERTa state under the names `_hf_entries` reads: old LayerNorm names, and a bare
  encoder's (`BertModel`, `RobertaModel`) tensors under the family's prefix."""
  if arch == "modernbert":
    return state
  state = _legacy_names(state)
  enc = _NAMES[arch]["encoder"]
  if f"{enc}.embeddings.word_embeddings.weight" not in state and any(
      k.startswith("embeddings.") for k in state
  ):  # a bare encoder (BertModel, RobertaModel) saves its tensors without the prefix
    state = _rename(state, lambda k: f"{enc}." + k if not k.startswith(("cls.", "lm_head.")) else k)
  return state


def _absent_heads(state: Mapping, arch: str) -> list[tuple[str, tuple]]:
  """(name, parameter paths) of each optional head a normalised BERT/RoBERTa state lacks."""
  decoder_name = _NAMES[arch]["decoder"] + ".weight"
  return [
      (what, paths)
      for what, prefix, paths in _optional_heads(arch)
      if prefix is None or not any(k.startswith(prefix) and k != decoder_name for k in state)
  ]


def missing_heads(names, cfg: BertConfig) -> list[str]:
  """The heads ("the MLM head", ...) a checkpoint whose tensors are `names` lacks, which
  `hf_to_params` starts fresh; reads no tensor."""
  arch = hf_architecture(cfg)
  if arch == "modernbert":
    return ["the pooler", "the NSP head"]
  return [what for what, _ in _absent_heads(_normalised(dict.fromkeys(names), arch), arch)]


def hf_to_params(
    state: Mapping[str, np.ndarray],
    cfg: BertConfig,
    source: str = "checkpoint",
    fresh: list[str] | None = None,
    place: Callable[[tuple[str, ...], np.ndarray], Any] | None = None,
) -> Params:
  """A bertjax `BertForPreTraining` parameter tree (unscanned) from HF tensors (numpy):
  `BertForPreTraining`'s (or `BertForMaskedLM`'s, `BertModel`'s), or `ModernBertForMaskedLM`'s
  for a ModernBERT-shaped config. `place(path, array)`, when given, turns each parameter into
  what the tree holds as soon as it is converted (a device array on its sharding), so a lazy
  `state` is never in host memory whole. Heads the checkpoint has none of start fresh
  (`_fresh_heads`); their names are appended to `fresh` when given."""
  arch = hf_architecture(cfg)
  modern = arch == "modernbert"
  state = _normalised(state, arch)
  defaults = {}
  if modern and "decoder.bias" not in state:  # decoder_bias=False: a zero bias is the same
    defaults["decoder.bias"] = np.zeros(cfg.vocab_size, np.float32)
  params: Params = {}
  used = set()
  absent = set()  # parameter paths of the heads the checkpoint has none of
  if not modern:
    for what, paths in _absent_heads(state, arch):
      absent.update(paths)
      if fresh is not None:
        fresh.append(what)
  for path, names, to_ours, _ in _entries(cfg):
    if any(path[: len(p)] == p for p in absent):
      continue
    missing = [nm for nm in names if nm not in state and nm not in defaults]
    if missing:
      kind = {
          "modernbert": "ModernBertForMaskedLM",
          "bert": "BertForPreTraining",
          "roberta": "RobertaForMaskedLM",
      }[arch]
      raise ConversionError(
          f"{source}: tensor {missing[0]!r} is missing (is this a {kind} checkpoint?)"
      )
    tensors = [state[nm] if nm in state else defaults[nm] for nm in names]
    value = np.asarray(to_ours(*[np.asarray(t, np.float32) for t in tensors]))
    del tensors
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = place(path, value) if place else value
    del value
    used.update(names)
  if modern:
    absent = {("bert", "pooler"), ("nsp",)}
    if fresh is not None:
      fresh.extend(("the pooler", "the NSP head"))
  if absent:
    heads = _fresh_heads(cfg)
    for path in absent:
      node = params
      for key in path[:-1]:
        node = node.setdefault(key, {})
      node[path[-1]] = heads[path[-1]]
  decoder = state.get("decoder.weight" if modern else _NAMES[arch]["decoder"] + ".weight")
  if decoder is not None and not np.array_equal(
      np.asarray(decoder, np.float32), params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  ):
    raise ConversionError(
        f"{source}: the MLM decoder's weight is not tied to the word embeddings; bertjax's "
        "MLM decoder is always tied, as in BERT, RoBERTa and ModernBERT"
    )
  _check_shapes(params, cfg, source)
  return params


def params_to_hf(params: Params, cfg: BertConfig, pooler: bool = False) -> dict[str, np.ndarray]:
  """HF tensors (numpy float32) from a bertjax parameter tree: `BertForPreTraining`'s, or
  `RobertaForMaskedLM`'s (the pooler and NSP head dropped; `pooler`: the pooler kept, as
  `RobertaModel` has it) for a RoBERTa-shaped config, or `ModernBertForMaskedLM`'s for a
  ModernBERT-shaped one (the pooler and NSP head dropped)."""
  if "layers" in params.get("bert", {}).get("encoder", {}):
    params = model_lib.unstack_layer_params(params)
  state: dict[str, np.ndarray] = {}
  arch = hf_architecture(cfg)
  for path, names, _, to_theirs in _entries(cfg):
    if arch == "roberta" and path[:2] == ("bert", "pooler") and not pooler:
      continue  # RobertaForMaskedLM has no pooler
    node = params
    for key in path:
      node = node[key]
    for nm, value in zip(names, to_theirs(np.asarray(node, np.float32))):
      state[nm] = np.ascontiguousarray(value)
  if arch == "modernbert":
    state["decoder.weight"] = state["model.embeddings.tok_embeddings.weight"]
    return state
  names = _NAMES[arch]
  state[names["decoder"] + ".weight"] = state[
      f"{names['encoder']}.embeddings.word_embeddings.weight"
  ]
  state[names["decoder"] + ".bias"] = state[names["mlm_bias"]]
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


def read_hf_state(path: str | epath.Path) -> Mapping[str, np.ndarray]:
  """Tensors of a HF model directory: model.safetensors (or its shards; preferred) or
  pytorch_model.bin. Local safetensors are read a tensor at a time (`LazyTensors`); any other
  scheme: safetensors and torch read a local copy of a remote file."""
  path = fs.path(path)
  st = path / "model.safetensors"
  files = [st] if st.exists() else sorted(path.glob("model-*.safetensors"))
  if files and all(fs.is_local(f) for f in files):  # read a tensor at a time, when asked for
    from safetensors import safe_open  # the `interop` extra, only for HF files

    where = {}
    for f in files:
      try:
        handle = safe_open(os.fspath(f), framework="numpy")
        where.update((k, (handle, k, str(f))) for k in handle.keys())
      except Exception as e:  # a truncated or foreign file
        raise ConversionError(f"{f}: not a readable safetensors file ({e})") from e
    return LazyTensors(where)
  if files:
    from safetensors.numpy import load_file  # the `interop` extra, only for HF files

    state = {}
    for f in files:  # a remote file: a local copy, read whole
      with fs.local_copy(f) as local:
        try:
          state.update(load_file(local))
        except Exception as e:  # a truncated or foreign file
          raise ConversionError(f"{f}: not a readable safetensors file ({e})") from e
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


def load_hf(
    path: str | epath.Path,
    *,
    fresh: list[str] | None = None,
    place: Callable[[tuple[str, ...], np.ndarray], Any] | None = None,
    **config_overrides,
) -> tuple[BertConfig, Params]:
  """Read a Hugging Face `BertForPreTraining`, `BertForMaskedLM`, `BertModel`,
  `RobertaForMaskedLM`, `XLMRobertaForMaskedLM`, `RobertaModel` or `ModernBertForMaskedLM`
  directory (config.json with model_type "bert", "roberta", "xlm-roberta" or "modernbert", and
  model.safetensors or pytorch_model.bin).

  Returns the config and an unscanned float32 parameter tree for `model.BertForPreTraining`;
  heads the directory lacks (ModernBERT's pooler and NSP head, a `BertForMaskedLM`'s pooler and
  NSP head, a `BertModel`'s MLM and NSP heads) start fresh (`_fresh_heads`) and are named in
  `fresh` when a list is given. `place`: as `hf_to_params`' (each parameter placed as it is
  read; with model.safetensors, the checkpoint is read a tensor at a time).
  """
  path = fs.path(path)
  cfg_file = path / "config.json"
  if not cfg_file.exists():
    raise ConversionError(f"{cfg_file}: not found (expected a Hugging Face model directory)")
  try:
    hf_cfg = json.loads(cfg_file.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{cfg_file}:{e.lineno}: invalid JSON ({e.msg})") from e
  model_type = hf_cfg.get("model_type") if isinstance(hf_cfg, dict) else None
  if model_type == "electra":  # interop/electra.py
    from bertjax.interop import electra

    cfg, params = electra.load_encoder(path, fresh=fresh)
    return cfg.replace(**config_overrides), params
  if model_type == "modernbert":
    cfg = config_from_modernbert(hf_cfg, str(cfg_file), **config_overrides)
  elif model_type in ROBERTA_TYPES:
    cfg = config_from_roberta(hf_cfg, str(cfg_file), **config_overrides)
  else:
    cfg = config_from_hf(hf_cfg, **config_overrides)
  state = read_hf_state(path)
  return cfg, hf_to_params(state, cfg, source=str(path), fresh=fresh, place=place)


def save_hf(params: Params, cfg: BertConfig, path: str | epath.Path, untrained=()) -> str:
  """Write config.json + model.safetensors loadable by `BertForPreTraining.from_pretrained`, by
  `RobertaForMaskedLM.from_pretrained` for a RoBERTa-shaped config (XLM-R's too: the same
  network), or by `ModernBertForMaskedLM.from_pretrained` for a ModernBERT-shaped one; a config
  that is none of them is refused (`hf_architecture`) before anything is written.

  `untrained`: the heads (`HEADS`) that never trained; the class written is then the one
  without them (`hf_class`: `BertForMaskedLM`, `BertModel`, ...). Returns the class's name."""
  from safetensors.numpy import save_file  # the `interop` extra, only for HF files

  arch = hf_architecture(cfg)
  cls = hf_class(cfg, untrained)
  state = params_to_hf(params, cfg, pooler=cls == "RobertaModel" and "pooler" not in untrained)
  # safetensors refuses aliased tensors; HF re-ties the decoder to the embeddings on load.
  if arch == "modernbert":
    state.pop("decoder.weight")
  else:
    state.pop(_NAMES[arch]["decoder"] + ".weight")
    state.pop(_NAMES[arch]["decoder"] + ".bias")
  state = _trained_only(state, cfg, cls, untrained)
  path = fs.path(path)
  path.mkdir(parents=True, exist_ok=True)
  if fs.is_local(path):
    save_file(state, os.fspath(path / "model.safetensors"), metadata={"format": "pt"})
  else:  # safetensors writes only local files: written here, then copied up
    with tempfile.TemporaryDirectory(prefix="bertjax-") as tmp:
      local = os.path.join(tmp, "model.safetensors")
      save_file(state, local, metadata={"format": "pt"})
      epath.Path(local).copy(path / "model.safetensors", overwrite=True)
  to_hf = {"modernbert": config_to_modernbert, "roberta": config_to_roberta}.get(arch, config_to_hf)
  hf_cfg = dict(to_hf(cfg), architectures=[cls])
  (path / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
  return cls
