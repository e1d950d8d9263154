"""ELECTRA between bertjax and transformers: the discriminator as `ElectraForPreTraining` (or
`ElectraModel`, the encoder alone) and the generator as `ElectraForMaskedLM`.

A bertjax ELECTRA run (`bertjax.model.electra.ElectraForPreTraining`) is written as two
directories, as google/electra-*-discriminator and -generator are released:
  DIR/            config.json + model.safetensors: `ElectraForPreTraining` (the discriminator)
  DIR/generator/  config.json + model.safetensors: `ElectraForMaskedLM` (the generator)
The embeddings the two networks share are written into both; reading them back, the two copies
must be equal (they are one table in bertjax).

Tensor names: `electra.` + the names of transformers' BERT encoder (`hf_tensors.bert_entries`, whose
layouts this module reuses), plus `electra.embeddings_project` when the embeddings are
factorised, `discriminator_predictions.{dense,dense_prediction}`,
`generator_predictions.{dense,LayerNorm}` and `generator_lm_head` (weight tied to the word
embeddings, bias = bertjax's `generator_bias`). Only BERT's block converts: transformers'
ELECTRA is post-LN with biases and learned positions.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterator

from etils import epath
import numpy as np

from bertjax.interop import hf_tensors
from bertjax.interop.hf_config import (
    ConversionError,
    _HF_ACT,
    config_from_hf,
    config_to_hf,
    hf_architecture,
)
from bertjax.model.config import BertConfig
from bertjax.runtime import fs

Params = dict[str, Any]
GENERATOR_DIR = "generator"  # the generator's directory inside the discriminator's


def is_electra_dir(path: fs.PathLike) -> bool:
  """Whether `path` holds a transformers ELECTRA model (config.json with model_type electra)."""
  cfg_file = fs.path(path) / "config.json"
  if not cfg_file.is_file():
    return False
  try:
    return json.loads(cfg_file.read_text()).get("model_type") == "electra"
  except (json.JSONDecodeError, AttributeError):
    return False


# ------------------------------------------------------------------------------------ configs


def config_from_electra(hf: dict[str, Any], source: str = "config.json") -> BertConfig:
  """A `BertConfig` from a transformers `ElectraConfig` dict (its `embedding_size` kept)."""
  if not isinstance(hf, dict):
    raise ConversionError(f"{source}: a JSON object expected, found {type(hf).__name__}")
  fields = {k: v for k, v in hf.items() if k != "embedding_size"}
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(
        f"{source}: position_embedding_type={hf['position_embedding_type']!r}; only 'absolute'"
    )
  try:
    cfg = config_from_hf(fields)
  except ConversionError as e:
    raise ConversionError(f"{source}: {str(e).removeprefix('config.json: ')}") from e
  embedding = int(hf.get("embedding_size", cfg.hidden_size))
  return cfg.replace(embedding_size=0 if embedding == cfg.hidden_size else embedding)


def config_to_electra(cfg: BertConfig, architecture: str) -> dict[str, Any]:
  """The `config.json` dict that `transformers.ElectraConfig` reads, for `architecture`
  ("ElectraForPreTraining" or "ElectraForMaskedLM")."""
  check_exportable(cfg)
  out = config_to_hf(cfg)  # BERT's fields, which ElectraConfig shares
  out.update(architectures=[architecture], model_type="electra", embedding_size=cfg.embedding_width)
  return out


def check_exportable(cfg: BertConfig) -> None:
  """ConversionError unless transformers' ELECTRA can hold `cfg`: BERT's block."""
  if hf_architecture(cfg) != "bert":
    raise ConversionError(
        f"ELECTRA with norm_placement={cfg.norm_placement!r}: transformers' ELECTRA has BERT's "
        "block only (post-LN, dense MLP, learned positions, biases); keep bertjax's checkpoint"
    )
  if cfg.hidden_act not in _HF_ACT:
    raise ConversionError(f"ELECTRA: hidden_act={cfg.hidden_act!r} has no transformers name")


# ------------------------------------------------------------------------------- tensor table


def _encoder_entries(cfg: BertConfig, ours: str) -> Iterator[hf_tensors.Entry]:
  """The encoder `ours` ("bert" or "generator") as `electra.*` tensors; the shared embeddings
  (always bertjax's "bert/embeddings") and `embeddings_project` when factorised."""
  for path, names, to_ours, to_theirs in hf_tensors.bert_entries(cfg):
    if path[:2] == ("bert", "embeddings") or path[:2] == ("bert", "encoder"):
      if path[1] == "encoder":
        path = (ours,) + path[1:]
      yield path, tuple("electra." + n.removeprefix("bert.") for n in names), to_ours, to_theirs
  if cfg.factorised_embeddings:
    yield from _dense((ours, "embeddings_project"), "electra.embeddings_project")


def _dense(ours: tuple[str, ...], theirs: str) -> Iterator[hf_tensors.Entry]:
  yield ours + ("kernel",), (theirs + ".weight",), hf_tensors.dense_in, hf_tensors.dense_out
  yield ours + ("bias",), (theirs + ".bias",), hf_tensors.same, hf_tensors.one(hf_tensors.same)


def discriminator_entries(cfg: BertConfig) -> Iterator[hf_tensors.Entry]:
  """`ElectraForPreTraining`'s tensors: the encoder and the discriminator head."""
  yield from _encoder_entries(cfg, "bert")
  yield from _dense(("discriminator_predictions", "dense"), "discriminator_predictions.dense")
  yield from _dense(
      ("discriminator_predictions", "dense_prediction"),
      "discriminator_predictions.dense_prediction",
  )


def generator_entries(gen: BertConfig) -> Iterator[hf_tensors.Entry]:
  """`ElectraForMaskedLM`'s tensors (the decoder's weight is the tied word embeddings)."""
  yield from _encoder_entries(gen, "generator")
  yield from _dense(("generator_predictions", "dense"), "generator_predictions.dense")
  yield (
      ("generator_predictions", "layer_norm", "scale"),
      ("generator_predictions.LayerNorm.weight",),
      hf_tensors.same,
      hf_tensors.one(hf_tensors.same),
  )
  yield (
      ("generator_predictions", "layer_norm", "bias"),
      ("generator_predictions.LayerNorm.bias",),
      hf_tensors.same,
      hf_tensors.one(hf_tensors.same),
  )
  yield ("generator_bias",), ("generator_lm_head.bias",), hf_tensors.same, hf_tensors.one(
      hf_tensors.same
  )


def _put(params: Params, path: tuple[str, ...], value: np.ndarray) -> None:
  node = params
  for key in path[:-1]:
    node = node.setdefault(key, {})
  node[path[-1]] = value


def _get(params: Params, path: tuple[str, ...]) -> np.ndarray:
  node = params
  for key in path:
    node = node[key]
  return np.asarray(node, np.float32)


def _read(state, entries, source: str, skip=lambda path: False) -> Params:
  """Our tree from `state` through `entries`; a missing tensor is a ConversionError."""
  params: Params = {}
  if "electra.embeddings.word_embeddings.weight" not in state and any(
      k.startswith("embeddings.") for k in state
  ):  # an ElectraModel saved on its own: no "electra." prefix
    state = {"electra." + k: v for k, v in state.items()}
  for path, names, to_ours, _ in entries:
    if skip(path):
      continue
    missing = [n for n in names if n not in state]
    if missing:
      raise ConversionError(f"{source}: tensor {missing[0]!r} is missing")
    _put(params, path, np.asarray(to_ours(*[np.asarray(state[n], np.float32) for n in names])))
  return params


def to_hf(params: Params, cfg: BertConfig, gen: BertConfig | None) -> tuple[dict, dict | None]:
  """(discriminator tensors, generator tensors or None) for transformers, float32 numpy."""
  from bertjax import model as model_lib

  if any("layers" in params.get(k, {}).get("encoder", {}) for k in ("bert", "generator")):
    params = model_lib.unstack_layer_params(params)

  def write(entries):
    state = {}
    for path, names, _, to_theirs in entries:
      for name, value in zip(names, to_theirs(_get(params, path))):
        state[name] = np.ascontiguousarray(value)
    return state

  disc = write(discriminator_entries(cfg))
  generator = write(generator_entries(gen)) if gen is not None and "generator" in params else None
  return disc, generator


def from_hf(
    state: dict[str, np.ndarray],
    cfg: BertConfig,
    gen_state: dict[str, np.ndarray] | None = None,
    gen: BertConfig | None = None,
    source: str = "checkpoint",
    fresh: list[str] | None = None,
) -> Params:
  """An `ElectraForPreTraining` tree (bertjax's) from transformers' discriminator tensors
  (`ElectraForPreTraining`'s, or `ElectraModel`'s: then the discriminator head is left out and
  named in `fresh`), and the generator's when given. The pooler, which ELECTRA lacks, starts
  fresh under "bert/pooler" (`hf_tensors.fresh_heads`) for the fine-tuning heads that read it."""
  has_head = any(k.startswith("discriminator_predictions.") for k in state)
  params = _read(
      state,
      discriminator_entries(cfg),
      source,
      skip=lambda path: path[0] == "discriminator_predictions" and not has_head,
  )
  if fresh is not None:
    fresh.append("the pooler")
    if not has_head:
      fresh.append("the discriminator head")
  params["bert"]["pooler"] = hf_tensors.fresh_heads(cfg)["pooler"]
  if gen_state is not None:
    gen_source = f"{source}/{GENERATOR_DIR}"
    generated = _read(gen_state, generator_entries(gen), gen_source)
    for name, table in generated["bert"]["embeddings"].items():
      for leaf, value in table.items():
        if not np.array_equal(value, params["bert"]["embeddings"][name][leaf]):
          raise ConversionError(
              f"{gen_source}: its embeddings/{name} differ from the discriminator's; bertjax's "
              "ELECTRA shares one embedding table between the two"
          )
    del generated["bert"]
    params.update(generated)
  return params


# ------------------------------------------------------------------------------- directories


def _read_config(path: epath.Path) -> dict:
  cfg_file = path / "config.json"
  if not cfg_file.exists():
    raise ConversionError(f"{cfg_file}: not found (expected a Hugging Face model directory)")
  try:
    return json.loads(cfg_file.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{cfg_file}:{e.lineno}: invalid JSON ({e.msg})") from e


def load(
    path: fs.PathLike, fresh: list[str] | None = None
) -> tuple[BertConfig, Params, BertConfig | None]:
  """(discriminator config, `ElectraForPreTraining` params, generator config or None) of a
  transformers ELECTRA directory: `ElectraForPreTraining` or `ElectraModel`, with the generator
  (`ElectraForMaskedLM`) read from its `generator/` subdirectory when there is one."""
  path = fs.path(path)
  cfg = config_from_electra(_read_config(path), str(path / "config.json"))
  state = hf_tensors.read_hf_state(path)
  gen_dir = path / GENERATOR_DIR
  gen, gen_state = None, None
  if (gen_dir / "config.json").exists():
    gen = config_from_electra(_read_config(gen_dir), str(gen_dir / "config.json"))
    if gen.embedding_width != cfg.embedding_width or gen.num_layers != cfg.num_layers:
      raise ConversionError(
          f"{gen_dir}: embedding_size {gen.embedding_width} and {gen.num_layers} layers; the "
          f"discriminator's are {cfg.embedding_width} and {cfg.num_layers}: not one ELECTRA"
      )
    gen = gen.replace(embedding_size=cfg.embedding_width)
    gen_state = hf_tensors.read_hf_state(gen_dir)
  params = from_hf(state, cfg, gen_state, gen, source=str(path), fresh=fresh)
  return cfg, params, gen


def load_encoder(path: fs.PathLike, fresh: list[str] | None = None) -> tuple[BertConfig, Params]:
  """`load`'s discriminator config and params (what `convert.load_hf` answers for ELECTRA)."""
  cfg, params, _ = load(path, fresh)
  return cfg, params


def _save_state(state: dict, out: epath.Path) -> None:
  from safetensors.numpy import save_file  # the `interop` extra, only for HF files

  out.mkdir(parents=True, exist_ok=True)
  if fs.is_local(out):
    save_file(state, os.fspath(out / "model.safetensors"), metadata={"format": "pt"})
    return
  with tempfile.TemporaryDirectory(prefix="bertjax-") as tmp:
    local = os.path.join(tmp, "model.safetensors")
    save_file(state, local, metadata={"format": "pt"})
    epath.Path(local).copy(out / "model.safetensors", overwrite=True)


def save(params: Params, cfg: BertConfig, gen: BertConfig | None, path: fs.PathLike) -> list[str]:
  """Write the discriminator into `path` (`ElectraForPreTraining`) and the generator into
  `path/generator` (`ElectraForMaskedLM`); returns the files written, relative to `path`."""
  check_exportable(cfg)
  disc, generator = to_hf(params, cfg, gen)
  path = fs.path(path)
  _save_state(disc, path)
  (path / "config.json").write_text(
      json.dumps(config_to_electra(cfg, "ElectraForPreTraining"), indent=2) + "\n"
  )
  written = ["config.json", "model.safetensors"]
  if generator is not None:
    _save_state(generator, path / GENERATOR_DIR)
    (path / GENERATOR_DIR / "config.json").write_text(
        json.dumps(config_to_electra(gen, "ElectraForMaskedLM"), indent=2) + "\n"
    )
    written += [f"{GENERATOR_DIR}/config.json", f"{GENERATOR_DIR}/model.safetensors"]
  return written
