"""Read and write the original google-research/bert TensorFlow checkpoints.

A released model directory holds `bert_config.json`, `vocab.txt` and a V2 checkpoint bundle
`bert_model.ckpt.{index,data-00000-of-00001}` whose variables are named like

    bert/embeddings/word_embeddings                       [V, H]
    bert/embeddings/LayerNorm/gamma, .../beta             [H]
    bert/encoder/layer_0/attention/self/query/kernel      [H, H]  (in, out: Flax layout)
    bert/encoder/layer_0/attention/output/dense/kernel    [H, H]
    bert/pooler/dense/kernel                              [H, H]
    cls/predictions/transform/dense/kernel                [H, H]
    cls/predictions/output_bias                           [V]     (decoder tied to embeddings)
    cls/seq_relationship/output_weights                   [2, H]  (out, in: PyTorch layout)

Each Google name maps to exactly one Hugging Face `BertForPreTraining` name, so the tensors go
through `convert.hf_to_params` / `convert.params_to_hf`, and the QKV fusing and head layouts
live in one place (`convert.py`). Optimizer slots (`adam_m`, `adam_v`) and
`global_step` of fine-tuning checkpoints are skipped.

TensorFlow is imported only inside the functions that touch the bundle, which it reads and
writes on any scheme (gs://) itself; the JSON and vocab files go through `etils.epath`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from etils import epath
import numpy as np

from bertjax.interop import convert
from bertjax.model.config import BertConfig
from bertjax.runtime import fs

Params = dict[str, Any]

CKPT_NAME = "bert_model.ckpt"  # the prefix every released model uses
CONFIG_NAME = "bert_config.json"
VOCAB_NAME = "vocab.txt"

_SKIP = re.compile(r"(^global_step$)|(/adam_[mv]$)|(^bad_steps$)|(^loss_scale$)")


def google_to_hf_name(name: str) -> tuple[str, bool] | None:
  """The HF tensor name for Google variable `name`, and whether it needs a transpose.

  None for variables that are not model weights (optimizer slots, step counters).
  """
  if _SKIP.search(name):
    return None
  if name == "cls/predictions/output_bias":
    return "cls.predictions.bias", False
  if name == "cls/seq_relationship/output_weights":  # already [out, in]
    return "cls.seq_relationship.weight", False
  if name == "cls/seq_relationship/output_bias":
    return "cls.seq_relationship.bias", False
  parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in name.split("/")]
  if parts[:2] == ["bert", "embeddings"] and parts[-1].endswith("_embeddings"):
    return ".".join(parts) + ".weight", False
  leaf = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}.get(parts[-1])
  if leaf is None:
    return ".".join(parts), False  # unknown: reported as unused by the caller
  return ".".join(parts[:-1] + [leaf]), parts[-1] == "kernel"


def hf_to_google_name(name: str) -> tuple[str, bool]:
  """Inverse of `google_to_hf_name` for every tensor `convert.params_to_hf` produces."""
  if name == "cls.predictions.bias":
    return "cls/predictions/output_bias", False
  if name == "cls.seq_relationship.weight":
    return "cls/seq_relationship/output_weights", False
  if name == "cls.seq_relationship.bias":
    return "cls/seq_relationship/output_bias", False
  parts = name.replace(".layer.", ".layer_").split(".")
  if parts[:2] == ["bert", "embeddings"] and parts[-2].endswith("_embeddings"):
    return "/".join(parts[:-1]), False
  if parts[-2] == "LayerNorm":
    return "/".join(parts[:-1] + [{"weight": "gamma", "bias": "beta"}[parts[-1]]]), False
  if parts[-1] == "weight":
    return "/".join(parts[:-1] + ["kernel"]), True
  return "/".join(parts), False


# ------------------------------------------------------------------------------------- paths


def find_checkpoint(src: str | epath.Path) -> str:
  """The checkpoint prefix for a model directory, a prefix, or one of the bundle's files."""
  src = fs.path(src)
  for suffix in (".index", ".meta"):
    if src.name.endswith(suffix):
      return str(src)[: -len(suffix)]
  if src.name.startswith(CKPT_NAME + ".data-"):
    return str(src.parent / CKPT_NAME)
  if src.is_dir():
    if (src / (CKPT_NAME + ".index")).exists():
      return str(src / CKPT_NAME)
    indexes = sorted(src.glob("*.index"))
    if len(indexes) == 1:
      return str(indexes[0])[: -len(".index")]
    if len(indexes) > 1:
      raise convert.ConversionError(
          f"{src}: {len(indexes)} checkpoints ({', '.join(i.name for i in indexes[:3])}...); "
          "pass the prefix of one, e.g. DIR/model.ckpt-1000"
      )
    raise convert.ConversionError(f"{src}: no {CKPT_NAME}.index (not a Google BERT directory)")
  if fs.path(str(src) + ".index").exists():
    return str(src)
  raise convert.ConversionError(f"{src}: no such checkpoint ({src}.index not found)")


def read_config(path: str | epath.Path) -> BertConfig:
  """A `BertConfig` from `bert_config.json` (the same field names as HF's config.json)."""
  path = fs.path(path)
  if not path.is_file():
    raise convert.ConversionError(
        f"{path}: not found — a Google BERT checkpoint needs its bert_config.json (beside it, "
        "or named by config_path)"
    )
  try:
    raw = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise convert.ConversionError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from e
  if not isinstance(raw, dict):
    raise convert.ConversionError(f"{path}: a JSON object expected, found {type(raw).__name__}")
  for field in convert.REQUIRED_HF_FIELDS:
    if field not in raw:
      raise convert.ConversionError(f"{path}: field {field!r} is missing")
  return convert.config_from_hf(raw)


