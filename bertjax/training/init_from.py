"""Where `bertjax pretrain --init DIR` (`config.train.init_from`) starts from, and what it takes.

DIR may be
  - a bertjax run: a `pretrain` workdir, one of its `checkpoints/<step>` dirs, or a
    `save_pretrained` dir;
  - a transformers directory (config.json + model.safetensors or pytorch_model.bin):
    `BertForPreTraining`, `BertForMaskedLM`, `BertModel`, `RobertaForMaskedLM`,
    `XLMRobertaForMaskedLM`, `RobertaModel`, `ModernBertForMaskedLM`;
  - a Google BERT TensorFlow checkpoint directory (bert_config.json, bert_model.ckpt.*, vocab.txt);
local or `gs://`.

The network comes from the checkpoint: `adopt` sets the config's model fields to the
checkpoint's (the recipe's are overridden, and each change is said); a field the user set on
the command line that contradicts the checkpoint is a ConfigError. The tokenizer comes with it:
`tokenizer_file` is the one in DIR (vocab.txt, tokenizer.json, a SentencePiece model), which
`bertjax prepare --tokenizer DIR` prepares a corpus with, and `check_tokenizer` refuses data
prepared with another. Heads the checkpoint lacks start fresh and are named (`load`). The
optimizer state and the step counter start fresh; a rerun resumes the run, not DIR.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from bertjax import errors
from bertjax import model as model_lib
from bertjax.runtime import fs

# The config.model fields a checkpoint decides: its network. The recipe keeps the rest (dtype,
# param_dtype, remat, scan_layers), which change how it runs, not what it computes.
ADOPTED = (
    "vocab_size",
    "hidden_size",
    "embedding_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "position_offset",
    "type_vocab_size",
    "hidden_act",
    "layer_norm_eps",
    "initializer_range",
    "hidden_dropout_rate",
    "attention_dropout_rate",
    "norm_placement",
    "mlp_type",
    "position_embedding",
    "rope_theta",
    "local_rope_theta",
    "use_bias",
    "local_attention",
    "global_every",
)
# What a preset sets (the rest of a preset's network is BERT's defaults).
_PRESET_FIELDS = ("hidden_size", "num_layers", "num_heads", "intermediate_size")
# Tokenizer files a checkpoint directory may hold, in the order `wordpiece.load_tokenizer`
# (so `prepare --tokenizer DIR`) looks for them.
TOKENIZER_FILES = (
    "tokenizer.model",
    "vocab.txt",
    "tokenizer.json",
    "spiece.model",
    "sentencepiece.bpe.model",
)


@dataclasses.dataclass(frozen=True)
class Source:
  path: str
  kind: str  # "bertjax" | "transformers" | "google"
  what: str  # e.g. "transformers RobertaForMaskedLM"
  config: model_lib.BertConfig  # unscanned
  tokenizer: str | None  # the tokenizer file that comes with it, if any
  objective: str = "mlm"  # "electra": a bertjax ELECTRA run (a generator beside the encoder)


def _tokenizer_in(directory) -> str | None:
  for name in TOKENIZER_FILES:
    if (directory / name).is_file():
      return str(directory / name)
  return None


def describe(path: str) -> Source:
  """What DIR is and the network it holds (configs only; no weights read)."""
  from bertjax.interop import convert, google_ckpt
  from bertjax.training import pretrained

  d = fs.path(path)
  field = f"config.train.init_from={path}"
  if not d.exists():
    raise errors.InputNotFoundError(
        f"{field}: no such file or directory — name a `bertjax pretrain` workdir, a "
        "transformers directory or a Google BERT checkpoint directory"
    )
  hf_config = d / "config.json"
  if hf_config.is_file() and not (d / "pretrained.json").exists():
    try:
      raw = json.loads(hf_config.read_text())
    except json.JSONDecodeError as e:
      raise convert.ConversionError(f"{hf_config}:{e.lineno}: invalid JSON ({e.msg})") from e
    if isinstance(raw, dict) and "model_type" in raw:
      cfg, _ = _hf_config(d, raw)
      arch = (raw.get("architectures") or [raw["model_type"]])[0]
      return Source(path, "transformers", f"transformers {arch}", cfg, _tokenizer_in(d))
  if (d / google_ckpt.CONFIG_NAME).is_file():
    cfg = google_ckpt.read_config(d / google_ckpt.CONFIG_NAME)
    return Source(path, "google", "Google BERT checkpoint", cfg, _tokenizer_in(d))
  cfg = pretrained.read_config(path)
  tok = pretrained.read_tokenizer(path)
  objective = "electra" if pretrained.read_generator_config(path) is not None else "mlm"
  return Source(path, "bertjax", "bertjax run", cfg, tok, objective)


def _hf_config(d, raw: dict):
  from bertjax.interop import convert, hf_config

  model_type = raw.get("model_type")
  if model_type == "modernbert":
    return hf_config.config_from_modernbert(raw, str(d / "config.json")), model_type
  if model_type in hf_config.ROBERTA_TYPES:
    return hf_config.config_from_roberta(raw, str(d / "config.json")), model_type
  if model_type != "bert":
    raise convert.ConversionError(
        f"{d / 'config.json'}: model_type {model_type!r} — bertjax reads bert, roberta, "
        "xlm-roberta and modernbert directories"
    )
  return hf_config.config_from_hf(raw), model_type


def load(source: Source, place=None) -> tuple[dict, list[str]]:
  """The checkpoint's unscanned parameters and the heads that start fresh. `place(path, array)`
  (a transformers directory): each parameter placed as soon as it is read, so the checkpoint
  is never whole in host memory beside its placed copy; otherwise host numpy arrays."""
  from bertjax.interop import convert, google_ckpt
  from bertjax.training import pretrained

  fresh: list[str] = []
  if source.kind == "transformers":
    _, params = convert.load_hf(source.path, fresh=fresh, place=place)
  elif source.kind == "google":
    _, params = google_ckpt.load_google(source.path, fresh=fresh)
  else:
    loaded = pretrained.load_pretrained(source.path)
    params = loaded.params
    fresh = [f"the {_HEAD_NAMES[h]}" for h in loaded.untrained_heads if h in _HEAD_NAMES]
  return params, fresh


_HEAD_NAMES = {"mlm": "MLM head", "nsp": "NSP head", "pooler": "pooler"}


def head_ids(fresh: list[str]) -> list[str]:
  """`load`'s names of fresh heads ("the MLM head", ...) as head ids ("mlm", ...)."""
  from bertjax.interop import convert

  return convert.head_ids(fresh)


