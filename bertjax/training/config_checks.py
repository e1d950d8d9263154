"""Checks of a pretraining config that name the field and the fix, before anything is written.

`validate` needs no jax (the command runs it before initialising distributed jax);
`preflight` builds the model config and the mesh. `loop.train_and_evaluate` runs `validate`
too, so a config built in Python gets the same one-line errors as the command line's.
"""

from __future__ import annotations


def _at_least(config, path: str, low: int, why: str) -> None:
  section, _, key = path.rpartition(".")
  holder = config
  for part in section.split(".") if section else []:
    holder = holder.get(part)
    if holder is None:
      return
  if key not in holder:
    return
  value = holder[key]
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise ValueError(
        f"config.{path}={value!r}: must be an integer >= {low} ({why}); " f"set --config.{path}=N"
    )


def _one_of(config, path: str, valid: tuple[str, ...]) -> None:
  section, _, key = path.rpartition(".")
  holder = config.get(section) if section else config
  if holder is not None and key in holder and holder[key] not in valid:
    raise ValueError(
        f"config.{path}={holder[key]!r}: valid: {', '.join(valid)}; "
        f"set --config.{path}={valid[0]}"
    )


def validate(config) -> None:
  """Raise ValueError naming the field and the fix for a pretrain config that cannot run.

  The checks need no jax and run before anything is written to the workdir; the mesh and the
  batch split are checked by `preflight` (and again by the loop).
  """
  _at_least(config, "train.steps", 1, "total optimizer steps")
  _at_least(config, "train.batch_size", 1, "global sequences per step")
  _at_least(config, "train.microbatches", 1, "1 = no gradient accumulation")
  _at_least(config, "train.warmup_steps", 0, "0 = no warmup")
  _at_least(config, "train.max_bad_steps", 0, "0 = stop at the first non-finite step")
  _at_least(config, "eval.every_steps", 0, "0 = no held-out evaluation")
  _at_least(config, "eval.steps", 0, "eval batches per evaluation; 0 = none")
  if config.get("eval") and config.eval.get("every_steps") and config.eval.get("steps"):
    _at_least(config, "eval.batch_size", 1, "global eval batch")
  _at_least(
      config,
      "checkpoint.every_steps",
      1,
      "to save rarely, use a value above " "config.train.steps: the last step is always saved",
  )
  _at_least(config, "log_every_steps", 1, "progress line interval")
  pairs = config.get("data") is not None and config.data.get("pair_mode", "nsp") != "none"
  _at_least(
      config,
      "data.seq_len",
      5 if pairs else 3,
      "tokens per example incl. [CLS] and " "the [SEP]s" + (" of both segments" if pairs else ""),
  )
  _at_least(config, "data.max_predictions_per_seq", 1, "masked positions per example")
  _one_of(config, "data.source", ("prepared", "synthetic"))
  _one_of(config, "data.pair_mode", ("nsp", "sop", "none"))
  # optim.OPTIMIZERS / optim.SCHEDULES, written out: this module must not import jax.
  _one_of(config, "train.optimizer", ("bert_adamw", "adamw", "lamb"))
  _one_of(config, "train.schedule", ("bert", "warmup_linear"))
  _one_of(config, "model.remat", ("none", "dots", "full"))
  p2 = config.get("phase2")
  if p2 is not None and "fraction" in p2:
    if not 0.0 <= p2.fraction < 1.0:
      raise ValueError(
          f"config.phase2.fraction={p2.fraction!r}: must be in [0, 1) (the share "
          "of config.train.steps run in phase 2; 0 = one phase)"
      )
    if p2.fraction > 0:
      _at_least(config, "phase2.batch_size", 1, "global sequences per phase-2 step")
      _at_least(config, "phase2.microbatches", 1, "1 = no gradient accumulation")
      _at_least(config, "phase2.seq_len", 5 if pairs else 3, "phase-2 tokens per example")
      _at_least(config, "phase2.max_predictions_per_seq", 1, "phase-2 masked positions")
  if config.get("data") and "mask_prob" in config.data and not 0.0 < config.data.mask_prob <= 1.0:
    raise ValueError(
        f"config.data.mask_prob={config.data.mask_prob!r}: must be in (0, 1] " "(BERT: 0.15)"
    )


def preflight(config) -> None:
  """The checks that need jax, before the workdir is touched: model fields, mesh, batch split."""
  # Here, not at the top: the checks above run before (and without) jax.
  from bertjax.training import loop, sharding, train

  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.model.vocab_size = c.model.vocab_size or 8000  # a stand-in: the data decides it later
  try:
    train.model_config(c)
  except ValueError as e:
    msg = str(e).removeprefix("BertConfig: ")
    raise ValueError(msg if msg.startswith("config.model") else f"config.model: {msg}") from e
  mesh = sharding.mesh_from_config(config.mesh)
  for ph in loop.phases(config):
    sharding.check_batch_size(
        ph.batch_size,
        mesh,
        ph.microbatches,
        "config.train.batch_size" if ph.index == 0 else "config.phase2.batch_size",
    )