def write_config(cfg: BertConfig, path: str | epath.Path) -> None:
  hf = convert.config_to_hf(cfg)
  keys = (
      "attention_probs_dropout_prob",
      "hidden_act",
      "hidden_dropout_prob",
      "hidden_size",
      "initializer_range",
      "intermediate_size",
      "max_position_embeddings",
      "num_attention_heads",
      "num_hidden_layers",
      "type_vocab_size",
      "vocab_size",
  )
  fs.path(path).write_text(json.dumps({k: hf[k] for k in keys}, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------- tensors


def read_state(prefix: str) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
  """HF-named float32 tensors of a Google checkpoint, {HF name: Google name}, and the
  variables that were skipped (optimizer slots, step counters)."""
  import tensorflow as tf  # here: converting to/from HF/bertjax needs no TF

  try:
    reader = tf.train.load_checkpoint(prefix)
  except Exception as e:  # tf raises NotFoundError / DataLossError with long messages
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise convert.ConversionError(f"{prefix}: not a readable TF checkpoint ({first})") from None
  state, origin, skipped = {}, {}, []
  for name in sorted(reader.get_variable_to_shape_map()):
    mapped = google_to_hf_name(name)
    if mapped is None:
      skipped.append(name)
      continue
    hf_name, transpose = mapped
    value = np.asarray(reader.get_tensor(name), np.float32)
    state[hf_name] = np.ascontiguousarray(value.T) if transpose else value
    origin[hf_name] = name
  return state, origin, skipped


def load_google(
    src: str | epath.Path,
    config_path: str | epath.Path | None = None,
    fresh: list[str] | None = None,
) -> tuple[BertConfig, Params]:
  """Config and unscanned `BertForPreTraining` params from a Google BERT checkpoint.

  `src` is the model directory or the checkpoint prefix; `config_path` defaults to
  `bert_config.json` beside the checkpoint. Heads the checkpoint lacks (an export of an
  untrained head leaves it out) start fresh and are named in `fresh` (`convert.hf_to_params`).
  """
  prefix = find_checkpoint(src)
  config_path = fs.path(config_path) if config_path else fs.path(prefix).parent / CONFIG_NAME
  cfg = read_config(config_path)
  state, origin, _ = read_state(prefix)
  unused = sorted(set(state) - convert.hf_tensor_names(cfg))
  if unused:
    raise convert.ConversionError(
        f"{prefix}: variable {origin[unused[0]]!r} is not part of BERT "
        f"pretraining ({len(unused)} such); is this a fine-tuned or non-BERT checkpoint?"
    )
  try:
    return cfg, convert.hf_to_params(state, cfg, source=prefix, fresh=fresh)
  except convert.ConversionError as e:  # name the tensor as the user's checkpoint does
    msg = str(e)
    for hf_name in re.findall(r"'([\w.]+)'", msg):
      msg = msg.replace(repr(hf_name), repr(hf_to_google_name(hf_name)[0]))
    raise convert.ConversionError(msg) from None


def save_google(
    params: Params,
    cfg: BertConfig,
    path: str | epath.Path,
    vocab_path: str | epath.Path | None = None,
    untrained=(),
) -> str:
  """Write `bert_model.ckpt.*`, `bert_config.json` (and `vocab.txt`) under `path`.

  The bundle is what google-research/bert's `run_pretraining.py --init_checkpoint` reads; the
  heads in `untrained` (`convert.HEADS` that never trained) are left out of it, as TF's
  `init_from_checkpoint` leaves a variable the checkpoint lacks to its initializer.
  Returns the checkpoint prefix.
  """
  import tensorflow as tf  # here: converting to/from HF/bertjax needs no TF

  path = fs.path(path)
  path.mkdir(parents=True, exist_ok=True)
  state = convert.params_to_hf(params, cfg)
  state.pop("cls.predictions.decoder.weight")  # tied to the word embeddings, as in Google's
  state.pop("cls.predictions.decoder.bias")
  drop = {"mlm": "cls.predictions.", "nsp": "cls.seq_relationship.", "pooler": "bert.pooler."}
  drop = tuple(drop[h] for h in untrained if h in drop)
  state = {k: v for k, v in state.items() if not k.startswith(drop)} if drop else state
  names, tensors = [], []
  for hf_name in sorted(state):
    name, transpose = hf_to_google_name(hf_name)
    value = state[hf_name]
    names.append(name)
    tensors.append(tf.constant(np.ascontiguousarray(value.T) if transpose else value))
  prefix = str(path / CKPT_NAME)
  tf.raw_ops.SaveV2(
      prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
  )
  (path / "checkpoint").write_text(
      f'model_checkpoint_path: "{CKPT_NAME}"\n' f'all_model_checkpoint_paths: "{CKPT_NAME}"\n'
  )
  write_config(cfg, path / CONFIG_NAME)
  if vocab_path is not None:
    fs.path(vocab_path).copy(path / VOCAB_NAME, overwrite=True)
  return prefix
