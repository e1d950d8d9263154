"""Checkpoints: the training run's (orbax CheckpointManager) and standalone pretrained models.

A `bertjax pretrain` workdir:

    WORKDIR/checkpoints/<step>/state   params, optimizer state, step, dropout RNG (orbax, sharded)
    WORKDIR/checkpoints/<step>/data    every process's input-stream position (JSON)
    WORKDIR/checkpoints/<step>/meta    BertConfig, tokenizer file name + sha256, run config (JSON)
    WORKDIR/tokenizer/<file>           the tokenizer the data was prepared with

A `save_pretrained` directory (params only, self-contained, what GLUE and conversion read):

    PATH/pretrained.json  {"format", "step", "tokenizer"}
    PATH/bert_config.json
    PATH/<tokenizer file> (SentencePiece .model or WordPiece vocab .txt)
    PATH/params           orbax, unscanned layout (`encoder/layer_{i}`)

Orbax writes each step to a temporary directory and renames it when complete, so a process
killed mid-save leaves no half checkpoint behind; restores read only complete steps. Arrays
are restored onto the shardings asked for, whatever mesh wrote them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bertjax import model as model_lib

PRETRAINED_FORMAT = "bertjax-pretrained-1"
# BertConfig fields that decide the parameter shapes; a resume must agree on all of them.
ARCH_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size", "scan_layers")


def absolute(path: str | epath.Path) -> epath.Path:
  """`path` made absolute when it is local (orbax mis-reads relative paths; gs:// stays)."""
  path = str(path)
  return epath.Path(path if "://" in path else os.path.abspath(os.path.expanduser(path)))


class CheckpointMismatchError(ValueError):
  """A checkpoint whose model or optimizer differs from the config trying to restore it."""


def check_compatible(saved: dict, current: model_lib.BertConfig, where: str,
                     saved_optimizer: str | None = None, optimizer: str | None = None) -> None:
  """Raise, naming the first differing field, instead of ever restoring partially."""
  for field in ARCH_FIELDS:
    old, new = saved.get(field), getattr(current, field)
    if old != new:
      raise CheckpointMismatchError(
          f"{where} was written with config.model.{field}={old!r} but the config now has "
          f"{new!r}; use the original value, or a new --workdir (or --config.train.init_from "
          f"to start a new run from its weights)")
  if saved_optimizer and optimizer and saved_optimizer != optimizer:
    raise CheckpointMismatchError(
        f"{where} was written with config.train.optimizer={saved_optimizer!r} but the config now "
        f"has {optimizer!r}; its optimizer state cannot be reused: use a new --workdir with "
        f"--config.train.init_from={where}")


# ----------------------------------------------------------------------------- training runs


class Manager:
  """Async orbax checkpoints of the train state, data position and metadata of one run."""

  def __init__(self, workdir: str, every_steps: int, max_to_keep: int | None = 3,
               keep_period: int | None = None, async_save: bool = True):
    self.directory = absolute(workdir) / "checkpoints"
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=max(1, every_steps), max_to_keep=max_to_keep,
        keep_period=keep_period, enable_async_checkpointing=async_save, create=True)
    self._mngr = ocp.CheckpointManager(self.directory, options=options,
                                       item_names=("state", "data", "meta"))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, step: int, state: Any, data_states: list | None, meta: dict,
           force: bool = False) -> bool:
    """Start saving (returns at once when async); False if the interval says not yet."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              data=ocp.args.JsonSave({"processes": data_states}),
                              meta=ocp.args.JsonSave(meta))
    return self._mngr.save(step, args=args, force=force)

  def read_meta(self, step: int) -> dict:
    return self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, list | None, dict]:
    """(state on the shardings of `abstract_state`, data states per process, meta)."""
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    return out["state"], out["data"]["processes"], out["meta"]

  def wait(self) -> None:
    """Block until the last async save is complete on disk."""
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.close()


def gather_json(obj: Any) -> list:
  """Every process's JSON-serialisable `obj`, in process order (a collective: all must call)."""
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils

  raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  lengths = multihost_utils.process_allgather(np.asarray([raw.size], np.int32))
  padded = np.zeros(int(np.max(lengths)), np.uint8)
  padded[:raw.size] = raw
  allb = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(allb[i][:int(lengths[i][0])]).decode())
          for i in range(jax.process_count())]


# ----------------------------------------------------------------------------- pretrained models


@dataclasses.dataclass
class Pretrained:
  config: model_lib.BertConfig  # scan_layers=False: params below are unscanned
  params: Any  # BertForPreTraining params, `encoder/layer_{i}`
  tokenizer_path: str | None  # the tokenizer copy stored with the checkpoint
  step: int


def save_pretrained(path: str, config: model_lib.BertConfig, params: Any,
                    tokenizer_path: str | None = None, step: int = 0) -> None:
  """Write a self-contained params-only checkpoint that `load_pretrained` reads.

  `params` may be scanned or not, sharded or not; they are stored unscanned. The tokenizer
  file (SentencePiece .model or WordPiece vocab .txt) is copied next to them. Every process
  must call this (orbax writes each process's shards); only process 0 writes the JSON files.
  """
  out = absolute(path)
  params = model_lib.unstack_layer_params(params) if config.scan_layers else params
  config = config.replace(scan_layers=False)
  tok_name = epath.Path(tokenizer_path).name if tokenizer_path else None
  if jax.process_index() == 0:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bert_config.json").write_text(json.dumps(config.to_dict(), indent=2))
    if tokenizer_path:
      epath.Path(tokenizer_path).copy(out / tok_name, overwrite=True)
    (out / "pretrained.json").write_text(json.dumps(
        {"format": PRETRAINED_FORMAT, "step": int(step), "tokenizer": tok_name}, indent=2))
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
  out = ckptr.restore(directory, args=ocp.args.PyTreeRestore(
      item=item, restore_args=restore_args, partial_restore=bool(subtree)))
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
    raise FileNotFoundError(f"{path}: no checkpoint found (expected a `bertjax pretrain` "
                            "workdir, one of its checkpoints/<step> dirs, or a save_pretrained "
                            "dir with pretrained.json)")
  return "step", root / str(steps[-1])


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
    return Pretrained(cfg, params, tok, int(info.get("step", 0)))
  meta = json.loads((d / "meta" / "metadata").read_text())
  cfg = model_lib.BertConfig.from_dict(meta["bert_config"])
  if cfg.scan_layers:  # stored stacked: restore on the host, unstack, then place
    params = model_lib.unstack_layer_params(_restore_params(d / "state", None, "params"))
    if shardings is not None:
      params = jax.device_put(params, shardings)
  else:
    params = _restore_params(d / "state", shardings, "params")
  tok = meta.get("tokenizer")
  tok_path = str(d.parent.parent / tok) if tok else None
  return Pretrained(cfg.replace(scan_layers=False), params, tok_path, int(meta["step"]))
