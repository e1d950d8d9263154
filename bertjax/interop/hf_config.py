"""transformers' config.json <-> `BertConfig`: BERT's (`model_type` "bert") and ModernBERT's
("modernbert"), and which of the two a config is (`hf_architecture`). The weights that go with
them are `convert.py`'s.
"""

from __future__ import annotations

from typing import Any

from bertjax import errors
from bertjax.model.config import BertConfig

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
  """'bert' (transformers' `BertForPreTraining`), 'roberta' (`RobertaForMaskedLM`: BERT's
  network with its position table offset by 2) or 'modernbert' (`ModernBertForMaskedLM`).

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
  if arch == "bert" and cfg.position_offset:
    return "roberta"
  return arch


# ------------------------------------------------------------------------- RoBERTa's configs

ROBERTA_TYPES = ("roberta", "xlm-roberta")  # XLM-R: RoBERTa's network, another vocabulary


def config_from_roberta(hf: dict[str, Any], source: str, **overrides) -> BertConfig:
  """A `BertConfig` from RoBERTa's or XLM-R's config.json: BERT's network whose positions
  start at row padding_idx + 1 (2) of a 514-row table, with one token type."""
  pad = hf.get("pad_token_id", 1)
  if not isinstance(pad, int) or pad < 0:
    raise ConversionError(f"{source}: pad_token_id={pad!r}; RoBERTa's is an integer (1)")
  cfg = config_from_hf(hf, layer_norm_eps=hf.get("layer_norm_eps", 1e-5))
  fields = dict(position_offset=pad + 1, type_vocab_size=hf.get("type_vocab_size", 1))
  fields.update(overrides)
  return cfg.replace(**fields)


def config_to_roberta(cfg: BertConfig) -> dict[str, Any]:
  """The config.json dict that `transformers.RobertaConfig` reads (RobertaForMaskedLM)."""
  out = config_to_hf(cfg)
  out.update(
      architectures=["RobertaForMaskedLM"],
      model_type="roberta",
      pad_token_id=cfg.position_offset - 1,
      bos_token_id=0,
      eos_token_id=2,
  )
  return out


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