def untrained_heads(source: Source) -> tuple[str, ...]:
  """The heads (`convert.HEADS`) `source` holds untrained: absent from a transformers or Google
  checkpoint (they start fresh), or recorded so by a bertjax run. Reads names, not weights."""
  from bertjax.interop import convert, google_ckpt
  from bertjax.training import pretrained

  if source.objective != "mlm":
    return ()
  if source.kind == "bertjax":
    return pretrained.read_untrained_heads(source.path)
  if source.kind == "transformers":
    names = list(convert.read_hf_state(source.path).keys())
  else:
    import tensorflow as tf  # a Google checkpoint's variable names

    prefix = google_ckpt.find_checkpoint(source.path)
    names = [
        m[0]
        for m in map(
            google_ckpt.google_to_hf_name,
            tf.train.load_checkpoint(prefix).get_variable_to_shape_map(),
        )
        if m
    ]
  return tuple(convert.head_ids(convert.missing_heads(names, source.config)))


def adopt(config, source: Source, explicit: frozenset[str] = frozenset()) -> list[str]:
  """Sets config.model's network fields to the checkpoint's (config unlocked by the caller);
  returns a line per field the recipe had otherwise. `explicit`: config.model fields given on
  the command line, which must agree with the checkpoint."""
  m, lines = config.model, []
  preset = model_lib.BertConfig.from_preset(m.get("preset") or "base")
  for field in ADOPTED:
    theirs = getattr(source.config, field)
    ours = m.get(field)
    ours = getattr(preset, field) if ours is None else ours
    if "preset" in explicit and field in _PRESET_FIELDS and field not in explicit:
      if ours != theirs:
        raise errors.ConfigError(
            f"--config.model.preset={m.preset} has {field}={ours!r} but config.train.init_from="
            f"{source.path} has {field}={theirs!r} — drop the override (the network is the "
            "checkpoint's)"
        )
    if field in explicit and ours != theirs:
      raise errors.ConfigError(
          f"--config.model.{field}={ours!r} contradicts config.train.init_from="
          f"{source.path}, which has {field}={theirs!r} — drop the override (the network is "
          "the checkpoint's)"
      )
    if ours != theirs and field != "vocab_size":
      lines.append(f"{field} {ours!r} -> {theirs!r}")
    m[field] = theirs
  return lines


