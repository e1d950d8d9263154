"""The encoder every task starts from (`--init`), and its tokenizer.

`load_encoder(init)` reads any of the places a BERT can come from:
  a `bertjax pretrain` workdir, one of its checkpoints/<step> dirs, or a `save_pretrained` dir
      (`bertjax.training.checkpoint.load_pretrained`; the tokenizer recorded with it),
  a Hugging Face BertForPreTraining dir (config.json + weights; its vocab.txt/tokenizer.model),
  a google-research/bert dir or checkpoint prefix (bert_config.json + bert_model.ckpt.*),
or "random": a randomly initialised preset, the no-pretraining baseline (needs a tokenizer).
A tokenizer path (SentencePiece .model or WordPiece vocab.txt) overrides the recorded one.

Parameters come back as host arrays; `finetuning.Trainer` places them on its mesh, whatever mesh
wrote them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from bertjax import model as model_lib
from bertjax.data import wordpiece
from bertjax.data.tokenizer import Tokenizer
from bertjax.interop import convert, google_ckpt
from bertjax.training import checkpoint


@dataclasses.dataclass
class Encoder:
  """A pretrained encoder ready to fine-tune or to extract features from."""

  config: model_lib.BertConfig
  bert_params: Any  # the "bert" subtree of BertForPreTraining (unscanned); None for random
  tokenizer: Tokenizer
  source: str  # what was restored, for logs and best.json


def read_encoder(path: str | Path) -> tuple[model_lib.BertConfig, Any, str | None, str]:
  """(config, bert params, tokenizer path or None, kind) of a bertjax, Hugging Face or Google
  checkpoint; kind is "bertjax", "hf" or "google"."""
  path = Path(path)
  # A pretrain workdir also has a config.json (the training config) beside checkpoints/.
  if (path / "config.json").is_file() and not (path / "checkpoints").is_dir():
    cfg, params = convert.load_hf(path)
    return cfg, params["bert"], _tokenizer_in(path), "hf"
  if any(path.glob("*.ckpt.index")) or Path(str(path) + ".index").is_file():
    cfg, params = google_ckpt.load_google(path)
    return cfg, params["bert"], _tokenizer_in(path if path.is_dir() else path.parent), "google"
  loaded = checkpoint.load_pretrained(str(path))
  return loaded.config, loaded.params["bert"], loaded.tokenizer_path, "bertjax"


def _tokenizer_in(directory: Path) -> str | None:
  for name in ("vocab.txt", "tokenizer.model"):
    if (directory / name).is_file():
      return str(directory / name)
  return None


def load_encoder(
    init: str,
    tokenizer: str | None = None,
    preset: str = "tiny",
    prefix: str = "glue",
    tokenizer_flag: str = "--tokenizer",
    lower_case: bool | None = None,
) -> Encoder:
  """The encoder and tokenizer behind `--init` (see the module docstring for the kinds).

  `prefix` (the command: "glue", "squad", "ner", "extract") starts the error messages and
  `tokenizer_flag` is the command's flag that overrides the tokenizer; `lower_case` applies to
  WordPiece vocabularies (None: inferred).
  """
  if init == "random":
    if not tokenizer:
      raise ValueError(f"{prefix}: --init random needs {tokenizer_flag} (a .model or vocab.txt)")
    tok = wordpiece.load_tokenizer(tokenizer, lower_case)
    return Encoder(
        model_lib.from_preset(preset, vocab_size=tok.vocab_size), None, tok, f"random:{preset}"
    )
  if not (os.path.exists(init) or os.path.exists(init + ".index")):
    raise FileNotFoundError(f"{prefix}: --init {init}: no such checkpoint or directory")
  cfg, bert_params, tok_path, kind = read_encoder(init)
  tok_path = tokenizer or tok_path
  if not tok_path:
    raise ValueError(
        f"{prefix}: --init {init}: no tokenizer recorded with it or found beside it; "
        f"pass {tokenizer_flag} PATH (.model or vocab.txt)"
    )
  tok = wordpiece.load_tokenizer(tok_path, lower_case)
  if tok.vocab_size > cfg.vocab_size:
    raise ValueError(
        f"{prefix}: tokenizer {tok_path} has {tok.vocab_size} ids but the model's "
        f"vocab_size is {cfg.vocab_size}; pass the tokenizer it was "
        f"pretrained with ({tokenizer_flag})"
    )
  return Encoder(cfg, bert_params, tok, f"{kind}:{init}")
