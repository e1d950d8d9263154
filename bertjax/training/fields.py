"""Every field of a pretraining config, written once: its default, its rule and what it is.

`experiments/pretrain.py` builds its base config from `FIELDS` (`base_config`), each variant
then setting its own values with their sources; `config_checks` takes its ranges and choices
from the same entries (`RANGES`, `PHASE2_RANGES`, `CHOICES`). No jax here: `validate` runs
before jax loads. Rules between fields (the sequence length with the pair task, the masked
positions per row) are `config_checks.validate`'s; rules between model fields `BertConfig`'s.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections

from bertjax.data.masking import MaskSpec


@dataclasses.dataclass(frozen=True)
class Range:
  """The valid values of one numeric field."""

  kind: type  # int or float (an int is a valid float)
  low: float | None = None
  high: float | None = None
  low_open: bool = False  # `low` itself is out of range
  high_open: bool = False
  none_ok: bool = False  # None: filled in later (from the data, the preset, the device)
  minus_one_ok: bool = False  # -1: "the devices left" (mesh axes)
  why: str = ""  # the error message's hint

  def accepts(self, v) -> bool:
    if v is None:
      return self.none_ok
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      return False
    if self.kind is int and not isinstance(v, int):
      return False
    if self.minus_one_ok and v == -1:
      return True
    if not math.isfinite(v):
      return False
    if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
      return False
    return self.high is None or (v < self.high or (not self.high_open and v == self.high))

  def describe(self) -> str:
    kind = "an integer" if self.kind is int else "a finite number"
    if self.low is not None and self.high is not None:
      left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
      rule = f"in {left}{self.low:g}, {self.high:g}{right}"
    elif self.low is not None:
      rule = f"{'>' if self.low_open else '>='} {self.low:g}"
    else:
      rule = ""
    extra = " or -1" if self.minus_one_ok else ""
    return f"{kind} {rule}{extra}".strip() + (" or None" if self.none_ok else "")


def at_least(low: int, why: str = "", **kw) -> Range:
  return Range(int, low, why=why, **kw)


def _float(low=None, high=None, why="", **kw) -> Range:
  return Range(float, low, high, why=why, **kw)


_POSITIVE = dict(low=0.0, low_open=True)
_SHARE = dict(low=0.0, high=1.0)
_RATE = _float(0.0, 1.0, high_open=True, why="a dropout probability")
_MESH = at_least(1, "-1 fills the devices left", minus_one_ok=True)
_MODEL_SIZE = at_least(1, "None: the preset's", none_ok=True)
_PAIR_MODES = ("nsp", "sop", "none")


class _Marker:

  def __init__(self, name: str):
    self.name = name

  def __repr__(self) -> str:
    return self.name


RECIPE = _Marker("RECIPE")  # every variant sets it (experiments/pretrain.py, `_SCALES`)
PRESET = _Marker("PRESET")  # not in the base config: the model preset's, unless a recipe sets it


@dataclasses.dataclass(frozen=True)
class Field:
  path: str  # dotted: "train.batch_size"
  default: Any  # RECIPE, PRESET, or the value (None: a FieldReference of type `kind`)
  rule: Range | tuple[str, ...] | None  # the range, the choices, or none (strings, paths, bools)
  doc: str  # one line: units, why this value (the error messages give the rule's `why`)
  kind: type | None = None  # the type of a field whose default is None


F = Field
# In the order of the config (and of its config.json). Choices: written out, not imported from
# the modules that implement them (optim, objective_contrastive, model.config), which need jax.
# fmt: off
FIELDS: tuple[Field, ...] = (
    F("variant", RECIPE, None, "recorded in the workdir's config.json"),
    F("seed", 0, at_least(0, "parameter init, dropout and data order"),
      "parameter init, dropout and data order"),
    # mlm: BERT's masked LM (+ the pair task) | electra: replaced-token detection (Clark et al.
    # 2020), a generator beside the encoder (bertjax.model.electra, docs/training.md "ELECTRA")
    # | contrastive: the encoder as an embedding model on pairs (docs/training.md "Contrastive")
    # Its valid names: `objective.NAMES`, beside the branches of `objective.make` that build
    # them; config_checks adds the choice (this table cannot import `objective`, whose
    # `objective_contrastive` reads its defaults here)
    F("objective", "mlm", None, "the pretraining objective"),
    # read only with objective "electra"
    F("electra.generator_hidden_fraction", 0.25,
      _float(0.0, 1.0, low_open=True, why="generator width / the encoder's; ELECTRA: 0.25"),
      "generator width / the encoder's (paper: 1/4)"),
    F("electra.disc_weight", 50.0,
      _float(**_POSITIVE, why="λ on the discriminator loss; ELECTRA: 50"),
      "λ: loss = generator MLM + λ · discriminator BCE (paper: 50)"),
    # read only with objective "contrastive" (docs/training.md "Contrastive"; defaults:
    # sentence-transformers' MultipleNegativesRankingLoss on a mean-pooled encoder)
    F("contrastive.pooling", "mean", ("mean", "cls"),
      "mean over real tokens | cls: the [CLS] token's last state"),
    F("contrastive.normalize", True, None, "cosine scores (sentence-transformers' cos_sim)"),
    F("contrastive.scale", 20.0,
      _float(**_POSITIVE, why="scores x scale; sentence-transformers: 20"),
      "scores x scale (sentence-transformers: 20, temperature 0.05)"),
    F("contrastive.learn_scale", False, None,
      "learn log(scale) from `scale` (CLIP), clipped at 100"),
    F("contrastive.symmetric", False, None,
      "add the document->query term (averaged, as per_direction)"),
    F("contrastive.loss", "infonce", ("infonce", "sigmoid"),
      "infonce | sigmoid (SigLIP: a logistic term per pair)"),
    F("contrastive.sigmoid_bias", -10.0,
      _float(why="the sigmoid loss's learned bias at start; SigLIP: -10"),
      "SigLIP's learned bias starts at -10"),
    F("contrastive.matryoshka_dims", (), None, "e.g. (768, 256, 64): loss summed over prefixes"),
    F("contrastive.chunk_size", 0, at_least(0, "rows per GradCache chunk; 0: one pass"),
      "GradCache rows per chunk (batches larger than memory); 0: off"),
    # the pair data must hold this many (`prepare --kind pairs` records it); `bertjax compile`
    # and the FLOPs count read it
    F("contrastive.hard_negatives", 1,
      at_least(0, "hard negatives per row, as the pair data holds"),
      "hard negatives per row (the pair data's)"),
    F("model.preset", RECIPE, None, "tiny/mini/small/medium/base/large (bertjax.model.PRESETS)"),
    F("model.vocab_size", None,
      at_least(5, "the tokenizer's size; None: from the data", none_ok=True),
      "None: from the data", int),
    F("model.dtype", "float32", None, "compute; params stay float32 (paper recipes: bfloat16)"),
    F("model.hidden_dropout_rate", 0.1, _RATE, "BERT's dropout"),
    F("model.attention_dropout_rate", 0.1, _RATE, "BERT's attention dropout"),
    F("model.max_position_embeddings", 512, _MODEL_SIZE, "phase 2 runs at 512"),
    F("model.scan_layers", False, None, "one compiled layer: fast compiles (paper recipes: on)"),
    F("model.remat", "none", ("none", "dots", "full"),
      "dots/full trade FLOPs for activation memory"),
    # The block"s switches, BERT"s values here (BERT's choice first); `_modern` in
    # experiments/pretrain.py sets ModernBERT's (docs/training.md).
    F("model.type_vocab_size", 2, at_least(0, "0: no token-type table (ModernBERT)", none_ok=True),
      "segment A / segment B; 0: no token-type table"),
    F("model.norm_placement", "post", ("post", "pre"), "post: LayerNorm after each residual add"),
    F("model.mlp_type", "dense", ("dense", "glu"), "glu: act(x W_in) * (x W_gate), then W_out"),
    F("model.position_embedding", "learned", ("learned", "rope"), "learned: absolute table"),
    F("model.rope_theta", 10000.0,
      _float(**_POSITIVE, why="RoPE base of global layers; ModernBERT: 160000"),
      "RoPE base of the global layers (rope only)"),
    F("model.local_rope_theta", 10000.0,
      _float(**_POSITIVE, why="RoPE base of local layers; ModernBERT: 10000"),
      "RoPE base of the local layers (rope only)"),
    F("model.use_bias", True, None, "biases of the dense layers and LayerNorms"),
    F("model.local_attention", 0, at_least(0, "0: every layer global; ModernBERT: 128"),
      "0: every layer global | window (tokens) of the local layers"),
    F("model.global_every", 1, at_least(1, "1: every layer global; ModernBERT: 3"),
      "layer i is global when i % global_every == 0"),
    F("model.embedding_size", 0, at_least(0, "0: hidden_size; ELECTRA-Small: 128", none_ok=True),
      "0: hidden_size | ELECTRA's factorised embeddings, projected"),
    # Set by the recipes that change the preset's network (`_modern`, `_electra`)
    F("model.num_layers", PRESET, _MODEL_SIZE, "encoder layers"),
    F("model.hidden_size", PRESET, _MODEL_SIZE, "the residual stream's width"),
    F("model.num_heads", PRESET, _MODEL_SIZE, "attention heads"),
    F("model.intermediate_size", PRESET, _MODEL_SIZE, "the MLP's inner width"),
    F("model.layer_norm_eps", PRESET, _float(**_POSITIVE, none_ok=True), "LayerNorm's epsilon"),
    F("model.initializer_range", PRESET, _float(**_POSITIVE, none_ok=True), "init std"),
    F("data.source", "prepared", ("prepared", "synthetic"),
      "prepared (TFRecord shards) | synthetic (random tokens, no TF)"),
    F("data.path", None, None, "prepared TFRecord shards; None: the bundled corpus", str),
    F("data.tokenizer", None, None, "None: the prepared data's (data/tokenizer.model)", str),
    # Several prepared datasets mixed by weight instead of data.path (docs/data.md, "Mixtures"):
    # "NAME=PATH:WEIGHT[:PHASE2_WEIGHT],..."; a weight is the share of the real training tokens.
    F("data.sources", "", None, "empty: one dataset, config.data.path"),
    # checked in `validate`: at least 5 tokens with a pair task, else 3
    F("data.seq_len", 128, None, "tokens per example incl. [CLS]/[SEP]"),
    F("data.max_predictions_per_seq", 20, at_least(1, "masked positions per example"),
      "masked positions per example (0.15 * 128, rounded)"),
    F("data.pair_mode", "nsp", _PAIR_MODES, "nsp | sop | none (MLM only)"),
    # The masking rates are BERT's, written once, in `bertjax.data.masking.MaskSpec`
    F("data.mask_prob", MaskSpec.mask_prob,
      _float(0.0, 1.0, low_open=True, why="share of tokens masked; BERT: 0.15"),
      "share of tokens chosen for MLM (BERT: 15%)"),
    # Mask every piece of a word together; on data prepared with `--word-segmenter`, every token
    # of a segmenter's word (Chinese whole-word masking: docs/data.md)
    F("data.whole_word_mask", False, None, "whole words, not single pieces"),
    F("data.mask_token_prob", MaskSpec.mask_token_prob,
      _float(**_SHARE, why="of the chosen tokens: [MASK]; BERT: 0.8"),
      "of the chosen: [MASK] (BERT: 80%)"),
    F("data.random_token_prob", MaskSpec.random_token_prob,
      _float(**_SHARE, why="of the chosen tokens: a random token; BERT: 0.1"),
      "a random token (BERT: 10%); the rest kept"),
    F("data.prefetch", 2, at_least(1, "batches transferred ahead of the step"),
      "batches transferred ahead of the step"),
    F("data.packing", False, None, "several whole examples per row (docs/training.md, Packing)"),
    F("data.max_examples_per_row", 0,
      Range(int, 0, 64, why="examples a packed row may hold: NSP labels per row; "
            "0 (default): measured on the corpus"),
      "packed rows: at most this many examples (NSP labels) each; 0: measured on the corpus"),
    F("data.workers", None,
      at_least(1, "processes building examples; None: half the cores", none_ok=True),
      "processes that build the examples (docs/data.md, Worker processes)", int),
    F("train.batch_size", RECIPE, at_least(1, "global sequences per step"),
      "GLOBAL sequences per step, all hosts and devices together"),
    F("train.steps", RECIPE, at_least(1, "total optimizer steps"),
      "total optimizer steps, both phases"),
    F("train.learning_rate", RECIPE, _float(**_POSITIVE, why="the peak learning rate"),
      "peak, reached after warmup"),
    F("train.warmup_steps", RECIPE, at_least(0, "0 = no warmup"), "linear warmup from 0"),
    # bert_adamw (google-research/bert"s, no bias correction) | adamw (optax"s, bias-corrected)
    # | lamb (layer-wise) | stable_adamw (ModernBERT's). The small recipes keep adamw +
    # warmup_linear, the pair their figures in docs/training.md were measured with.
    F("train.optimizer", "adamw", ("bert_adamw", "adamw", "lamb", "stable_adamw"),
      "optax's AdamW, bias-corrected"),
    # bert: peak * (1 - step/steps) from step 0, warmup overriding | warmup_linear: warmup, then
    # linear from the peak to 0 | wsd: warmup-stable-decay | one_cycle: Cramming's triangle
    F("train.schedule", "warmup_linear", ("bert", "warmup_linear", "wsd", "one_cycle"),
      "warmup, then linear to 0"),
    F("train.b1", 0.9, _float(0.0, 1.0, high_open=True, why="Adam's beta1"), "Adam beta1, as BERT"),
    F("train.b2", 0.999, _float(0.0, 1.0, high_open=True, why="Adam's beta2"),
      "Adam beta2, as BERT"),
    F("train.eps", 1e-6, _float(**_POSITIVE, why="Adam's epsilon"), "Adam epsilon, as BERT"),
    F("train.weight_decay", 0.01, _float(0.0, why="0 = none"),
      "decoupled; not on LayerNorm or biases"),
    F("train.clip_norm", 1.0, _float(0.0, why="global gradient norm clip; 0 = none"),
      "global gradient norm clip, as BERT"),
    F("train.microbatches", 1, at_least(1, "1 = no gradient accumulation"),
      "gradient accumulation: the batch is split into this many"),
    F("train.decay_fraction", 0.1, _float(**_SHARE, why="wsd: share of the steps in the decay"),
      "wsd: share of the steps in the final 1-sqrt decay"),
    F("train.final_lr_fraction", 0.0, _float(**_SHARE, why="wsd: last lr / peak; 0 = to zero"),
      "wsd: the lr at the last step / the peak"),
    F("train.peak_fraction", 0.5, _float(**_SHARE, why="one_cycle: share of the steps rising"),
      "one_cycle: share of the steps rising to the peak (Cramming)"),
    # Batch-size warmup through the accumulation count (needs microbatches > 1): the first
    # batch_warmup_steps train on batch_warmup_start .. microbatches microbatches (0: off).
    F("train.batch_warmup_steps", 0, at_least(0, "batch-size warmup steps; 0 = none"),
      "batch-size warmup steps (0: off)"),
    F("train.batch_warmup_start", 1, at_least(1, "microbatches trained on at step 0"),
      "microbatches trained on at step 0"),
    F("train.max_bad_steps", 0, at_least(0, "0 = stop at the first non-finite step"),
      "non-finite steps to skip before stopping (0: stop at the first)"),
    F("train.init_from", None, None, "save_pretrained dir / workdir to continue from", str),
    F("train.inject_nan_at_step", -1, at_least(-1, "testing only; -1 = never"),
      "testing only: poison this step's loss to exercise the guard"),
    # Continued pretraining from a checkpoint without a head this objective trains (a BertModel:
    # no MLM head): that head trains alone for these first steps, then the whole network.
    F("train.head_warmup_steps", -1,
      at_least(-1, "-1 = 10% of the steps when a head starts untrained"),
      "-1: 10% of train.steps when a head starts untrained (0: off)"),
    # Second phase (BERT: last 10% of steps at seq 512); its fields other than `fraction` are
    # checked only when it runs.
    F("phase2.fraction", 0.0,
      _float(0.0, 1.0, high_open=True, why="share of config.train.steps in phase 2; 0 = one phase"),
      "share of train.steps run in phase 2; 0: one phase (paper recipes: 0.1)"),
    F("phase2.seq_len", 512, at_least(3, "phase-2 tokens per example"), "phase 2 sequence length"),
    F("phase2.max_predictions_per_seq", 80, at_least(1, "phase-2 masked positions"),
      "0.15 * 512, as BERT's phase-2 data"),
    F("phase2.batch_size", RECIPE, at_least(1, "global sequences per phase-2 step"),
      "GLOBAL batch in phase 2"),
    F("phase2.microbatches", 1, at_least(1, "1 = no gradient accumulation"),
      "gradient accumulation in phase 2"),
    F("phase2.restart_schedule", False, None, "True: own warmup/decay (LAMB); False: one schedule"),
    F("phase2.learning_rate", RECIPE, _float(**_POSITIVE, why="phase-2 peak (restart_schedule)"),
      "phase 2 peak (only with restart_schedule)"),
    F("phase2.warmup_steps", 0, at_least(0, "phase-2 warmup (restart_schedule)"),
      "phase 2 warmup (only with restart_schedule)"),
    # Context extension: phase 2"s own RoPE bases (None: config.model"s).
    F("phase2.rope_theta", None, _float(**_POSITIVE, none_ok=True, why="None: config.model's"),
      "phase 2's RoPE base of the global layers", float),
    F("phase2.local_rope_theta", None,
      _float(**_POSITIVE, none_ok=True, why="None: config.model's"),
      "phase 2's RoPE base of the local layers", float),
    # A restarted phase 2"s wsd shape (None: config.train"s).
    F("phase2.decay_fraction", None, _float(**_SHARE, none_ok=True, why="None: config.train's"),
      "a restarted phase 2's wsd decay share", float),
    F("mesh.data", -1, _MESH, "pure data parallelism within a slice; -1 fills the devices left"),
    F("mesh.fsdp", 1, _MESH, "FSDP (params + optimizer state split) within a slice"),
    F("mesh.tensor", 1, _MESH, "tensor (model) parallelism within a slice"),
    F("mesh.dcn_data", 1, at_least(1, "slices in data parallelism"),
      "data parallelism across slices / hosts over DCN"),
    F("mesh.dcn_fsdp", 1, at_least(1, "slices in FSDP"), "FSDP across slices (rarely worth it)"),
    F("mesh.dcn_tensor", 1, at_least(1, "slices in tensor parallelism"),
      "tensor parallelism across slices (never worth it)"),
    F("checkpoint.every_steps", 500,
      at_least(1, "to save rarely, use a value above config.train.steps: the last step is "
               "always saved"),
      "async save interval (paper recipes: 5000)"),
    F("checkpoint.max_to_keep", 3, at_least(1, "None = keep all", none_ok=True),
      "newest checkpoints kept"),
    F("checkpoint.keep_period", None,
      at_least(1, "also keep every N-th step; None = only the newest", none_ok=True),
      "also keep every N-th step forever", int),
    F("checkpoint.async_save", True, None, "write in the background while training continues"),
    F("eval.every_steps", 500, at_least(0, "0 = no held-out evaluation"),
      "held-out evaluation interval (paper recipes: 10,000)"),
    F("eval.steps", 10, at_least(0, "eval batches per evaluation; 0 = none"),
      "eval batches per evaluation (paper recipes: 100)"),
    # checked in `validate` when the run evaluates: at least 1
    F("eval.batch_size", RECIPE, None, "GLOBAL eval batch"),
    # Time to target (MLPerf's BERT metric): the first step and wall time at which held-out MLM
    # accuracy reaches this (None: not timed); stop_at_target ends the run there.
    F("eval.target_mlm_accuracy", None,
      _float(**_SHARE, none_ok=True, why="held-out MLM accuracy to time; None = not timed"),
      "held-out MLM accuracy to time (MLPerf's BERT metric)", float),
    F("eval.stop_at_target", False, None, "end the run when the target is reached"),
    # The held-out stream"s own data settings (None: config.data"s / config.seed). A sweep whose
    # runs train on different data sets them so that every run is scored on the same masked
    # examples: experiments/modern.py evaluates each rung at 15% masking on single unpacked
    # segments from seed 0, whatever its training masking, pair task, packing or seed.
    F("eval.mask_prob", None,
      _float(0.0, 1.0, low_open=True, none_ok=True, why="held-out masking; None: data's"),
      "share masked", float),
    F("eval.pair_mode", None, _PAIR_MODES, "nsp | sop | none", str),
    F("eval.packing", None, None, "several per row", bool),
    F("eval.seed", None,
      at_least(0, "held-out order and masks; None: the run's seed", none_ok=True),
      "held-out order, masks", int),
    F("eval.whole_word_mask", None, None, "None: config.data.whole_word_mask", bool),
    F("log_every_steps", 50, at_least(1, "progress line interval"),
      "progress line / metrics.jsonl interval (paper recipes: 100)"),
    F("tensorboard", True, None, "also write TensorBoard event files (needs TensorFlow)"),
    F("peak_flops_per_device", None, _float(**_POSITIVE, none_ok=True, why="None: from the device"),
      "MFU; None: from the device kind", float),
)
# fmt: on
del F
_PHASE2_ALWAYS = ("phase2.fraction",)  # the one phase-2 field read when there is no phase 2
RANGES: dict[str, Range] = {
    f.path: f.rule
    for f in FIELDS
    if isinstance(f.rule, Range)
    and not (f.path.startswith("phase2.") and f.path not in _PHASE2_ALWAYS)
}
# Checked only when the second phase runs (config.phase2.fraction > 0).
PHASE2_RANGES: dict[str, Range] = {
    f.path: f.rule for f in FIELDS if isinstance(f.rule, Range) and f.path not in RANGES
}
CHOICES: dict[str, tuple[str, ...]] = {f.path: f.rule for f in FIELDS if isinstance(f.rule, tuple)}
DEFAULTS: dict[str, Any] = {f.path: f.default for f in FIELDS if f.default not in (RECIPE, PRESET)}
# choices that may be None (meaning: as another field)
CHOICES_NONE_OK = tuple(f.path for f in FIELDS if f.path in CHOICES and f.default is None)


def base_config(recipe: dict[str, Any]) -> ml_collections.ConfigDict:
  """Every field at its default, those marked RECIPE from `recipe` (dotted path -> value)."""
  wanted = {f.path for f in FIELDS if f.default is RECIPE}
  if set(recipe) != wanted:
    raise ValueError(
        f"fields.base_config: the recipe gives {sorted(set(recipe) - wanted)}, lacks "
        f"{sorted(wanted - set(recipe))}: it sets exactly the RECIPE fields"
    )
  c = ml_collections.ConfigDict()
  for f in FIELDS:
    if f.default is PRESET:
      continue
    *sections, key = f.path.split(".")
    node = c
    for name in sections:
      if name not in node:
        node[name] = ml_collections.ConfigDict()
      node = node[name]
    value = recipe[f.path] if f.default is RECIPE else f.default
    node[key] = ml_collections.FieldReference(None, field_type=f.kind) if value is None else value
  return c
