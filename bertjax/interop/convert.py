"""Weight conversion between Hugging Face models and bertjax parameter trees: transformers'
`BertForPreTraining` for BERT-shaped configs, `RobertaForMaskedLM` for RoBERTa-shaped ones (BERT's
network, positions offset by 2; XLM-R's directories read the same), `ModernBertForMaskedLM` for
ModernBERT-shaped ones (`hf_architecture` says which a config is; a mix is refused).

The tensor table (`hf_tensors`: one per architecture, every tensor named once) is read by
import (`hf_to_params`) and export (`params_to_hf`) both, so they cannot drift apart. Files are
never unpickled:
`model.safetensors` is read with safetensors; a legacy `pytorch_model.bin` only through
`torch.load(weights_only=True)`.

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
from typing import Any, Callable

from etils import epath
import flax.linen as nn
import jax
import numpy as np

from bertjax import model as model_lib
from bertjax.interop import st_modules
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

# The tensor table and the checkpoint reader (`hf_tensors`), under the names this module's
# callers have always used.
from bertjax.interop.hf_tensors import (  # noqa: F401
    HEADS,
    NAMES as _NAMES,
    LazyTensors,
    Params,
    absent_heads as _absent_heads,
    bert_entries as _hf_entries,
    entries as _entries,
    fresh_heads as _fresh_heads,
    head_ids,
    hf_class,
    hf_tensor_names,
    missing_heads,
    normalised as _normalised,
    read_hf_state,
    trained_only as _trained_only,
)


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
  if modern and "head.dense.weight" not in state:  # ModernBertModel: no MLM head
    absent.update((("mlm_transform",), ("mlm_layer_norm",), ("mlm_bias",)))
    if fresh is not None:
      fresh.append("the MLM head")
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
    absent |= {("bert", "pooler"), ("nsp",)}
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
  path = st_modules.transformer_dir(path)  # a sentence-transformers directory's Transformer
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
