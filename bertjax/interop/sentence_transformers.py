"""sentence-transformers model directories, read (`read_head`) and written (`save`).

A sentence-transformers directory is a list of modules (`modules.json`), each in its own
folder: the Transformer (a Hugging Face model directory, usually the root itself), then
`1_Pooling` (how token states become one vector), optionally `2_Dense` (a linear layer and an
activation) and `Normalize` (unit length). Beside them, `sentence_bert_config.json` declares
the Transformer's `max_seq_length` and `do_lower_case`, and
`config_sentence_transformers.json` the model's `prompts`, `default_prompt_name` and
`similarity_fn_name`.

The Transformer's weights are read by `convert.load_hf` (BERT, RoBERTa/XLM-R, ModernBERT, as
any Hugging Face directory); this module reads what comes after it, as a `SentenceHead` that
`bertjax.tasks.embed` applies. `save` writes a bertjax encoder as such a directory: the
encoder as a transformers `BertModel` (`RobertaModel`, `ModernBertModel`: the body only, never
an untrained head), its tokenizer, a pooling module and a Normalize module.

Both pooling config formats are read: sentence-transformers 6's (`pooling_mode`, one name or
a list) and the older boolean keys (`pooling_mode_mean_tokens`, ...), which every release reads.
"""

from __future__ import annotations

import dataclasses
import json
import os


from etils import epath
import numpy as np

from bertjax import errors
from bertjax.interop import st_modules
from bertjax.interop.st_modules import is_directory, transformer_dir
from bertjax.runtime import fs

# bertjax's pooling names; sentence-transformers calls one of them mean_sqrt_len_tokens.
POOLINGS = ("cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
_FROM_ST = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "lasttoken",
}
_TO_ST = {ours: theirs for theirs, ours in _FROM_ST.items()}
# The boolean keys of the pooling configs every sentence-transformers release reads.
_LEGACY_KEYS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
# Similarities a search can rank by (sentence-transformers' default is cosine).
SIMILARITIES = ("cosine", "dot")
_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
}


@dataclasses.dataclass(frozen=True)
class Dense:
  """A `2_Dense` module: x @ kernel + bias, then the activation."""

  kernel: np.ndarray  # [in, out]
  bias: np.ndarray | None  # [out]
  activation: str  # tanh | identity


@dataclasses.dataclass(frozen=True)
class SentenceHead:
  """What a sentence-transformers directory declares beyond its Transformer's weights."""

  transformer_dir: str = ""  # the Transformer module's folder, relative ("" = the directory)
  pooling: str = "mean"  # one of POOLINGS
  include_prompt: bool = True  # False: a prompt's tokens are left out of the pooling
  dense: tuple[Dense, ...] = ()
  normalize: bool = False  # a Normalize module: unit-length embeddings
  max_seq_length: int | None = None  # tokens per text, [CLS] and [SEP] included
  do_lower_case: bool = False  # the text is lower-cased before it is tokenized
  prompts: dict[str, str] = dataclasses.field(default_factory=dict)
  default_prompt_name: str | None = None
  similarity: str = "cosine"


def _pooling(file: epath.Path) -> tuple[str, bool]:
  """(pooling, include_prompt) of a 1_Pooling/config.json, in either format."""
  cfg = st_modules.read_json(file)
  modes = cfg.get("pooling_mode")
  if modes is None:
    modes = [m for m, key in _LEGACY_KEYS.items() if cfg.get(key)] or ["mean"]
  modes = [modes] if isinstance(modes, str) else list(modes)
  if len(modes) != 1 or modes[0] not in _FROM_ST:
    raise errors.BadInputError(
        f"{file}: pooling {modes} — bertjax reads one pooling mode of "
        f"{', '.join(_FROM_ST)}, not a concatenation"
    )
  return _FROM_ST[modes[0]], bool(cfg.get("include_prompt", True))


def _dense(folder: epath.Path) -> Dense:
  from bertjax.interop import convert  # its safetensors/.bin reader

  cfg = st_modules.read_json(folder / "config.json")
  act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
  if act not in _ACTIVATIONS:
    raise errors.BadInputError(
        f"{folder / 'config.json'}: activation_function {act!r} is not read by bertjax — "
        f"supported: {', '.join(_ACTIVATIONS)}"
    )
  state = convert.read_hf_state(folder)
  if "linear.weight" not in state:
    raise errors.BadInputError(f"{folder}: no tensor 'linear.weight'")
  kernel = np.ascontiguousarray(np.asarray(state["linear.weight"], np.float32).T)
  bias = np.asarray(state["linear.bias"], np.float32) if "linear.bias" in state else None
  return Dense(kernel, bias, _ACTIVATIONS[act])


