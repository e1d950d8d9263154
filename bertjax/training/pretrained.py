"""Standalone pretrained models: `save_pretrained` and the readers of any checkpoint.

What the tasks, `--init`, conversion and the experiments read, from any of: a `bertjax
pretrain` workdir (its newest step whose digest holds), one of its `checkpoints/<step>`
directories, or a `save_pretrained` directory:

    PATH/pretrained.json  {"format", "step", "tokenizer", "untrained_heads"}
    PATH/bert_config.json (and generator_config.json for ELECTRA)
    PATH/<tokenizer file> (SentencePiece .model or WordPiece vocab .txt)
    PATH/params           orbax, unscanned layout (`encoder/layer_{i}`)

The training run's own checkpoints (the orbax manager, digests, resume) are
`bertjax.training.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import errors
from bertjax import model as model_lib
from bertjax.runtime import fs
from bertjax.training.checkpoint import NoGoodCheckpointError, absolute
from bertjax.training.digest import verify_digest

PRETRAINED_FORMAT = "bertjax-pretrained-1"


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
  trained = meta["contrastive"]  # the objective's record: every contrastive step holds it
  return {
      "pooling": trained["pooling"],
      "normalize": bool(trained["normalize"]),
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
