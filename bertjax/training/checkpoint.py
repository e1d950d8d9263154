"""Checkpoints of the training run (orbax CheckpointManager); standalone pretrained models and
every reader of a checkpoint are `bertjax.training.pretrained`'s.

A `bertjax pretrain` workdir:

    WORKDIR/checkpoints/<step>/state   params, optimizer state, step, dropout RNG (orbax, sharded)
    WORKDIR/checkpoints/<step>/data    every process's input-stream position (JSON)
    WORKDIR/checkpoints/<step>/meta    BertConfig, tokenizer file name + sha256, run config,
                                       the objective's record, pair data's prompts (JSON)
    WORKDIR/tokenizer/<file>           the tokenizer the data was prepared with


Orbax writes each step to a temporary directory and renames it when complete, so a process
killed mid-save leaves no half checkpoint behind; restores read only complete steps. Arrays
are restored onto the shardings asked for, whatever mesh wrote them.

Orbax stores no checksum of the array files (a flipped bit restores as a changed weight), so
each finished step gets `<step>/sha256.json`: the size and SHA-256 of every file in it. A
resume checks the newest step against it and tries to restore it; a step that fails either
is reported by file and step, moved to WORKDIR/bad_checkpoints/<step> (kept, never deleted),
and the next newest is tried. Steps written to an object store (gs://) are not hashed when
saved: that would download every step again right after uploading it, and GCS checks each
object's CRC32C itself; a step that holds a digest there (a local run copied up) is checked.
Every path goes through `etils.epath` (`bertjax.runtime.fs`), so all of this works on any
scheme.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
from typing import Any, Callable

import errno
import jax
from jax.experimental import multihost_utils
import orbax.checkpoint as ocp

from bertjax import errors
from bertjax import model as model_lib
from bertjax.runtime import fs
from bertjax.training.digest import DIGEST_NAME, verify_digest, write_digest  # noqa: F401

# BertConfig fields that decide the parameter shapes; a resume must agree on all of them. Not
# here, as they shape no parameter: the attention window (local_attention, global_every) and
# the RoPE bases (rope_theta, local_rope_theta), which a later phase may change (context
# extension raises theta).
ARCH_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "position_offset",  # RoBERTa's position table starts at row 2
    "type_vocab_size",
    "norm_placement",  # pre-LN adds a final norm and drops layer 0's attention norm
    "embedding_size",  # ELECTRA's factorised embeddings: other tables, a projection
    "mlp_type",  # GLU's input kernel is [H, 2, F]
    "position_embedding",  # RoPE has no position table
    "use_bias",
    "scan_layers",
)
# What a checkpoint written before a field existed had: BERT's value, the field's default.
_ARCH_DEFAULTS = {f.name: f.default for f in dataclasses.fields(model_lib.BertConfig)}


# `path` made absolute when it is local (orbax mis-reads relative paths; gs:// stays); the name
# is kept for callers of `checkpoint.absolute`.
absolute = fs.absolute


class CheckpointMismatchError(errors.UserError, ValueError):
  """A checkpoint whose model or optimizer differs from the config trying to restore it."""


class NoGoodCheckpointError(errors.UserError, ValueError):
  """Every checkpoint of the run failed its digest or its restore."""


class DiskFullError(RuntimeError):
  """A save ran out of space; the partial step is removed, earlier steps are intact."""


def _disk_full(e: BaseException) -> bool:
  while e is not None:
    if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e):
      return True
    e = e.__cause__ or e.__context__
  return False


class _QuietDiskFull(logging.Filter):
  """Orbax logs a full traceback per failed write thread; the Manager reports it once."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (
        "No space left on device" in record.getMessage()
        or (record.exc_info and _disk_full(record.exc_info[1]))
    )


def check_compatible(
    saved: dict,
    current: model_lib.BertConfig,
    where: str,
    saved_optimizer: str | None = None,
    optimizer: str | None = None,
    saved_objective: str | None = None,
    objective: str | None = None,
) -> None:
  """Raise, naming the first differing field, instead of ever restoring partially."""
  if objective and (saved_objective or "mlm") != objective:
    raise CheckpointMismatchError(
        f"{where} was written with config.objective={saved_objective or 'mlm'!r} but the config "
        f"now has {objective!r}; use the original objective, or a new --workdir"
    )
  for field in ARCH_FIELDS:
    old, new = saved.get(field, _ARCH_DEFAULTS[field]), getattr(current, field)
    if old != new:
      raise CheckpointMismatchError(
          f"{where} was written with config.model.{field}={old!r} but the config now has "
          f"{new!r}; use the original value, or a new --workdir (or --config.train.init_from "
          f"to start a new run from its weights)"
      )
  if saved_optimizer and optimizer and saved_optimizer != optimizer:
    raise CheckpointMismatchError(
        f"{where} was written with config.train.optimizer={saved_optimizer!r} but the config now "
        f"has {optimizer!r}; its optimizer state cannot be reused: use a new --workdir with "
        f"--config.train.init_from={where}"
    )


# ----------------------------------------------------------------------------- training runs


@dataclasses.dataclass(frozen=True)
class Restored:
  """One step of a run, restored."""

  step: int
  state: Any  # on the shardings of the abstract state asked for, whatever mesh wrote it
  data_states: list | None  # every process's input-stream position, in process order
  meta: dict  # BertConfig, optimizer, tokenizer, run config, partial metrics (see `loop._meta`)


