"""The encoder to fine-tune, from any of the places a BERT can come from.

`--init` is read by `bertjax.features.load_encoder` (shared with `bertjax extract`):
  a `bertjax pretrain` workdir, one of its checkpoints/<step> dirs, or a `save_pretrained` dir
      (bertjax.checkpoint.load_pretrained; the tokenizer recorded with it),
  a Hugging Face BertForPreTraining dir (config.json + weights; its vocab.txt/tokenizer.model),
  a google-research/bert dir or checkpoint prefix (bert_config.json + bert_model.ckpt.*),
or is "random": a randomly initialised preset, the no-pretraining baseline (needs --tokenizer).
`--tokenizer PATH` (SentencePiece .model or WordPiece vocab.txt) overrides the tokenizer.

Parameters come back as host arrays; `finetuning.Trainer` places them on its mesh, whatever mesh
wrote them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from bertjax import model as model_lib


@dataclasses.dataclass
class Encoder:
  """A pretrained encoder ready to fine-tune."""

  config: model_lib.BertConfig
  bert_params: Any  # the "bert" subtree of BertForPreTraining (unscanned); None for random
  tokenizer: Any  # .encode(text) -> ids (SentencePiece or WordPiece)
  source: str  # what was restored, for logs and best.json


def load_encoder(init: str, tokenizer: str | None = None, preset: str = "tiny",
                 prefix: str = "glue") -> Encoder:
  """The encoder and tokenizer behind `--init` (see the module docstring for the kinds);
  `prefix` (the command: "glue", "squad", "ner") starts the error messages."""
  from bertjax import features as features_lib, wordpiece

  if init == "random":
    if not tokenizer:
      raise ValueError(f"{prefix}: --init random needs --tokenizer (a .model or vocab.txt)")
    tok = wordpiece.load_tokenizer(tokenizer)
    return Encoder(model_lib.from_preset(preset, vocab_size=tok.vocab_size), None, tok,
                   f"random:{preset}")
  if not (os.path.exists(init) or os.path.exists(init + ".index")):
    raise FileNotFoundError(f"{prefix}: --init {init}: no such checkpoint or directory")
  enc = features_lib.load_encoder(init)
  tok_path = tokenizer or enc.tokenizer_path
  if not tok_path:
    raise ValueError(f"{prefix}: --init {init}: no tokenizer recorded with it or found beside it; "
                     "pass --tokenizer PATH (.model or vocab.txt)")
  tok = wordpiece.load_tokenizer(tok_path)
  if tok.vocab_size > enc.config.vocab_size:
    raise ValueError(f"{prefix}: tokenizer {tok_path} has {tok.vocab_size} ids but the model's "
                     f"vocab_size is {enc.config.vocab_size}; pass the tokenizer it was "
                     "pretrained with (--tokenizer)")
  return Encoder(enc.config, enc.bert_params, tok, f"{enc.source}:{init}")
