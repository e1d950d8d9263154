"""Checkpoints: the training run's (orbax CheckpointManager) and standalone pretrained models.

A `bertjax pretrain` workdir:

    WORKDIR/checkpoints/<step>/state   params, optimizer state, step, dropout RNG (orbax, sharded)
    WORKDIR/checkpoints/<step>/data    every process's input-stream position (JSON)
    WORKDIR/checkpoints/<step>/meta    BertConfig, tokenizer file name + sha256, run config,
                                       the objective's record, pair data's prompts (JSON)
    WORKDIR/tokenizer/<file>           the tokenizer the data was prepared with

A `save_pretrained` directory (params only, self-contained, what GLUE and conversion read):

    PATH/pretrained.json  {"format", "step", "tokenizer"}
    PATH/bert_config.json
    PATH/<tokenizer file> (SentencePiece .model or WordPiece vocab .txt)
    PATH/params           orbax, unscanned layout (`encoder/layer_{i}`)

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
import json
import logging
import shutil
from typing import Any, Callable

import errno
from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from bertjax import errors
from bertjax import model as model_lib
from bertjax.runtime import fs
from bertjax.training.digest import DIGEST_NAME, verify_digest, write_digest  # noqa: F401

PRETRAINED_FORMAT = "bertjax-pretrained-1"
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


@dataclasses.dataclass
class Pretrained:
  config: model_lib.BertConfig  # scan_layers=False: params below are unscanned
  params: Any  # BertForPreTraining params, `encoder/layer_{i}` (ElectraForPreTraining's)
  tokenizer_path: str | None  # the tokenizer copy stored with the checkpoint
  step: int
  generator_config: model_lib.BertConfig | None = None  # ELECTRA's generator (unscanned); None:
  #                                                       an MLM model
  # The heads ("mlm", "nsp", "pooler") that never trained: started fresh, updated by no step.
  # `bertjax convert` exports none of them.
  untrained_heads: tuple[str, ...] = ()
  # A contrastive run's embedding as it trained (`embedding`); None for any other checkpoint.
  embedding: dict | None = None


def embedding(meta: dict) -> dict | None:
  """How a step of a contrastive run embeds text: {"pooling", "normalize"} of its
  `config.contrastive` and "prompts", its pair data's non-empty query and document prompts
  ({} for none); None for a step of another objective. `bertjax convert --to
  sentence-transformers` writes it, `embed` and `retrieval --init RUN` apply it."""
  if meta.get("objective") != "contrastive":
    return None
  trained = meta.get("contrastive") or {}
  return {
      "pooling": trained.get("pooling", "mean"),
      "normalize": bool(trained.get("normalize", False)),
      "prompts": dict(meta.get("prompts") or {}),
  }


def untrained_heads(meta: dict) -> tuple[str, ...]:
  """A step's untrained heads: recorded by the loop, or (a checkpoint written before they were
  recorded) what its objective never trains: an MLM run without a pair task, NSP and pooler."""
  if "untrained_heads" in meta:
    return tuple(meta["untrained_heads"] or ())
  pair_mode = ((meta.get("config") or {}).get("data") or {}).get("pair_mode", "nsp")
  if (meta.get("objective") or "mlm") == "mlm" and pair_mode == "none":
    return ("nsp", "pooler")
  return ()


def save_pretrained(
    path: str,
    config: model_lib.BertConfig,
    params: Any,
    tokenizer_path: str | None = None,
    step: int = 0,
    generator_config: model_lib.BertConfig | None = None,
    untrained_heads=(),
) -> None:
  """Write a self-contained params-only checkpoint that `load_pretrained` reads; with
  `generator_config`, ELECTRA's (generator_config.json beside bert_config.json);
  `untrained_heads` recorded in pretrained.json (`Pretrained.untrained_heads`).

  `params` may be scanned or not, sharded or not; they are stored unscanned. The tokenizer
  file (SentencePiece .model or WordPiece vocab .txt) is copied next to them. Every process
  must call this (orbax writes each process's shards); only process 0 writes the JSON files.
  """
  out = absolute(path)
  params = model_lib.unstack_layer_params(params) if config.scan_layers else params
  config = config.replace(scan_layers=False)
  tok_name = fs.path(tokenizer_path).name if tokenizer_path else None
  if jax.process_index() == 0:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bert_config.json").write_text(json.dumps(config.to_dict(), indent=2))
    if generator_config is not None:
      gen = generator_config.replace(scan_layers=False).to_dict()
      (out / "generator_config.json").write_text(json.dumps(gen, indent=2))
    if tokenizer_path:
      fs.path(tokenizer_path).copy(out / tok_name, overwrite=True)
    (out / "pretrained.json").write_text(
        json.dumps(
            {
                "format": PRETRAINED_FORMAT,
                "step": int(step),
                "tokenizer": tok_name,
                "untrained_heads": sorted(untrained_heads),
            },
            indent=2,
        )
    )
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(out / "params", params, force=True)
  ckptr.wait_until_finished()


def _restore_params(directory: epath.Path, shardings: Any | None, subtree: str | None) -> Any:
  """Restore `directory` (an orbax pytree), optionally only `subtree`, as numpy or sharded."""
  ckptr = ocp.PyTreeCheckpointer()
  meta = ckptr.metadata(directory)
  tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
  if subtree:
    tree = {subtree: tree[subtree]}
  if shardings is not None and subtree:
    shardings = {subtree: shardings}

  def target(m, s=None):
    return jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s)

  if shardings is None:
    item = jax.tree.map(target, tree)
    restore_args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  else:
    item = jax.tree.map(target, tree, shardings)
    restore_args = ocp.checkpoint_utils.construct_restore_args(item)
  out = ckptr.restore(
      directory,
      args=ocp.args.PyTreeRestore(
          item=item, restore_args=restore_args, partial_restore=bool(subtree)
      ),
  )
  return out[subtree] if subtree else out


def _resolve(path: epath.Path) -> tuple[str, epath.Path]:
  """('pretrained', dir) or ('step', step dir) for any of the accepted kinds of path."""
  if (path / "pretrained.json").exists():
    return "pretrained", path
  if (path / "state").exists() and (path / "meta").exists():
    return "step", path
  root = path / "checkpoints" if (path / "checkpoints").exists() else path
  steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []
  if not steps:
    raise errors.InputNotFoundError(
        f"{path}: no checkpoint found — expected a `bertjax pretrain` workdir, one of its "
        "checkpoints/<step> dirs, or a save_pretrained dir with pretrained.json"
    )
  problems = []
  for step in reversed(steps):  # the newest step that matches its digest
    problem = verify_digest(root / str(step))
    if problem is None:
      if problems:
        print(f"checkpoint: using step {step} of {root}: " + "; ".join(problems), flush=True)
      return "step", root / str(step)
    problems.append(f"step {step} is damaged ({problem})")
  raise NoGoodCheckpointError(f"{root}: no good checkpoint: " + "; ".join(problems))


def read_config(path: str) -> model_lib.BertConfig:
  """The unscanned BertConfig of what `load_pretrained(path)` would load, without its params."""
  kind, d = _resolve(absolute(path))
  if kind == "pretrained":
    cfg = model_lib.BertConfig.from_dict(json.loads((d / "bert_config.json").read_text()))
  else:
    meta = json.loads((d / "meta" / "metadata").read_text())
    cfg = model_lib.BertConfig.from_dict(meta["bert_config"])
  return cfg.replace(scan_layers=False)


def read_tokenizer(path: str) -> str | None:
  """The tokenizer file of what `load_pretrained(path)` would load, without its params."""
  kind, d = _resolve(absolute(path))
  if kind == "pretrained":
    tok = json.loads((d / "pretrained.json").read_text()).get("tokenizer")
    return str(d / tok) if tok else None
  tok = json.loads((d / "meta" / "metadata").read_text()).get("tokenizer")
  return str(d.parent.parent / tok) if tok else None


def read_generator_config(path: str) -> model_lib.BertConfig | None:
  """ELECTRA's generator config of what `load_pretrained(path)` would load (None: an MLM
  model), without its params."""
  kind, d = _resolve(absolute(path))
  if kind == "pretrained":
    f = d / "generator_config.json"
    return model_lib.BertConfig.from_dict(json.loads(f.read_text())) if f.exists() else None
  gen = json.loads((d / "meta" / "metadata").read_text()).get("generator_config")
  return model_lib.BertConfig.from_dict(gen).replace(scan_layers=False) if gen else None


def read_embedding(path: str) -> dict | None:
  """`Pretrained.embedding` of what `load_pretrained(path)` would load, without its params;
  None for a `save_pretrained` directory, which keeps no run record."""
  kind, d = _resolve(absolute(path))
  if kind == "pretrained":
    return None
  return embedding(json.loads((d / "meta" / "metadata").read_text()))


def read_untrained_heads(path: str) -> tuple[str, ...]:
  """`Pretrained.untrained_heads` of what `load_pretrained(path)` would load, without its params."""
  kind, d = _resolve(absolute(path))
  if kind == "pretrained":
    return tuple(json.loads((d / "pretrained.json").read_text()).get("untrained_heads") or ())
  return untrained_heads(json.loads((d / "meta" / "metadata").read_text()))


def load_pretrained(path: str, shardings: Any | None = None) -> Pretrained:
  """Read a workdir (latest complete step), one step dir, or a `save_pretrained` dir.

  `shardings`: a tree of `jax.sharding.Sharding` matching the *unscanned* params to restore
  onto (any mesh: arrays are resharded on read), or None for host numpy arrays, which any
  later `jit` or `device_put` places where it needs them.
  """
  kind, d = _resolve(absolute(path))
  if kind == "pretrained":
    info = json.loads((d / "pretrained.json").read_text())
    cfg = model_lib.BertConfig.from_dict(json.loads((d / "bert_config.json").read_text()))
    params = _restore_params(d / "params", shardings, None)
    tok = str(d / info["tokenizer"]) if info.get("tokenizer") else None
    gen_file = d / "generator_config.json"
    gen = (
        model_lib.BertConfig.from_dict(json.loads(gen_file.read_text()))
        if gen_file.exists()
        else None
    )
    untrained = tuple(info.get("untrained_heads") or ())
    return Pretrained(cfg, params, tok, int(info.get("step", 0)), gen, untrained)
  meta = json.loads((d / "meta" / "metadata").read_text())
  cfg = model_lib.BertConfig.from_dict(meta["bert_config"])
  if cfg.scan_layers:  # stored stacked: restore on the host, unstack, then place
    params = model_lib.unstack_layer_params(_restore_params(d / "state", None, "params"))
    if shardings is not None:
      params = jax.device_put(params, shardings)
  else:
    params = _restore_params(d / "state", shardings, "params")
  if not {"mlm_transform", "discriminator_predictions"} & set(params):  # the encoder alone
    # (a contrastive run's): BERT's heads fresh, untrained, as `untrained_heads` says
    from bertjax.interop import hf_tensors

    heads = hf_tensors.fresh_heads(cfg)
    pooler = heads.pop("pooler")
    params = dict(heads, bert=dict(params["bert"], pooler=pooler))
  tok = meta.get("tokenizer")
  tok_path = str(d.parent.parent / tok) if tok else None
  gen = meta.get("generator_config")
  gen = model_lib.BertConfig.from_dict(gen).replace(scan_layers=False) if gen else None
  return Pretrained(
      cfg.replace(scan_layers=False),
      params,
      tok_path,
      int(meta["step"]),
      gen,
      untrained_heads(meta),
      embedding(meta),
  )
