"""The tensors of Hugging Face BERT-family checkpoints, named once: transformers'
`BertForPreTraining` for BERT-shaped configs, `RobertaForMaskedLM` for RoBERTa-shaped ones,
`ModernBertForMaskedLM` for ModernBERT-shaped ones (`hf_architecture` says which a config is).

One table per architecture, `bert_entries` and `modernbert_entries`, names every tensor once;
`convert`'s import (`hf_to_params`) and export (`params_to_hf`) and `electra`'s both read it,
so they cannot drift apart. Also: which optional heads a checkpoint has (`optional_heads`,
`absent_heads`, `missing_heads`), their fresh initial values (`fresh_heads`), which class an
export is written as (`hf_class`, `trained_only`), and the reading of safetensors files a
tensor at a time (`LazyTensors`, `read_hf_state`).

Layouts: a PyTorch Linear weight is [out, in]; a Flax Dense kernel is [in, out]. bertjax fuses
query/key/value into one kernel [H, 3, N, D] and keeps the attention output kernel as
[N, D, H] so heads can be sharded. ModernBERT's `Wqkv` [3·H, H] is the same fused product, and
its GLU `Wi` [2·F, H] (input half, then gate half) is bertjax's [H, 2, F] GLU kernel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable, Iterator

from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.interop.hf_config import ConversionError, hf_architecture
from bertjax.model import bert as bert_lib
from bertjax.model.config import BertConfig
from bertjax.runtime import fs

Params = dict[str, Any]

# ------------------------------------------------------------------------------- tensor table

# An entry: our path (tuple of keys), the HF names it is made of, and the two layout maps.
Entry = tuple[
    tuple[str, ...],
    tuple[str, ...],
    Callable[..., np.ndarray],
    Callable[[np.ndarray], tuple[np.ndarray, ...]],
]


def same(x):
  return x


def dense_in(w):  # torch [out, in] -> flax [in, out]
  return np.ascontiguousarray(w.T)


def dense_out(k):
  return (np.ascontiguousarray(k.T),)


def one(fn):
  return lambda x: (fn(x),)


# The names of BERT's and RoBERTa's tensors (the same encoder under another prefix; RoBERTa's MLM
# head is `lm_head`, and it has no NSP head).
NAMES = {
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


def bert_entries(cfg: BertConfig, family: str = "bert") -> Iterator[Entry]:
  """`BertForPreTraining`'s tensors, or `RobertaForMaskedLM`'s (family "roberta")."""
  n, d, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size
  names = NAMES[family]
  enc = names["encoder"]

  def ln(ours, theirs):
    yield ours + ("scale",), (theirs + ".weight",), same, one(same)
    yield ours + ("bias",), (theirs + ".bias",), same, one(same)

  def dense(ours, theirs):
    yield ours + ("kernel",), (theirs + ".weight",), dense_in, dense_out
    yield ours + ("bias",), (theirs + ".bias",), same, one(same)

  emb = ("bert", "embeddings")
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    yield emb + (name, "embedding"), (f"{enc}.embeddings.{name}.weight",), same, one(same)
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
        same,
        one(same),
    )
    yield from ln(ours + ("attention_layer_norm",), f"{hf}.attention.output.LayerNorm")
    yield from dense(ours + ("intermediate",), f"{hf}.intermediate.dense")
    yield from dense(ours + ("output",), f"{hf}.output.dense")
    yield from ln(ours + ("output_layer_norm",), f"{hf}.output.LayerNorm")
  yield from dense(("bert", "pooler"), f"{enc}.pooler.dense")
  yield from dense(("mlm_transform",), names["mlm_dense"])
  yield from ln(("mlm_layer_norm",), names["mlm_norm"])
  yield ("mlm_bias",), (names["mlm_bias"],), same, one(same)
  if names["nsp"]:
    yield from dense(("nsp",), names["nsp"])


def modernbert_entries(cfg: BertConfig) -> Iterator[Entry]:
  """`ModernBertForMaskedLM`'s tensors. Layer 0 has no attention norm, in either network."""
  n, d, h, f = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
  bias = cfg.use_bias

  def norm(ours, theirs):
    yield ours + ("scale",), (theirs + ".weight",), same, one(same)
    if bias:
      yield ours + ("bias",), (theirs + ".bias",), same, one(same)

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
      yield ours + ("bias",), (theirs + ".bias",), lambda b: b.reshape(bias_shape), one(np.ravel)

  emb = ("bert", "embeddings")
  yield emb + ("word_embeddings", "embedding"), (
      "model.embeddings.tok_embeddings.weight",
  ), same, one(same)
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
  yield ("mlm_bias",), ("decoder.bias",), same, one(same)


