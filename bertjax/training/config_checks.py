"""Checks of a pretraining config that name the field and the fix, before anything is written.

Two stages, each raising a `bertjax.errors.UserError` (one line from the command line):
`validate` (no jax: every field's type and range, the choices) and `preflight` (jax: the model
config, the mesh, the batch splits, then the files the run reads: prepared data, tokenizer,
`init_from` checkpoint). `preflight` returns a `Plan` — the resolved config, the mesh, the
phases and the data's metadata — that `loop.train_and_evaluate` runs as it is, so nothing is
read or checked twice and a config built in Python gets the same errors as the command line's.
Rules between model fields (the local attention pattern, head sizes) are `BertConfig`'s own.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bertjax import errors
from bertjax.training import objective  # jax-free: the valid objective names


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
  why: str = ""

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


def _at_least(low: int, why: str = "", **kw) -> Range:
  return Range(int, low, why=why, **kw)


_POSITIVE = dict(low=0.0, low_open=True)
_RATE = Range(float, 0.0, 1.0, high_open=True, why="a dropout probability")
_MESH = _at_least(1, "-1 fills the devices left", minus_one_ok=True)
_MODEL_SIZE = _at_least(1, "None: the preset's", none_ok=True)

# Every numeric field of experiments/pretrain.py (and of the files built on it) and its range.
# tests/test_config_checks.py fails when a recipe gains a numeric field missing here.
RANGES: dict[str, Range] = {
    "seed": _at_least(0, "parameter init, dropout and data order"),
    "model.vocab_size": _at_least(5, "the tokenizer's size; None: from the data", none_ok=True),
    "model.num_layers": _MODEL_SIZE,
    "model.hidden_size": _MODEL_SIZE,
    "model.num_heads": _MODEL_SIZE,
    "model.intermediate_size": _MODEL_SIZE,
    "model.max_position_embeddings": _MODEL_SIZE,
    "model.type_vocab_size": _at_least(0, "0: no token-type table (ModernBERT)", none_ok=True),
    "model.hidden_dropout_rate": _RATE,
    "model.attention_dropout_rate": _RATE,
    "model.layer_norm_eps": Range(float, **_POSITIVE, none_ok=True),
    "model.initializer_range": Range(float, **_POSITIVE, none_ok=True),
    "model.rope_theta": Range(
        float, **_POSITIVE, why="RoPE base of global layers; ModernBERT: 160000"
    ),
    "model.local_rope_theta": Range(
        float, **_POSITIVE, why="RoPE base of local layers; ModernBERT: 10000"
    ),
    "model.local_attention": _at_least(0, "0: every layer global; ModernBERT: 128"),
    "model.global_every": _at_least(1, "1: every layer global; ModernBERT: 3"),
    "data.max_predictions_per_seq": _at_least(1, "masked positions per example"),
    "data.mask_prob": Range(
        float, 0.0, 1.0, low_open=True, why="share of tokens masked; BERT: 0.15"
    ),
    "data.mask_token_prob": Range(float, 0.0, 1.0, why="of the chosen tokens: [MASK]; BERT: 0.8"),
    "data.random_token_prob": Range(
        float, 0.0, 1.0, why="of the chosen tokens: a random token; BERT: 0.1"
    ),
    "contrastive.scale": Range(float, **_POSITIVE, why="scores x scale; sentence-transformers: 20"),
    "contrastive.sigmoid_bias": Range(
        float, why="the sigmoid loss's learned bias at start; SigLIP: -10"
    ),
    "contrastive.hard_negatives": _at_least(0, "hard negatives per row, as the pair data holds"),
    "contrastive.chunk_size": _at_least(0, "rows per GradCache chunk; 0: one pass"),
    "model.embedding_size": _at_least(0, "0: hidden_size; ELECTRA-Small: 128", none_ok=True),
    "electra.generator_hidden_fraction": Range(
        float, 0.0, 1.0, low_open=True, why="generator width / the encoder's; ELECTRA: 0.25"
    ),
    "electra.disc_weight": Range(
        float, **_POSITIVE, why="λ on the discriminator loss; ELECTRA: 50"
    ),
    "data.prefetch": _at_least(1, "batches transferred ahead of the step"),
    "data.workers": _at_least(1, "processes building examples; None: half the cores", none_ok=True),
    "data.max_examples_per_row": Range(
        int,
        0,
        64,
        why="examples a packed row may hold: NSP labels per row; 0 (default): measured on the corpus",
    ),
    "train.batch_size": _at_least(1, "global sequences per step"),
    "train.steps": _at_least(1, "total optimizer steps"),
    "train.learning_rate": Range(float, **_POSITIVE, why="the peak learning rate"),
    "train.warmup_steps": _at_least(0, "0 = no warmup"),
    "train.b1": Range(float, 0.0, 1.0, high_open=True, why="Adam's beta1"),
    "train.b2": Range(float, 0.0, 1.0, high_open=True, why="Adam's beta2"),
    "train.eps": Range(float, **_POSITIVE, why="Adam's epsilon"),
    "train.weight_decay": Range(float, 0.0, why="0 = none"),
    "train.clip_norm": Range(float, 0.0, why="global gradient norm clip; 0 = none"),
    "train.microbatches": _at_least(1, "1 = no gradient accumulation"),
    "train.max_bad_steps": _at_least(0, "0 = stop at the first non-finite step"),
    "train.inject_nan_at_step": _at_least(-1, "testing only; -1 = never"),
    "train.head_warmup_steps": _at_least(-1, "-1 = 10% of the steps when a head starts untrained"),
    "train.decay_fraction": Range(float, 0.0, 1.0, why="wsd: share of the steps in the decay"),
    "train.final_lr_fraction": Range(float, 0.0, 1.0, why="wsd: last lr / peak; 0 = to zero"),
    "train.peak_fraction": Range(float, 0.0, 1.0, why="one_cycle: share of the steps rising"),
    "train.batch_warmup_steps": _at_least(0, "batch-size warmup steps; 0 = none"),
    "train.batch_warmup_start": _at_least(1, "microbatches trained on at step 0"),
    "phase2.fraction": Range(
        float, 0.0, 1.0, high_open=True, why="share of config.train.steps in phase 2; 0 = one phase"
    ),
    "mesh.data": _MESH,
    "mesh.fsdp": _MESH,
    "mesh.tensor": _MESH,
    "mesh.dcn_data": _at_least(1, "slices in data parallelism"),
    "mesh.dcn_fsdp": _at_least(1, "slices in FSDP"),
    "mesh.dcn_tensor": _at_least(1, "slices in tensor parallelism"),
    "checkpoint.every_steps": _at_least(
        1, "to save rarely, use a value above config.train.steps: the last step is always saved"
    ),
    "checkpoint.max_to_keep": _at_least(1, "None = keep all", none_ok=True),
    "checkpoint.keep_period": _at_least(
        1, "also keep every N-th step; None = only the newest", none_ok=True
    ),
    "eval.every_steps": _at_least(0, "0 = no held-out evaluation"),
    "eval.steps": _at_least(0, "eval batches per evaluation; 0 = none"),
    "eval.target_mlm_accuracy": Range(
        float, 0.0, 1.0, none_ok=True, why="held-out MLM accuracy to time; None = not timed"
    ),
    "eval.mask_prob": Range(
        float, 0.0, 1.0, low_open=True, none_ok=True, why="held-out masking; None: data's"
    ),
    "eval.seed": _at_least(0, "held-out order and masks; None: the run's seed", none_ok=True),
    "log_every_steps": _at_least(1, "progress line interval"),
    "peak_flops_per_device": Range(float, **_POSITIVE, none_ok=True, why="None: from the device"),
}
# Checked only when the second phase runs (config.phase2.fraction > 0).
PHASE2_RANGES: dict[str, Range] = {
    "phase2.seq_len": _at_least(3, "phase-2 tokens per example"),
    "phase2.max_predictions_per_seq": _at_least(1, "phase-2 masked positions"),
    "phase2.batch_size": _at_least(1, "global sequences per phase-2 step"),
    "phase2.microbatches": _at_least(1, "1 = no gradient accumulation"),
    "phase2.learning_rate": Range(float, **_POSITIVE, why="phase-2 peak (restart_schedule)"),
    "phase2.warmup_steps": _at_least(0, "phase-2 warmup (restart_schedule)"),
    "phase2.rope_theta": Range(float, **_POSITIVE, none_ok=True, why="None: config.model's"),
    "phase2.local_rope_theta": Range(float, **_POSITIVE, none_ok=True, why="None: config.model's"),
    "phase2.decay_fraction": Range(float, 0.0, 1.0, none_ok=True, why="None: config.train's"),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "objective": objective.NAMES,  # one per branch of `objective.make`
    "data.source": ("prepared", "synthetic"),
    # objective_contrastive.POOLINGS / LOSSES, written out: this module must not import jax.
    "contrastive.pooling": ("mean", "cls"),
    "contrastive.loss": ("infonce", "sigmoid"),
    "data.pair_mode": ("nsp", "sop", "none"),
    "eval.pair_mode": ("nsp", "sop", "none"),  # None: data.pair_mode
    # optim.OPTIMIZERS / optim.SCHEDULES, written out: this module must not import jax.
    "train.optimizer": ("bert_adamw", "adamw", "lamb", "stable_adamw"),
    "train.schedule": ("bert", "warmup_linear", "wsd", "one_cycle"),
    "model.remat": ("none", "dots", "full"),
    # bertjax.model.config's switches, written out for the same reason; BERT's value first.
    "model.norm_placement": ("post", "pre"),
    "model.mlp_type": ("dense", "glu"),
    "model.position_embedding": ("learned", "rope"),
}
_MISSING = object()
_NONE_OK = ("eval.pair_mode",)  # choices that may be None (meaning: as another field)


def _get(config, path: str):
  node = config
  for key in path.split("."):
    if node is None or not hasattr(node, "keys") or key not in node:
      return _MISSING
    node = node[key]
  return node


def check_range(config, path: str, rule: Range) -> None:
  """ConfigError naming `config.PATH`, its value and the rule, unless the value is valid."""
  value = _get(config, path)
  if value is _MISSING or rule.accepts(value):
    return
  why = f" ({rule.why})" if rule.why else ""
  raise errors.ConfigError(f"config.{path}={value!r}: must be {rule.describe()}{why}")


def _check_choice(config, path: str, valid: tuple[str, ...]) -> None:
  value = _get(config, path)
  if value is not _MISSING and value not in valid and not (path in _NONE_OK and value is None):
    raise errors.ConfigError(f"config.{path}={value!r}: valid: {', '.join(valid)}")


def validate(config) -> None:
  """Raise ConfigError naming the field, its value and the valid range, for a config that
  cannot run; no jax, nothing written. The mesh and batch splits are `preflight`'s."""
  for path, rule in RANGES.items():
    check_range(config, path, rule)
  for path, valid in CHOICES.items():
    _check_choice(config, path, valid)
  pairs = _get(config, "data.pair_mode") not in ("none", _MISSING)
  if _get(config, "objective") == "contrastive" and _get(config, "train.microbatches") != 1:
    raise errors.ConfigError(
        f"config.train.microbatches={_get(config, 'train.microbatches')}: the contrastive loss "
        "scores each query against the whole batch, which microbatches would split — set "
        "config.train.microbatches=1 and config.contrastive.chunk_size=R for a batch larger "
        "than memory"
    )
  if _get(config, "objective") == "electra" and pairs:
    raise errors.ConfigError(
        f"config.data.pair_mode={_get(config, 'data.pair_mode')!r}: ELECTRA has no pair task — "
        "set config.data.pair_mode=none with config.objective=electra"
    )
  shares = [_get(config, f"data.{k}") for k in ("mask_token_prob", "random_token_prob")]
  if _MISSING not in shares and sum(shares) > 1.0:
    raise errors.ConfigError(
        f"config.data.mask_token_prob + random_token_prob = {sum(shares):g}: must be <= 1 "
        "(the rest of the chosen tokens stay as they are) — lower one of them"
    )
  # [CLS] and [SEP], plus a [SEP] and one token per segment for sentence pairs
  check_range(config, "data.seq_len", _at_least(5 if pairs else 3, "tokens per example"))
  if _get(config, "eval.every_steps") and _get(config, "eval.steps"):
    check_range(config, "eval.batch_size", _at_least(1, "global eval batch"))
  seq_lens = [("data.seq_len", _get(config, "data.seq_len"))]
  if (_get(config, "phase2.fraction") or 0) > 0:
    for path, rule in PHASE2_RANGES.items():
      check_range(config, path, rule)
    check_range(config, "phase2.seq_len", _at_least(5 if pairs else 3, "tokens per example"))
    seq_lens.append(("phase2.seq_len", _get(config, "phase2.seq_len")))
  for path, n in seq_lens:  # the masked arrays are P wide in a row of L tokens
    budget_path = path.replace("seq_len", "max_predictions_per_seq")
    budget = _get(config, budget_path)
    if isinstance(n, int) and isinstance(budget, int) and budget > n:
      rate = _get(config, "data.mask_prob")
      fit = math.ceil(rate * n) if isinstance(rate, (int, float)) else n
      raise errors.ConfigError(
          f"config.{budget_path}={budget} exceeds config.{path}={n}: a row has no more "
          f"positions to predict — set config.{budget_path}={fit} (the masking rate x {n}, "
          "rounded up) or leave it unset when you change the length"
      )
  positions = _get(config, "model.max_position_embeddings")
  offset = _get(config, "model.position_offset")  # RoBERTa's table starts at row 2
  if isinstance(positions, int) and isinstance(offset, int):
    positions -= offset
  learned = _get(config, "model.position_embedding") in ("learned", _MISSING)
  for path, n in seq_lens:  # a table of learned positions has no row past its size; RoPE has none
    if learned and isinstance(positions, int) and isinstance(n, int) and n > positions:
      raise errors.ConfigError(
          f"config.{path}={n} exceeds config.model.max_position_embeddings={positions} — "
          f"lower config.{path} or raise config.model.max_position_embeddings"
      )
  if _get(config, "data.sources") not in (None, "", _MISSING):
    _sources(config)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What `preflight` checked, for the loop to run as it is."""

  config: Any  # ml_collections.ConfigDict: data path, vocab size and tokenizer from the data
  mesh: Any  # jax.sharding.Mesh
  phases: tuple  # training.phases.Phase, in order
  workdir: str | None = None  # absolute (gs:// stays); None: the inputs were not checked
  meta: dict | None = None  # the prepared data's metadata.json; None: synthetic, or not yet
  # prepared (the bundled corpus, which the run prepares into the workdir: `with_data`)
  notes: tuple[str, ...] = ()  # what the run was given besides the recipe (`--init`'s network)
  # (steps, heads): heads that start untrained from `--init`, trained alone first
  # (`loop.head_warmup`); set by the loop
  head_warmup: tuple[int, tuple[str, ...]] = (0, ())


def preflight(config, workdir: str | None = None, explicit: frozenset[str] = frozenset()) -> Plan:
  """The checks that need jax, before the workdir is touched: model fields, mesh, batch splits;
  with `workdir`, also the files the run reads (`check_inputs`), and the config resolved
  against the data. With `train.init_from`, the network is the checkpoint's (`init_from.adopt`;
  `explicit`: the config.model fields set on the command line, which must agree with it)."""
  # Here, not at the top: the checks above run before (and without) jax.
  from bertjax.runtime import fs
  from bertjax.training import phases as phases_lib, sharding, train

  config, notes = _with_init(config, explicit)
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.model.vocab_size = c.model.vocab_size or 8000  # a stand-in: the data decides it later
  try:
    objective.make(c, train.model_config(c))  # the objective's own networks (ELECTRA's generator)
  except errors.UserError:
    raise
  except ValueError as e:  # BertConfig's own checks (hidden_size % num_heads, ...)
    msg = str(e).removeprefix("BertConfig: ")
    msg = msg if msg.startswith("config.model") else f"config.model: {msg}"
    raise errors.ConfigError(msg) from e
  try:
    mesh = sharding.mesh_from_config(config.mesh)
    phases = tuple(phases_lib.phases(config))
    for ph in phases:
      field = "config.train.batch_size" if ph.index == 0 else "config.phase2.batch_size"
      sharding.check_batch_size(ph.batch_size, mesh, ph.microbatches, field)
    if config.eval.every_steps and config.eval.steps:
      sharding.check_batch_size(config.eval.batch_size, mesh, 1, "config.eval.batch_size")
  except errors.UserError:
    raise
  except ValueError as e:  # the mesh does not fit the devices, a batch does not split
    raise errors.ConfigError(str(e)) from e
  if workdir is None:
    return Plan(config, mesh, phases, notes=notes)
  workdir = str(fs.absolute(workdir))  # orbax writes only to absolute paths; gs:// stays
  meta = check_inputs(config, workdir)
  return with_data(Plan(config, mesh, phases, workdir, notes=notes), data_path(config), meta)


def _with_init(config, explicit: frozenset[str]) -> tuple[Any, tuple[str, ...]]:
  """`config` with the network of `train.init_from` (a copy), and what was taken from where."""
  path = config.train.get("init_from")
  if not path:
    return config, ()
  from bertjax.training import init_from

  source = init_from.describe(path)
  c = config.copy_and_resolve_references()
  with c.unlocked():
    changed = init_from.adopt(c, source, explicit)
  s = source.config
  line = (
      f"init: the network of {path} ({source.what}): {s.num_layers} layers x {s.hidden_size}, "
      f"{s.num_heads} heads, vocab {s.vocab_size}"
  )
  if changed:
    line += f"; the recipe's model fields overridden: {', '.join(changed)}"
  return c, (line,)


def data_path(config) -> str | None:
  """config.data.path, or the first source of a mixture (its tokenizer is all the sources')."""
  from bertjax.data import mixture

  sources = mixture.parse_sources(config.data.get("sources"))
  return sources[0].path if sources else config.data.path


def with_data(plan: Plan, path: str | None, meta: dict | None = None) -> Plan:
  """`plan` training on the prepared data at `path` (its metadata `meta`, read and checked here
  when not given): the config's data path, vocab size and tokenizer filled from the data."""
  c = plan.config.copy_and_resolve_references()
  with c.unlocked():
    if c.data.source == "synthetic":
      c.model.vocab_size = c.model.vocab_size or 8000
    elif path:
      if meta is None:
        meta = read_metadata(path)
        check_data(c, meta)
      from bertjax.runtime import fs

      if not c.data.get("sources"):  # a mixture's sources stay where they are named
        c.data.path = path
      if not c.train.get("init_from"):  # else the checkpoint's (check_data: the data's fits)
        c.model.vocab_size = meta["tokenizer"]["vocab_size"]
      c.data.tokenizer = c.data.tokenizer or str(fs.path(path) / meta["tokenizer"]["file"])
  return dataclasses.replace(plan, config=c, meta=meta)


# ----------------------------------------------------------------------------- inputs


def read_metadata(path: str, where: str = "") -> dict:
  """metadata.json of the prepared data at `path` (config.data.path, or as `where` names it:
  a mixture's source), its shards checked."""
  from etils import epath

  from bertjax.data import records
  from bertjax.runtime import fs

  shown = str(epath.Path(path))
  field = f"{where}: {path}" if where else f"config.data.path={path}"
  if not fs.path(path).is_dir():
    unset = "" if where else ", or leave config.data.path unset to train on the bundled corpus"
    raise errors.InputNotFoundError(
        f"{field}: no such directory — write it with `bertjax prepare --output {path}`{unset}"
    )
  try:
    meta = records.load_metadata(path)
    records.check_shards(meta, path)
  except FileNotFoundError as e:  # records' errors name the file; this names the field too
    raise errors.InputNotFoundError(f"{field}: {_strip(e, shown)}") from e
  except (ValueError, KeyError) as e:  # unreadable JSON, a truncated shard
    raise errors.BadInputError(f"{field}: {_strip(e, shown)}") from e
  return meta


def _strip(e: BaseException, prefix: str) -> str:
  return str(e).removeprefix(f"{prefix}: ")


def check_data(config, meta: dict, where: str = "") -> None:
  """The prepared data holds training documents and the vocabulary the config asks for. Any
  number of shard files serves any number of processes: every process reads blocks of all of
  them (docs/data.md, "Sharding across hosts"). `where`: a mixture's source, as errors name it."""
  field = where or f"config.data.path={config.data.path}"
  pairs, contrastive = meta.get("kind") == "pairs", config.get("objective") == "contrastive"
  if pairs != contrastive:
    raise errors.ConfigError(
        f"{field}: pair data (`prepare --kind pairs`) trains config.objective=contrastive only"
        if pairs
        else f"{field}: config.objective=contrastive trains on pair data — prepare it with "
        "`bertjax prepare --kind pairs --input FILE --tokenizer TOK --output DIR`"
    )
  want = config.get("contrastive", {}).get("hard_negatives")
  if pairs and meta.get("negatives") != want:
    raise errors.ConfigError(
        f"{field} holds {meta.get('negatives')} hard negative(s) per row, but "
        f"config.contrastive.hard_negatives={want} — set "
        f"--config.contrastive.hard_negatives={meta.get('negatives')}"
    )
  train = [s for s in meta.get("shards", []) if s.get("split") == "train" and s.get("documents")]
  if not train:
    problems = "; ".join(meta.get("examples_of_problems", [])[:2])
    inputs = ", ".join(meta.get("inputs", [])[:3]) or "its input"
    raise errors.InputNotFoundError(
        f"{field}: the prepared data holds no training documents "
        f"(`bertjax prepare` found no text in {inputs}{': ' + problems if problems else ''}) — "
        "re-run `bertjax prepare` on a non-empty corpus"
    )
  vocab = meta["tokenizer"]["vocab_size"]
  if config.train.get("init_from") and config.model.vocab_size:
    if vocab > config.model.vocab_size:  # a table padded past the tokenizer's is fine
      raise errors.ConfigError(
          f"{field} was tokenized with vocab_size={vocab}, more than config.train.init_from="
          f"{config.train.init_from} has ({config.model.vocab_size}) — prepare it with "
          f"`bertjax prepare --tokenizer {config.train.init_from}`"
      )
    return
  if config.model.vocab_size and config.model.vocab_size != vocab:
    raise errors.ConfigError(
        f"config.model.vocab_size={config.model.vocab_size} but {field} was tokenized with "
        f"vocab_size={vocab} — drop the override (the data's is used)"
    )


def _missing(path: str | None) -> bool:
  from bertjax.runtime import fs  # here: `--help` answers before etils loads

  return bool(path) and not fs.path(path).exists()


def check_inputs(config, workdir: str) -> dict | None:
  """The files the run reads exist and fit the config: the prepared data (or the bundled
  corpus), the tokenizer, and `train.init_from` on a fresh run. Reads only; returns the
  prepared data's metadata (None for synthetic data or the bundled corpus)."""
  from bertjax.data import bundled
  from bertjax.runtime import fs

  if fs.path(workdir).exists() and not fs.path(workdir).is_dir():
    raise errors.ConfigError(f"workdir {workdir}: exists and is not a directory — choose another")
  meta = None
  pairs_data = config.data.path or config.data.get("sources")
  if config.get("objective") == "contrastive" and not pairs_data:
    raise errors.ConfigError(
        "config.objective=contrastive trains on pair data: set config.data.path=P "
        "(`bertjax prepare --kind pairs ... --output P`) or config.data.sources (a mixture of "
        "them); synthetic data is for the MLM and ELECTRA objectives"
    )
  sources = _sources(config)
  if sources:
    from bertjax.data import mixture, pair_mixture

    metas = [read_metadata(s.path, f"config.data.sources ({s.name})") for s in sources]
    mixture.check_tokenizers(sources, metas)
    pair_mixture.check_negatives(sources, metas)  # among themselves first: one fix fits all
    for s, meta in zip(sources, metas):
      check_data(config, meta, f"config.data.sources ({s.name})")
    meta = metas[0]
  elif config.data.source == "prepared":
    if config.data.path:
      meta = read_metadata(config.data.path)
      check_data(config, meta)
    else:
      bundled.find()
  if _missing(config.data.tokenizer):
    raise errors.InputNotFoundError(
        f"config.data.tokenizer={config.data.tokenizer}: no such file — name the .model or "
        "vocab.txt the data was prepared with, or leave it unset (the data's own copy)"
    )
  resuming = (fs.path(workdir) / "checkpoints").is_dir()
  if config.train.init_from and not resuming:
    _check_init_from(config, meta)
  return meta


def _sources(config) -> tuple:
  """config.data.sources parsed (a mixture), () without; one line when it is malformed or set
  beside config.data.path."""
  from bertjax.data import mixture

  sources = mixture.parse_sources(config.data.get("sources"))
  if sources and config.data.path:
    raise errors.ConfigError(
        "config.data.path and config.data.sources are both set: a run reads one dataset "
        "(data.path) or a mixture (data.sources) — unset one"
    )
  if sources and config.data.source != "prepared":
    raise errors.ConfigError(
        f"config.data.sources mixes prepared datasets; config.data.source is "
        f"{config.data.source!r} — set it to 'prepared' or unset data.sources"
    )
  return sources


def _check_init_from(config, meta: dict | None) -> None:
  """`init_from` is a checkpoint bertjax reads, and the data was prepared with its tokenizer
  (its network was adopted by `preflight`)."""
  from bertjax.training import init_from

  source = init_from.describe(config.train.init_from)
  init_from.check_tokenizer(source, meta, data_path(config) or "the bundled corpus")
