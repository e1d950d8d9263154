"""The encoder every task starts from, and its tokenizer.

`load_encoder(init)` reads any of the places a BERT can come from:
  a `bertjax pretrain` workdir, one of its checkpoints/<step> dirs, or a `save_pretrained` dir
      (`bertjax.training.pretrained.load_pretrained`; the tokenizer recorded with it; of an
      ELECTRA run, the discriminator's encoder, its pooler fresh; of a contrastive run, in
      `sentence`, the pooling, normalisation and prompts it trained with, as its export),
  a Hugging Face BertForPreTraining or ModernBertForMaskedLM dir (config.json + weights; its
      vocab.txt, tokenizer.model or, as ModernBERT ships, tokenizer.json), or an ELECTRA one
      (ElectraForPreTraining / ElectraModel: the discriminator's encoder),
  a sentence-transformers dir (modules.json: its Transformer read as a Hugging Face dir, with
      its tokenizer.json; its pooling, Dense, Normalize, length and prompts in `sentence`),
  a google-research/bert dir or checkpoint prefix (bert_config.json + bert_model.ckpt.*),
or "random": the no-pretraining baseline, fresh weights of a preset (a tokenizer needed) or of
    a checkpoint's own architecture (`preset` its path; its tokenizer unless one is given).
A tokenizer path (SentencePiece .model, WordPiece vocab.txt or Hugging Face tokenizer.json)
overrides the recorded one.

The model keeps its own config: a ModernBERT-shaped one (no token types) ignores the token
types every task passes, and its pooler, which ModernBERT lacks, starts fresh like a task head.

Parameters come back as host arrays; `finetuning.Trainer` places them on its mesh, whatever mesh
wrote them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from etils import epath

from bertjax import errors
from bertjax import model as model_lib
from bertjax.data import wordpiece
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.tokenizer import Tokenizer
from bertjax.interop import convert, google_ckpt
from bertjax.interop import sentence_transformers as st_lib
from bertjax.runtime import fs
from bertjax.training import pretrained

BERTJAX_KINDS = (
    "a `bertjax pretrain` workdir (or one of its checkpoints/<step>) or a save_pretrained dir"
)
KINDS = "a `bertjax pretrain` workdir or save_pretrained dir, a Hugging Face or a Google BERT dir"
TOKENIZER_KINDS = "a SentencePiece .model, a WordPiece vocab.txt or a Hugging Face tokenizer.json"
# Looked for beside a Hugging Face or Google checkpoint, in this order: a converted bertjax model
# carries its .model and a tokenizer.json made from it, and the .model is the one it was
# trained with.
_TOKENIZER_FILES = ("vocab.txt", "tokenizer.model", "tokenizer.json")


@dataclasses.dataclass
class Encoder:
  """A pretrained encoder ready to fine-tune or to extract features from."""

  config: model_lib.BertConfig
  bert_params: Any  # the "bert" subtree of BertForPreTraining (unscanned); None for random
  tokenizer: Tokenizer
  source: str  # what was restored, for logs and best.json
  # what a sentence-transformers directory declares (pooling, length, prompts), or a bertjax
  # contrastive run (its pooling, normalisation, prompts); None otherwise
  sentence: st_lib.SentenceHead | None = None


def checkpoint_kind(path: fs.PathLike) -> str | None:
  """ "bertjax", "hf" or "google" by the files at `path` (any scheme `fs` opens); None when it
  holds no checkpoint."""
  path = fs.path(path)
  if st_lib.is_directory(path):
    return "hf"
  # A pretrain workdir also has a config.json (the training config) beside checkpoints/.
  if (path / "config.json").is_file() and not (path / "checkpoints").is_dir():
    return "hf"
  if any(path.glob("*.ckpt.index")) or fs.path(f"{path}.index").is_file():
    return "google"
  if path.is_dir() and (
      (path / "pretrained.json").is_file()
      or (path / "state").is_dir()
      or (path / "checkpoints").is_dir()
      or any(p.name.isdigit() for p in path.iterdir())
  ):
    return "bertjax"
  return None


def _random_encoder(preset: str, tokenizer: str | None, lower_case, n) -> Encoder:
  """`load_encoder("random", ...)`: a preset's shape, or the architecture of the checkpoint at
  `preset` (its config only: the weights start fresh, seeded by the run, like a preset's)."""
  tok_kinds = TOKENIZER_KINDS
  if preset in model_lib.PRESETS:
    if not tokenizer:
      raise errors.ConfigError(
          f"{n['init']} random needs {n['tokenizer']}: a random model has no tokenizer — "
          f"pass {n['tokenizer']} PATH ({tok_kinds})"
      )
    tok = load_tokenizer(tokenizer, lower_case)
    return Encoder(
        model_lib.from_preset(preset, vocab_size=tok.vocab_size), None, tok, f"random:{preset}"
    )
  if not (fs.path(preset).exists() and checkpoint_kind(preset) is not None):
    raise errors.ConfigError(
        f"{n['preset']} {preset!r} is neither a model preset nor a checkpoint — valid: "
        f"{', '.join(model_lib.PRESETS)}, or a checkpoint whose architecture to take ({KINDS})"
    )
  cfg, _, recorded, _ = read_encoder(preset)
  tok = _checkpoint_tokenizer(cfg, tokenizer or recorded, f"{n['preset']} {preset}", n, lower_case)
  return Encoder(cfg, None, tok, f"random:{preset}")


def _checkpoint_tokenizer(cfg, tok_path: str | None, what: str, n, lower_case) -> Tokenizer:
  """The tokenizer at `tok_path` (given, or recorded with the checkpoint `what` names), which
  must fit the model's vocabulary."""
  if not tok_path:
    raise errors.ConfigError(
        f"{what}: no tokenizer recorded with it or found beside it — pass "
        f"{n['tokenizer']} PATH ({TOKENIZER_KINDS})"
    )
  tok = load_tokenizer(tok_path, lower_case)
  if tok.vocab_size > cfg.vocab_size:
    raise errors.ConfigError(
        f"{n['tokenizer']} {tok_path} has {tok.vocab_size} ids but the model's vocab_size is "
        f"{cfg.vocab_size} — pass the tokenizer it was pretrained with"
    )
  if cfg.position_offset and cfg.norm_placement == "post":  # RoBERTa's, XLM-R's network
    tok.pair_separators = 2  # pairs as their tokenizers frame them: <s> A </s></s> B </s>
  return tok


def read_encoder(
    path: fs.PathLike, fresh: list[str] | None = None
) -> tuple[model_lib.BertConfig, Any, str | None, str]:
  """(config, bert params, tokenizer path or None, kind) of a bertjax, Hugging Face or Google
  checkpoint; kind is "bertjax", "hf" or "google". A Hugging Face directory's heads that start
  fresh are named in `fresh` (`convert.load_hf`). A remote Hugging Face or Google checkpoint
  is read by `convert` and `google_ckpt`, which copy its weight files locally."""
  cfg, bert_params, tok, kind, _ = _read(path, fresh)
  return cfg, bert_params, tok, kind


def _read(path: fs.PathLike, fresh: list[str] | None):
  """`read_encoder`'s, and the `SentenceHead` the checkpoint declares: a sentence-transformers
  directory's, or a bertjax contrastive run's (the pooling, normalisation and prompts it
  trained with, as `convert --to sentence-transformers` writes them); None otherwise."""
  path = fs.path(path)
  kind = checkpoint_kind(path)
  if kind == "hf":
    cfg, params = convert.load_hf(path, fresh=fresh)
    tok = st_lib.tokenizer_file(path) or _tokenizer_in(st_lib.transformer_dir(path))
    head = st_lib.read_head(path) if st_lib.is_directory(path) else None
    return cfg, params["bert"], tok, "hf", head
  if kind == "google":
    cfg, params = google_ckpt.load_google(path)
    tok = _tokenizer_in(path if path.is_dir() else path.parent)
    return cfg, params["bert"], tok, "google", None
  loaded = load_bertjax(path)
  bert_params = loaded.params["bert"]
  if "pooler" not in bert_params:  # an ELECTRA run: its discriminator was never pooled
    bert_params = dict(bert_params, pooler=convert._fresh_heads(loaded.config)["pooler"])
    if fresh is not None:
      fresh.append("the pooler")
  head = st_lib.trained_head(loaded.embedding) if loaded.embedding else None
  return loaded.config, bert_params, loaded.tokenizer_path, "bertjax", head


def load_bertjax(path: fs.PathLike) -> pretrained.Pretrained:
  """`pretrained.load_pretrained`, with a path that holds no bertjax checkpoint refused first,
  naming it."""
  shown = epath.Path(path)  # as the caller spelt it
  path = fs.path(path)
  if not path.exists():
    raise errors.InputNotFoundError(f"{shown}: no such checkpoint or directory")
  if checkpoint_kind(path) != "bertjax":
    raise errors.BadInputError(f"{shown}: not a bertjax checkpoint — expected {BERTJAX_KINDS}")
  return pretrained.load_pretrained(str(path))


def _tokenizer_in(directory: epath.Path) -> str | None:
  for name in _TOKENIZER_FILES:
    if (directory / name).is_file():
      return str(directory / name)
  return None


def load_tokenizer(path: fs.PathLike, lower_case: bool | None = None) -> Tokenizer:
  """`wordpiece.load_tokenizer`, and a Hugging Face tokenizer.json (`tokenizer.HFTokenizer`)."""
  if epath.Path(path).suffix == ".json":
    return tokenizer_lib.HFTokenizer(path)
  return wordpiece.load_tokenizer(path, lower_case)


def load_encoder(
    init: str,
    tokenizer: str | None = None,
    preset: str = "tiny",
    *,
    lower_case: bool | None = None,
    names: Mapping[str, str] | None = None,
    prefix: str | None = None,
) -> Encoder:
  """The encoder and tokenizer behind `init` (see the module docstring for the kinds).

  `lower_case` applies to WordPiece vocabularies (None: inferred). Messages name the arguments
  `init`, `tokenizer` and `preset`; `names` renames them for the caller (a command passes its
  flags, {"init": "--init", "tokenizer": "--vocab"}). `prefix` is accepted from older callers
  and unused: the command line prefixes every message with the command's name.
  """
  del prefix
  n = {"init": "init", "tokenizer": "tokenizer", "preset": "preset", **(names or {})}
  tok_kinds = TOKENIZER_KINDS
  if tokenizer and not fs.path(tokenizer).exists():
    raise errors.InputNotFoundError(
        f"{n['tokenizer']} {tokenizer}: no such file — pass {tok_kinds}"
    )
  if init == "random":
    return _random_encoder(preset, tokenizer, lower_case, n)
  if not (fs.path(init).exists() or fs.path(init + ".index").exists()):
    raise errors.InputNotFoundError(
        f"{n['init']} {init}: no such checkpoint or directory — pass {KINDS} (or 'random')"
    )
  if checkpoint_kind(init) is None:
    raise errors.BadInputError(f"{n['init']} {init}: not a checkpoint — expected {KINDS}")
  fresh: list[str] = []
  cfg, bert_params, recorded, kind, sentence = _read(init, fresh)
  if "the pooler" in fresh:  # a BertForMaskedLM or a ModernBERT: a head's input starts fresh
    print(f"{n['init']} {init}: has no pooler; it starts fresh, like the task's head", flush=True)
  tok = _checkpoint_tokenizer(cfg, tokenizer or recorded, f"{n['init']} {init}", n, lower_case)
  return Encoder(cfg, bert_params, tok, f"{kind}:{init}", sentence)