def entries(cfg: BertConfig) -> Iterator[Entry]:
  arch = hf_architecture(cfg)
  return modernbert_entries(cfg) if arch == "modernbert" else bert_entries(cfg, arch)


def fresh_heads(cfg: BertConfig) -> Params:
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
      "mlm_layer_norm": {"scale": np.ones(h, np.float32)}
      | ({"bias": np.zeros(h, np.float32)} if cfg.use_bias else {}),
      "mlm_bias": np.zeros(cfg.vocab_size, np.float32),
  }


def optional_heads(family: str) -> tuple:
  """A BERT or RoBERTa checkpoint's optional heads: what each is called, the prefix of its
  tensors (None: the family never has it), and the parameters it fills."""
  names = NAMES[family]
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


def trained_only(state: dict, cfg: BertConfig, cls: str, untrained) -> dict:
  """`params_to_hf`'s tensors as `cls` names them, without an untrained head's."""
  arch, u = hf_architecture(cfg), set(untrained)
  if arch == "modernbert":
    enc, mlm, nsp = "model.", ("head.", "decoder."), ()
  else:
    names = NAMES[arch]
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
  return {n for _, names, _, _ in entries(cfg) for n in names}


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


def rename(state: Mapping, fn: Callable[[str], str]) -> Mapping:
  """`state` with every name passed through `fn`, without reading a lazy state's tensors."""
  if isinstance(state, LazyTensors):
    return state.renamed(fn)
  return {fn(k): v for k, v in state.items()}


def legacy_name(k: str) -> str:
  """Old checkpoints name LayerNorm parameters gamma/beta."""
  if ".LayerNorm." in k:
    return k.replace(".gamma", ".weight").replace(".beta", ".bias")
  return k


def legacy_names(state: Mapping) -> Mapping:
  return rename(state, legacy_name)


def normalised(state: Mapping, arch: str) -> Mapping:
  """A BERT or RoBERTa state under the names `bert_entries` reads: old LayerNorm names, and a bare
  encoder's (`BertModel`, `RobertaModel`) tensors under the family's prefix."""
  if arch == "modernbert":
    if "model.embeddings.tok_embeddings.weight" in state:
      return state
    # a bare ModernBertModel (a sentence-transformers model's body) saves no "model." prefix
    return rename(state, lambda k: "model." + k if not k.startswith(("head.", "decoder.")) else k)
  state = legacy_names(state)
  enc = NAMES[arch]["encoder"]
  if f"{enc}.embeddings.word_embeddings.weight" not in state and any(
      k.startswith("embeddings.") for k in state
  ):  # a bare encoder (BertModel, RobertaModel) saves its tensors without the prefix
    state = rename(state, lambda k: f"{enc}." + k if not k.startswith(("cls.", "lm_head.")) else k)
  return state


def absent_heads(state: Mapping, arch: str) -> list[tuple[str, tuple]]:
  """(name, parameter paths) of each optional head a normalised BERT/RoBERTa state lacks."""
  decoder_name = NAMES[arch]["decoder"] + ".weight"
  return [
      (what, paths)
      for what, prefix, paths in optional_heads(arch)
      if prefix is None or not any(k.startswith(prefix) and k != decoder_name for k in state)
  ]


def missing_heads(names, cfg: BertConfig) -> list[str]:
  """The heads ("the MLM head", ...) a checkpoint whose tensors are `names` lacks, which
  `hf_to_params` starts fresh; reads no tensor."""
  arch = hf_architecture(cfg)
  if arch == "modernbert":
    bare = bool(names) and "head.dense.weight" not in names  # a ModernBertModel's names
    return (["the MLM head"] if bare else []) + ["the pooler", "the NSP head"]
  return [what for what, _ in absent_heads(normalised(dict.fromkeys(names), arch), arch)]


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
