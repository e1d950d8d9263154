"""Checks of a pretraining config that name the field and the fix, before anything is written.

Two stages, each raising a `bertjax.errors.UserError` (one line from the command line):
`validate` (no jax: every field's range and choices, from the table of `fields`, then the
rules between fields) and `preflight` (jax: the model config, the mesh, the batch splits, then
the files the run reads: prepared data, tokenizer, `init_from` checkpoint). `preflight` returns a `Plan` — the resolved config, the mesh, the
phases and the data's metadata — that `loop.train_and_evaluate` runs as it is, so nothing is
read or checked twice and a config built in Python gets the same errors as the command line's.
Rules between model fields (the local attention pattern, head sizes) are `BertConfig`'s own.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bertjax import errors
from bertjax.training import fields, objective  # jax-free
from bertjax.training.fields import PHASE2_RANGES, RANGES, Range, at_least

CHOICES: dict[str, tuple[str, ...]] = {"objective": objective.NAMES, **fields.CHOICES}

_MISSING = object()


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
  if (
      value is not _MISSING
      and value not in valid
      and not (path in fields.CHOICES_NONE_OK and value is None)
  ):
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
  check_range(config, "data.seq_len", at_least(5 if pairs else 3, "tokens per example"))
  if _get(config, "eval.every_steps") and _get(config, "eval.steps"):
    check_range(config, "eval.batch_size", at_least(1, "global eval batch"))
  seq_lens = [("data.seq_len", _get(config, "data.seq_len"))]
  if (_get(config, "phase2.fraction") or 0) > 0:
    for path, rule in PHASE2_RANGES.items():
      check_range(config, path, rule)
    check_range(config, "phase2.seq_len", at_least(5 if pairs else 3, "tokens per example"))
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
    pair_mixture.check_prompts(sources, metas)
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