class Manager:
  """Async orbax checkpoints of the train state, data position and metadata of one run."""

  def __init__(
      self,
      workdir: str,
      every_steps: int,
      max_to_keep: int | None = 3,
      keep_period: int | None = None,
      async_save: bool = True,
  ):
    self.directory = absolute(workdir) / "checkpoints"
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=max(1, every_steps),
        max_to_keep=max_to_keep,
        keep_period=keep_period,
        enable_async_checkpointing=async_save,
        create=True,
    )
    self._mngr = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "data", "meta")
    )
    self._undigested: list[int] = []
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _QuietDiskFull) for f in absl_logger.filters):
      absl_logger.addFilter(_QuietDiskFull())

  @contextlib.contextmanager
  def _space_checked(self, step: int | None):
    """Turn orbax's out-of-space failure (raised by the write or by a later wait) into one
    DiskFullError naming the workdir and its free space, after removing the partial step."""
    try:
      yield
    except Exception as e:  # noqa: BLE001  (orbax wraps the OSError in its own errors)
      if not _disk_full(e):
        raise
      partial = (
          sorted(p.name for p in self.directory.iterdir() if "tmp" in p.name)
          if self.directory.exists()
          else []
      )
      if jax.process_index() == 0:
        for name in partial:
          with contextlib.suppress(Exception):  # best effort, as the error is reported anyway
            (self.directory / name).rmtree(missing_ok=True)
      # epath has no free-space query; a local disk only (an object store does not fill up).
      local = fs.is_local(self.directory)
      free = shutil.disk_usage(str(self.directory)).free if local else None
      done = [s for s in self._mngr.all_steps() if str(s) not in partial]
      raise DiskFullError(
          f"disk full while saving a checkpoint to {self.directory.parent}"
          + (f" ({free / 2**30:.2f} GiB free)" if free is not None else "")
          + f"; removed the partial step ({', '.join(partial) or 'none left'}); newest complete "
          f"checkpoint: {max(done) if done else 'none'}. Free space (or lower "
          "config.checkpoint.max_to_keep) and rerun to resume"
      ) from None

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def save(
      self, step: int, state: Any, data_states: list | None, meta: dict, force: bool = False
  ) -> bool:
    """Start saving (returns at once when async); False if the interval says not yet."""
    self._digest_finished()
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave({"processes": data_states}),
        meta=ocp.args.JsonSave(meta),
    )
    with self._space_checked(step):
      saved = self._mngr.save(step, args=args, force=force)
    if saved:
      self._undigested.append(step)
    return saved

  def _digest_finished(self) -> None:
    """Digest the steps saved so far, once orbax has finished writing them."""
    if not self._undigested:
      return
    with self._space_checked(None):
      self._mngr.wait_until_finished()
    steps, self._undigested = self._undigested, []
    if jax.process_index() == 0 and fs.is_local(self.directory):
      for step in steps:
        if (self.directory / str(step)).exists():  # not already removed by max_to_keep
          write_digest(self.directory / str(step))

  def restore_newest_good(
      self, abstract_state: Any, check: Callable[[dict, str], None], log: Callable[[str], None]
  ) -> Restored | None:
    """The newest step that passes its digest and restores; None when the run has no
    checkpoint.

    `check(meta, where)` raises for a checkpoint of another model or optimizer (a user error,
    reported as is, never skipped). A step that is damaged is reported by file, moved to
    WORKDIR/bad_checkpoints/, and the next newest is tried; NoGoodCheckpointError if none is.
    """
    problems = []
    for step in sorted(self._mngr.all_steps(), reverse=True):
      where = self.directory / str(step)
      problem = verify_digest(where)
      if problem is None:
        try:
          meta = self.read_meta(step)
        except Exception as e:  # noqa: BLE001  (any failure to read means a damaged step)
          problem = f"{where}/meta: {_first_line(e)}"
      if problem is None:
        check(meta, str(where))
        try:
          restored = self.restore(step, abstract_state)
          if problems:
            log(f"checkpoint: resuming from step {step}, the newest good one")
          return restored
        except Exception as e:  # noqa: BLE001
          problem = f"{where}: cannot be restored: {_first_line(e)}"
      problems.append(f"step {step}: {problem}")
      log(
          f"checkpoint: step {step} is damaged ({problem}); moving it to "
          f"{self.directory.parent / 'bad_checkpoints' / str(step)} and trying the one before"
      )
      self._set_aside(step)
    if problems:
      raise NoGoodCheckpointError(
          f"no good checkpoint in {self.directory} ({'; '.join(problems)}); the damaged steps "
          f"are in {self.directory.parent / 'bad_checkpoints'}. Rerun to start from step 0, "
          "or restore the files from a backup"
      )
    return None

  def _set_aside(self, step: int) -> None:
    if jax.process_index() == 0:
      aside = self.directory.parent / "bad_checkpoints"
      aside.mkdir(parents=True, exist_ok=True)
      target = aside / str(step)
      if target.exists():
        target.rmtree()
      (self.directory / str(step)).rename(target)  # on an object store: a copy of each object
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"bertjax_set_aside_{step}")
    self._mngr.reload()

  def read_meta(self, step: int) -> dict:
    return self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore(self, step: int, abstract_state: Any) -> Restored:
    """`step`, its state placed on the shardings of `abstract_state`."""
    out = self._mngr.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        ),
    )
    return Restored(step, out["state"], out["data"]["processes"], out["meta"])

  def wait(self) -> None:
    """Block until the last async save is complete on disk (and digested)."""
    with self._space_checked(None):
      self._mngr.wait_until_finished()
    self._digest_finished()

  def close(self) -> None:
    self._digest_finished()
    self._mngr.close()


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# ----------------------------------------------------------------------------- pretrained models