def read_head(path: fs.PathLike) -> SentenceHead:
  """The `SentenceHead` of the sentence-transformers directory at `path`."""
  path = fs.path(path)
  modules = st_modules.modules(path)
  transformer = modules[0][1]
  pooling, include_prompt, dense, normalize = "mean", True, [], False
  for kind, folder in modules[1:]:
    if kind == "Pooling":
      pooling, include_prompt = _pooling(path / folder / "config.json")
    elif kind == "Dense":
      dense.append(_dense(path / folder))
    elif kind == "Normalize":
      normalize = True
  tdir = path / transformer if transformer else path
  bert_cfg = (
      st_modules.read_json(tdir / "sentence_bert_config.json")
      if (tdir / "sentence_bert_config.json").is_file()
      else {}
  )
  max_len = bert_cfg.get("max_seq_length")
  if max_len is None and (tdir / "tokenizer_config.json").is_file():
    declared = st_modules.read_json(tdir / "tokenizer_config.json").get("model_max_length")
    # transformers writes a huge number (1e30) for "no limit"
    max_len = int(declared) if isinstance(declared, (int, float)) and declared < 1e6 else None
  st_cfg = (
      st_modules.read_json(path / "config_sentence_transformers.json")
      if (path / "config_sentence_transformers.json").is_file()
      else {}
  )
  similarity = st_cfg.get("similarity_fn_name") or "cosine"
  if similarity not in SIMILARITIES:
    raise errors.BadInputError(
        f"{path / 'config_sentence_transformers.json'}: similarity_fn_name {similarity!r} — "
        f"bertjax ranks by {' or '.join(SIMILARITIES)}"
    )
  prompts = st_cfg.get("prompts") or {}
  default = st_cfg.get("default_prompt_name")
  if default is not None and default not in prompts:
    raise errors.BadInputError(
        f"{path / 'config_sentence_transformers.json'}: default_prompt_name {default!r} is "
        f"not one of its prompts ({', '.join(prompts) or 'none'})"
    )
  return SentenceHead(
      transformer_dir=transformer,
      pooling=pooling,
      include_prompt=include_prompt,
      dense=tuple(dense),
      normalize=normalize,
      max_seq_length=int(max_len) if max_len else None,
      do_lower_case=bool(bert_cfg.get("do_lower_case", False)),
      prompts={str(k): str(v) for k, v in prompts.items()},
      default_prompt_name=default,
      similarity=similarity,
  )


def tokenizer_file(path: fs.PathLike) -> str | None:
  """The tokenizer sentence-transformers runs for the directory at `path`: its Transformer
  folder's tokenizer.json (the fast tokenizer it loads), else None."""
  if not is_directory(path):
    return None
  file = transformer_dir(path) / "tokenizer.json"
  return str(file) if file.is_file() else None


# ------------------------------------------------------------------------------------ writing

_MODULE_TYPES = {  # the names every sentence-transformers release since 2.0 imports
    "Transformer": "sentence_transformers.models.Transformer",
    "Pooling": "sentence_transformers.models.Pooling",
    "Dense": "sentence_transformers.models.Dense",
    "Normalize": "sentence_transformers.models.Normalize",
}
_BODY = {  # per hf_architecture: the body's class, and the prefix its tensors drop
    "bert": ("BertModel", "bert."),
    "roberta": ("RobertaModel", "roberta."),
    "modernbert": ("ModernBertModel", "model."),
}


def body_state(params, cfg) -> tuple[dict[str, np.ndarray], str]:
  """(the tensors of the encoder alone as transformers' bare model names them, its class):
  `BertModel`/`RobertaModel` (with the pooler, which they hold, though pooling never reads it)
  or `ModernBertModel`; never an MLM or NSP head."""
  from bertjax.interop import convert

  arch = convert.hf_architecture(cfg)
  cls, prefix = _BODY[arch]
  # RobertaModel holds a pooler, which RobertaForMaskedLM's tensors leave out unless asked
  tensors = convert.params_to_hf(params, cfg, pooler=arch == "roberta")
  state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
  return state, cls


def _write_json(path: epath.Path, value) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(value, indent=2) + "\n")