def tokenizer_digest(path: str) -> str:
  return hashlib.sha256(fs.path(path).read_bytes()).hexdigest()


def check_tokenizer(source: Source, meta: dict | None, data: str) -> None:
  """Data prepared with the checkpoint's own tokenizer (by the digest of the file); data of
  another tokenizer would feed the network ids it never learned."""
  if not source.tokenizer or not meta:
    return
  theirs = meta.get("tokenizer", {}).get("sha256")
  if theirs and theirs != tokenizer_digest(source.tokenizer):
    raise errors.ConfigError(
        f"{data} was prepared with another tokenizer than config.train.init_from="
        f"{source.path} ({fs.path(source.tokenizer).name}) — prepare the corpus with "
        f"`bertjax prepare --tokenizer {source.path} ...`"
    )


def fresh_heads_line(fresh: list[str]) -> str:
  return f"; {', '.join(fresh)} start(s) fresh" if fresh else ""


# ------------------------------------------------------------------ a run that starts from DIR


def head_warmup(config) -> tuple[int, tuple[str, ...]]:
  """(steps, heads): the heads this objective trains that start untrained from
  config.train.init_from (a `BertModel` has no MLM head), warmed alone for the first `steps`
  steps (config.train.head_warmup_steps; -1: 10% of train.steps); (0, ()) when none."""
  from bertjax.training import train

  path, steps = config.train.init_from, config.train.head_warmup_steps
  if not path or steps == 0:
    return 0, ()
  untrained = untrained_heads(describe(path))
  heads = tuple(h for h in train.trained_heads(config) if h in untrained)
  if not heads:
    return 0, ()
  return (max(1, config.train.steps // 10) if steps < 0 else steps), heads


def start(setup, state, path: str):
  """`state` (a `train.TrainState` of `setup`) with its freshly initialised params replaced by
  DIR's, and the names of the heads DIR lacked, which keep their fresh values."""
  import jax
  import numpy as np

  from bertjax.training import checkpoint

  source = describe(path)
  want = setup.objective.name
  encoder_only = want == "contrastive"  # any checkpoint's encoder; its heads are not used
  if want != source.objective and not encoder_only:
    raise errors.ConfigError(
        f"config.train.init_from={path}: an {source.objective} checkpoint, but "
        f"config.objective={want!r} — start from a checkpoint of the same objective, or set "
        f"config.objective={source.objective!r}"
    )
  checkpoint.check_compatible(
      dict(source.config.to_dict(), scan_layers=setup.bert_config.scan_layers),
      setup.bert_config,
      path,
  )
  place = None
  if (
      not setup.bert_config.scan_layers and not encoder_only
  ):  # each tensor onto its shards as soon as it is read
    where = {
        tuple(k.key for k in path): sharding
        for path, sharding in jax.tree_util.tree_leaves_with_path(setup.state_shardings.params)
    }
    place = lambda path, x: jax.device_put(x, where[path])
  params, fresh = load(source, place)
  if encoder_only:  # the encoder without BERT's pooler; the objective's own parameters kept
    encoder = {k: v for k, v in params["bert"].items() if k != "pooler"}
    params, fresh = dict(state.params, bert=encoder), []
  if setup.bert_config.scan_layers:
    params = model_lib.stack_layer_params(params, setup.bert_config.num_layers)
  host = lambda x: x if isinstance(x, jax.Array) else np.asarray(x)  # placed ones stay placed
  params = jax.device_put(jax.tree.map(host, params), setup.state_shardings.params)
  return state.replace(params=params), fresh
