"""`BertConfig`: the shape and numerics of a BERT network, and the presets of the paper and of
Turc et al. 2019's small BERTs (tiny ... large)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import ops

Array = jax.Array
Dtype = Any

# name -> (num_layers, hidden_size, num_heads); intermediate is 4 * hidden as in BERT.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": ops.gelu_erf,  # exact erf GELU, as BERT
    "gelu_new": functools.partial(nn.gelu, approximate=True),  # tanh approximation
    "relu": nn.relu,
}

# The block's string switches and their valid values (the first is BERT's).
_CHOICES: dict[str, tuple[str, ...]] = {
    "norm_placement": ("post", "pre"),
    "mlp_type": ("dense", "glu"),
    "position_embedding": ("learned", "rope"),
}

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


# Fields that older bert_config.json files and checkpoints carry and that no longer mean anything:
# `attention_batch_chunks` (the attention hook, `ops.attention`, picks its batch slicing by
# backend now).
_RETIRED = ("attention_batch_chunks",)


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture and numerics of one BERT model. Defaults are BERT-base."""

  vocab_size: int = 30522  # WordPiece vocabulary of the released English models
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072  # 4 * hidden_size
  max_position_embeddings: int = 512  # learned absolute positions
  # Rows of the position table before position 0 (RoBERTa, XLM-R: 2, i.e. padding_idx + 1;
  # their tables have 514 rows for 512 tokens). Position p reads row p + position_offset.
  position_offset: int = 0
  type_vocab_size: int = 2  # segment A / segment B; 1: one row every token reads (RoBERTa);
  #                           0: no token-type table (ModernBERT), token
  #                           types passed in are ignored
  hidden_act: str = "gelu"  # exact erf GELU; see ACTIVATIONS for the alternatives
  hidden_dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1  # > 0 in training: XLA attention on every backend
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02  # std of the normal, truncated at ±2 std, as BERT
  dtype: str = "float32"  # compute dtype: "bfloat16" for mixed precision
  param_dtype: str = "float32"  # parameters (and optimizer state) stay in float32
  remat: str = "none"  # "none" | "full" | "dots" (save matmul outputs): activation memory vs FLOPs
  scan_layers: bool = False  # stack layers under nn.scan: one compiled layer, fast compile
  # The block's switches; the defaults are BERT's, the alternatives ModernBERT's (Warner et al.
  # 2024, answerdotai/ModernBERT-base config.json).
  norm_placement: str = "post"  # "post": BERT's post-LN; "pre": pre-LN, final norm after the
  #                               last layer, layer 0's attention norm the identity (ModernBERT)
  mlp_type: str = "dense"  # "dense": act(x W1) W2 as BERT; "glu": act(x W_in) * (x W_gate), then
  #                          W_out (hidden_act "gelu" makes it GeGLU, ModernBERT)
  position_embedding: str = "learned"  # "learned": BERT's absolute table; "rope": rotary
  rope_theta: float = 10000.0  # RoPE base of global-attention layers (ModernBERT: 160000)
  local_rope_theta: float = 10000.0  # RoPE base of local-attention layers (ModernBERT: 10000)
  use_bias: bool = True  # biases of dense layers and LayerNorms (ModernBERT: False); the MLM
  #                        decoder's output bias stays either way
  local_attention: int = 0  # 0: every layer global; > 0: window in tokens of the local layers,
  #                           key j visible to query i when |i - j| <= window // 2 (ModernBERT: 128)
  global_every: int = 1  # layer i attends globally when i % global_every == 0 (ModernBERT: 3)
  # ELECTRA's factorised embeddings (Clark et al. 2020): the token, position and segment tables
  # and their LayerNorm at this width, projected to hidden_size by `embeddings_project`.
  embedding_size: int = 0  # 0: hidden_size, no projection (BERT, ModernBERT)

  @property
  def max_seq_len(self) -> int:
    """The longest sequence the learned position table serves."""
    return self.max_position_embeddings - self.position_offset

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(
          f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
          f"num_heads={self.num_heads}"
      )
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"BertConfig: hidden_act={self.hidden_act!r}; valid: {sorted(ACTIVATIONS)}")
    for field in ("dtype", "param_dtype"):
      if getattr(self, field) not in _DTYPES:
        raise ValueError(f"BertConfig: {field}={getattr(self, field)!r}; valid: {sorted(_DTYPES)}")
    if self.remat not in ("none", "full", "dots"):
      raise ValueError(f"BertConfig: remat={self.remat!r}; valid: 'none', 'full', 'dots'")
    for field, valid in _CHOICES.items():
      if getattr(self, field) not in valid:
        raise ValueError(
            f"BertConfig: {field}={getattr(self, field)!r}; valid: {', '.join(map(repr, valid))}"
        )
    for field in ("rope_theta", "local_rope_theta"):
      if not getattr(self, field) > 0:
        raise ValueError(f"BertConfig: {field}={getattr(self, field)!r}; valid: a number > 0")
    if self.local_attention < 0:
      raise ValueError(
          f"BertConfig: local_attention={self.local_attention}; valid: 0 (global) or a window > 0"
      )
    if self.global_every < 1:
      raise ValueError(f"BertConfig: global_every={self.global_every}; valid: an integer >= 1")
    if not 0 <= self.position_offset < self.max_position_embeddings:
      raise ValueError(
          f"BertConfig: position_offset={self.position_offset}; valid: 0 <= offset < "
          f"max_position_embeddings={self.max_position_embeddings}"
      )
    # A window for the local layers and a period of the global ones come together: one without
    # the other changes nothing, which is never what was meant.
    window, every = self.local_attention, self.global_every
    if window % 2:
      raise ValueError(
          f"BertConfig: local_attention={window}: must be even (query i sees keys within "
          f"+-window/2) — use {window + 1} or {window - 1} (ModernBERT: 128)"
      )
    if window and every == 1:
      raise ValueError(
          f"BertConfig: local_attention={window} with global_every=1: every layer is global, so "
          "no layer uses the window — set global_every=3 (ModernBERT's) or local_attention=0"
      )
    if every > 1 and not window:
      raise ValueError(
          f"BertConfig: global_every={every} with local_attention=0: the layers between global "
          "ones have no window — set local_attention=128 (ModernBERT's) or global_every=1"
      )
    if self.embedding_size < 0:
      raise ValueError(
          f"BertConfig: embedding_size={self.embedding_size}; valid: 0 (hidden_size) or more"
      )
    if self.type_vocab_size < 0:
      raise ValueError(
          f"BertConfig: type_vocab_size={self.type_vocab_size}; valid: 0 (none) or more"
      )
    if self.scan_layers and self.heterogeneous_layers:
      raise ValueError(
          f"BertConfig: scan_layers=True stacks identical layers, but {self.heterogeneous_layers} "
          "makes them differ; set scan_layers=False"
      )
    if self.position_embedding == "rope" and self.head_dim % 2:
      raise ValueError(
          f"BertConfig: position_embedding='rope' needs an even head size; hidden_size="
          f"{self.hidden_size} / num_heads={self.num_heads} = {self.head_dim}"
      )

  @property
  def heterogeneous_layers(self) -> str:
    """Which setting makes the layers differ from one another ("" when none does)."""
    if self.norm_placement == "pre":
      return "norm_placement='pre' (layer 0 has no attention norm)"
    if self.local_attention and self.global_every > 1:
      return (
          f"local_attention={self.local_attention} with global_every={self.global_every} "
          "(local and global layers)"
      )
    return ""

  @property
  def embedding_width(self) -> int:
    """The width of the embedding tables: `embedding_size`, or `hidden_size` when 0."""
    return self.embedding_size or self.hidden_size

  @property
  def factorised_embeddings(self) -> bool:
    """Whether the embeddings are projected to the hidden size (ELECTRA-Small's 128 -> 256)."""
    return self.embedding_width != self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> Dtype:
    return _DTYPES[self.dtype]

  @property
  def params_dtype(self) -> Dtype:
    return _DTYPES[self.param_dtype]

  def replace(self, **changes) -> "BertConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "BertConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in d.items() if k not in _RETIRED}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"BertConfig: unknown fields {unknown}; valid: {sorted(known)}")
    return cls(**d)

  @classmethod
  def from_preset(cls, name: str, **overrides) -> "BertConfig":
    if name not in PRESETS:
      raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    layers, hidden, heads = PRESETS[name]
    base = dict(
        num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden
    )
    base.update(overrides)
    return cls(**base)


def from_preset(name: str, **overrides) -> BertConfig:
  """`BertConfig.from_preset`: e.g. ``from_preset("tiny", vocab_size=8000)``."""
  return BertConfig.from_preset(name, **overrides)