def _save_tensors(state: dict[str, np.ndarray], file: epath.Path) -> None:
  from safetensors.numpy import save_file  # the `interop` extra

  file.parent.mkdir(parents=True, exist_ok=True)
  save_file(
      {k: np.ascontiguousarray(v) for k, v in state.items()},
      os.fspath(file),
      metadata={"format": "pt"},
  )


def save(out: epath.Path, cfg, params, head: SentenceHead) -> list[str]:
  """Writes the encoder of `params` and `head` (pooling, Dense, Normalize, length, prompts,
  similarity) as a sentence-transformers directory at `out` (local); the tokenizer is the
  caller's to add. Returns the names written."""
  from bertjax.interop import convert

  if head.pooling not in POOLINGS:
    raise errors.BadInputError(f"pooling {head.pooling!r}; valid: {', '.join(POOLINGS)}")
  state, cls = body_state(params, cfg)
  _save_tensors(state, out / "model.safetensors")
  arch = convert.hf_architecture(cfg)
  to_hf = {"modernbert": convert.config_to_modernbert, "roberta": convert.config_to_roberta}
  hf_cfg = dict(to_hf.get(arch, convert.config_to_hf)(cfg), architectures=[cls])
  _write_json(out / "config.json", hf_cfg)
  max_len = head.max_seq_length or cfg.max_seq_len
  _write_json(
      out / "sentence_bert_config.json",
      {"max_seq_length": max_len, "do_lower_case": head.do_lower_case},
  )
  modules = [("Transformer", "")]
  pooling = {"word_embedding_dimension": cfg.hidden_size}
  pooling.update({key: _FROM_ST[m] == head.pooling for m, key in _LEGACY_KEYS.items()})
  pooling["include_prompt"] = head.include_prompt
  _write_json(out / "1_Pooling" / "config.json", pooling)
  modules.append(("Pooling", "1_Pooling"))
  dim = cfg.hidden_size
  for d in head.dense:
    folder = f"{len(modules)}_Dense"
    tensors = {"linear.weight": np.ascontiguousarray(d.kernel.T)}
    if d.bias is not None:
      tensors["linear.bias"] = d.bias
    _save_tensors(tensors, out / folder / "model.safetensors")
    activation = {v: k for k, v in _ACTIVATIONS.items()}[d.activation]
    _write_json(
        out / folder / "config.json",
        {
            "in_features": dim,
            "out_features": d.kernel.shape[1],
            "bias": d.bias is not None,
            "activation_function": activation,
        },
    )
    modules.append(("Dense", folder))
    dim = d.kernel.shape[1]
  if head.normalize:
    modules.append(("Normalize", f"{len(modules)}_Normalize"))
    (out / modules[-1][1]).mkdir(parents=True, exist_ok=True)
  _write_json(
      out / "modules.json",
      [
          {"idx": i, "name": str(i), "path": path, "type": _MODULE_TYPES[kind]}
          for i, (kind, path) in enumerate(modules)
      ],
  )
  _write_json(
      out / "config_sentence_transformers.json",
      {
          "prompts": head.prompts,
          "default_prompt_name": head.default_prompt_name,
          "similarity_fn_name": head.similarity,
      },
  )
  return ["model.safetensors", "config.json", "modules.json"] + [p for _, p in modules[1:]]


def trained_head(trained: dict) -> SentenceHead:
  """The head of a bertjax contrastive run (`trained`: its `pretrained.embedding`): the
  pooling and normalisation it trained with and its data's prompts; no default prompt, so a
  text is prompted only when asked (`prompt_name="query"`), as it was in training."""
  return SentenceHead(
      pooling=trained.get("pooling", "mean"),
      normalize=bool(trained.get("normalize", False)),
      prompts={str(k): str(v) for k, v in (trained.get("prompts") or {}).items()},
  )


def export_head(src: str, pooling: str | None, trained: dict | None = None) -> SentenceHead:
  """The head `convert --to sentence-transformers` writes: a sentence-transformers SRC's own
  (`pooling` overriding its pooling); else a contrastive run's (`trained`: its
  `pretrained.embedding`: pooling, normalisation, prompts), `pooling` overriding; else
  `pooling` (default mean) and nothing more."""
  if is_directory(src):
    head = read_head(src)
    return dataclasses.replace(head, pooling=pooling or head.pooling)
  if trained:
    head = trained_head(trained)
    return dataclasses.replace(head, pooling=pooling or head.pooling)
  return SentenceHead(pooling=pooling or "mean")
