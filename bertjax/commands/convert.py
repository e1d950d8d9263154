"""`bertjax convert`: move a BERT between Google's TF checkpoints, Hugging Face and bertjax.

  bertjax convert --from google uncased_L-12_H-768_A-12 --to bertjax ckpt/bert_base
  bertjax convert --from google uncased_L-12_H-768_A-12 --to hf hf/bert_base
  bertjax convert --from bertjax runs/demo/pretrained --to hf hf/demo
  bertjax convert --from hf hf/bert_base --to bertjax ckpt/bert_base
  bertjax convert --from bertjax runs/demo/pretrained --to sentence-transformers st/demo

Pretraining heads (MLM, NSP) travel with the encoder, so a converted model can continue
pretraining, but only heads that were trained: a head that started fresh (SRC had none) and no
pretraining step has updated is not written (--to hf writes the class without it:
`BertForMaskedLM`, `BertModel`, `RobertaModel`, `ModernBertModel`; --to google leaves its
variables out; --to bertjax records it), so no reader takes an untrained head for a trained one. A ModernBERT-shaped model (norm_placement "pre", GLU, RoPE, no token types) goes to
and from Hugging Face as `ModernBertForMaskedLM`, which has no pooler or NSP head: they are
dropped on the way out and start fresh on the way in. Google's format is BERT's only. The
tokenizer goes along: `vocab.txt` (WordPiece), `tokenizer.model` (SentencePiece) or
transformers' `tokenizer.json`, with the `tokenizer_config.json` beside it (which of its tokens
are [CLS], [SEP], ...).

An existing DST is refused unless --overwrite. The output is written beside DST under a
temporary name and renamed when complete, so a failed conversion leaves no partial model. SRC,
DST and --tokenizer may be on an object store (gs://): a DST there is written to a local
temporary directory and uploaded when complete (an object store has no rename, so an upload
cut short leaves DST partial: rerun with --overwrite); safetensors reads a local copy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Callable

from bertjax import errors
from bertjax.commands import args as args_lib

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).
# Every path is an `etils.epath.Path` (`bertjax.runtime.fs`): local or any scheme.

SOURCES = ("google", "hf", "bertjax")
TARGETS = ("hf", "bertjax", "google", "sentence-transformers")
_SPECIAL = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def _parser() -> argparse.ArgumentParser:
  p = args_lib.ArgumentParser(prog="bertjax convert", description=__doc__)
  p.add_argument(
      "--from",
      dest="src_kind",
      required=True,
      choices=SOURCES,
      help="format of SRC: google (bert_model.ckpt + bert_config.json), hf "
      "(BertForPreTraining or ModernBertForMaskedLM directory), bertjax (orbax checkpoint)",
  )
  p.add_argument("src", metavar="SRC", help="model directory or checkpoint prefix")
  p.add_argument("--to", dest="dst_kind", required=True, choices=TARGETS, help="format to write")
  p.add_argument("dst", metavar="DST", help="output directory")
  p.add_argument("--overwrite", action="store_true", help="replace an existing DST")
  p.add_argument(
      "--pooling",
      choices=("cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken"),
      help="--to sentence-transformers: the pooling it declares (default: a "
      "sentence-transformers SRC's own, else mean; docs/retrieval.md)",
  )
  p.add_argument(
      "--bert-config",
      help="bert_config.json for --from google (default: the one beside the checkpoint)",
  )
  p.add_argument(
      "--tokenizer",
      "--vocab",
      dest="tokenizer",
      help="tokenizer to record: vocab.txt, a SentencePiece .model or a transformers "
      "tokenizer.json (default: the one found in SRC)",
  )
  p.add_argument(
      "--lower-case",
      choices=("auto", "true", "false"),
      default="auto",
      help="WordPiece only: uncased model? auto reads tokenizer_config.json, else "
      "guesses from the vocab's capitals (default: auto)",
  )
  return p


def _real(p: epath.Path) -> str:
  """`p` absolute, a local one with its symlinks resolved (epath resolves none)."""
  from bertjax.runtime import fs

  return os.path.realpath(p) if fs.is_local(p) else str(p)


def _check_args(args) -> None:
  """Paths and flags, before anything is read or written."""
  from etils import epath

  from bertjax.runtime import fs, outputs

  src, dst = fs.path(args.src), fs.path(args.dst)
  shown_src, shown_dst = epath.Path(args.src), epath.Path(args.dst)  # `~` as typed
  if not (src.exists() or fs.path(f"{src}.index").exists()):
    raise errors.InputNotFoundError(f"SRC {shown_src}: no such file or directory")
  if args.bert_config and args.src_kind != "google":
    raise errors.ConfigError("--bert-config: only for --from google")
  for flag, path in (("--bert-config", args.bert_config), ("--tokenizer", args.tokenizer)):
    if path and not fs.path(path).is_file():
      raise errors.InputNotFoundError(f"{flag} {path}: no such file")
  outputs.refuse_existing(str(shown_dst), args.overwrite, "DST")
  src_dir, out = _real(src if src.is_dir() else src.parent), _real(dst)
  if out == src_dir or src_dir.startswith(out.rstrip("/") + "/"):
    raise errors.ConfigError(
        f"DST {shown_dst} holds SRC {shown_src} — write the conversion elsewhere"
    )


def _find_vocab(src: epath.Path, explicit: str | None, recorded: str | None) -> epath.Path | None:
  from etils import epath

  if explicit:
    return epath.Path(explicit)  # as typed: the tokenizer classes read it through fs
  if recorded:
    return epath.Path(recorded)
  base = src if src.is_dir() else src.parent
  # As the tasks look for them (`encoder._TOKENIZER_FILES`): a converted bertjax model carries
  # its .model and a tokenizer.json made from it; a released one may ship tokenizer.json only.
  for name in ("vocab.txt", "tokenizer.model", "tokenizer.json"):
    if (base / name).is_file():
      return base / name
  return None


def _load(args):
  """(config, params, tokenizer path or None, ELECTRA's generator config or None, the heads that
  never trained) from SRC."""
  from bertjax.interop import convert as convert_lib
  from bertjax.interop import electra as electra_interop
  from bertjax.interop import sentence_transformers as st_lib
  from bertjax.runtime import fs

  src = fs.path(args.src)
  recorded, generator, fresh = None, None, []
  untrained: list[str] = []
  if args.src_kind == "google":
    from bertjax.interop import google_ckpt

    config = args.bert_config
    if not config:
      config = fs.path(google_ckpt.find_checkpoint(src)).parent / google_ckpt.CONFIG_NAME
      if not config.is_file():
        raise errors.InputNotFoundError(
            f"{config}: not found — pass --bert-config, the bert_config.json of this checkpoint"
        )
    cfg, params = google_ckpt.load_google(src, config, fresh=fresh)
  elif args.src_kind == "hf":
    if electra_interop.is_electra_dir(src):  # the discriminator, and DIR/generator if there
      cfg, params, generator = electra_interop.load(src, fresh=fresh)
    else:
      cfg, params = convert_lib.load_hf(src, fresh=fresh)
    if st_lib.is_directory(src):  # sentence-transformers saves only its tokenizer.json
      recorded = st_lib.tokenizer_file(src)
  else:
    from bertjax.tasks import encoder as encoder_lib

    loaded = encoder_lib.load_bertjax(src)
    cfg, params, recorded = loaded.config, loaded.params, loaded.tokenizer_path
    generator = loaded.generator_config
    untrained = list(loaded.untrained_heads)
  if fresh:
    are = "is" if len(fresh) == 1 else "are"
    print(f"{src}: {' and '.join(fresh)} {are} not in the checkpoint: initialised fresh")
    untrained = convert_lib.head_ids(fresh)
  return cfg, params, _find_vocab(src, args.tokenizer, recorded), generator, untrained


def _check_target(args, cfg, generator=None, params=None) -> None:
  """The model fits --to's format: HF takes BERT- and ModernBERT-shaped configs, Google's
  checkpoints BERT's only; ELECTRA (a `generator`) goes to HF with BERT's block."""
  from bertjax.interop import convert as convert_lib
  from bertjax.interop import electra as electra_interop

  if args.pooling and args.dst_kind != "sentence-transformers":
    raise errors.ConfigError("--pooling: only --to sentence-transformers declares a pooling")
  if args.dst_kind == "bertjax":
    return
  if generator is not None or "discriminator_predictions" in (params or {}):
    if args.dst_kind == "google":
      raise errors.ConfigError("--to google: ELECTRA has no Google BERT checkpoint; use --to hf")
    if args.dst_kind == "sentence-transformers":
      raise errors.ConfigError("--to sentence-transformers: not for ELECTRA yet; use --to hf")
    try:
      electra_interop.check_exportable(cfg)
    except convert_lib.ConversionError as e:
      raise errors.ConfigError(f"--to {args.dst_kind}: {e}") from e
    return
  try:
    arch = convert_lib.hf_architecture(cfg)
  except convert_lib.ConversionError as e:
    raise errors.ConfigError(f"--to {args.dst_kind}: {e}") from e
  if args.dst_kind == "google" and arch != "bert":
    raise errors.ConfigError(
        "--to google: a ModernBERT-shaped model has no TF checkpoint format; use --to hf"
    )


def _check_tokenizer(vocab: epath.Path, cfg, lower_case):
  from bertjax.data import wordpiece

  tok = wordpiece.load_tokenizer(vocab, lower_case)
  if tok.vocab_size > cfg.vocab_size:
    raise errors.ConfigError(
        f"{vocab}: {tok.vocab_size} pieces but the model's vocab_size is "
        f"{cfg.vocab_size} — pass the tokenizer this model was trained with (--tokenizer)"
    )
  return tok


def write_hf_tokenizer(tok, dst: epath.Path, max_len: int) -> list[str]:
  """Tokenizer files for `transformers.AutoTokenizer`; returns the names written."""
  from bertjax.data import wordpiece
  from bertjax.runtime import fs

  if isinstance(tok, wordpiece.WordPieceTokenizer):
    fs.path(tok.path).copy(dst / "vocab.txt", overwrite=True)
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": tok.lower_case,
        "tokenize_chinese_chars": True,
        "strip_accents": None,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": True,
        **_SPECIAL,
    }
    (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dst / "special_tokens_map.json").write_text(json.dumps(_SPECIAL, indent=2) + "\n")
    return ["vocab.txt", "tokenizer_config.json", "special_tokens_map.json"]
  if fs.path(tok.path).suffix == ".json":  # transformers' own tokenizer.json: as it came
    written = ["tokenizer.json"]
    fs.path(tok.path).copy(dst / "tokenizer.json", overwrite=True)
    beside = fs.path(tok.path).parent / "tokenizer_config.json"
    if beside.exists():
      beside.copy(dst / beside.name, overwrite=True)
      written.append(beside.name)
    return written
  return _write_hf_sentencepiece(tok, dst, max_len)


def _write_hf_sentencepiece(tok, dst: epath.Path, max_len: int) -> list[str]:
  """A `tokenizer.json` (tokenizers' Unigram) equivalent to the SentencePiece model.

  transformers has no BERT tokenizer class for SentencePiece, so the model is rebuilt with
  transformers' own SentencePiece converter and loads as `PreTrainedTokenizerFast`, which
  adds [CLS]/[SEP] like BertTokenizer. Tests check its ids against SentencePiece's. The
  `.model` file is copied too, for `sentencepiece` users.
  """
  from bertjax.runtime import fs

  fs.path(tok.path).copy(dst / "tokenizer.model", overwrite=True)
  try:
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import SpmConverter
  except ImportError as e:
    print(
        f"convert: warning: {e}; wrote tokenizer.model only (see docs/interop.md)", file=sys.stderr
    )
    return ["tokenizer.model"]
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(fs.path(tok.path).read_bytes())
  backend = SpmConverter.build_tokenizer_from_spm_proto(
      proto, [(p.piece, p.score) for p in proto.pieces]
  )
  if backend is None or proto.trainer_spec.model_type != 1:
    print(
        "convert: warning: only unigram SentencePiece models convert to tokenizer.json; "
        "wrote tokenizer.model only (see docs/interop.md)",
        file=sys.stderr,
    )
    return ["tokenizer.model"]
  backend.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0",
      pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[(p, tok.piece_to_id(p)) for p in ("[CLS]", "[SEP]")],
  )
  fast = PreTrainedTokenizerFast(
      tokenizer_object=backend,
      model_max_length=max_len,
      **_SPECIAL,
      model_input_names=["input_ids", "token_type_ids", "attention_mask"],
  )
  fast.save_pretrained(str(dst))
  return ["tokenizer.model", "tokenizer.json", "tokenizer_config.json"]


def _save(
    args, out: epath.Path, cfg, params, vocab: epath.Path | None, tok, generator=None, untrained=()
) -> str:
  """Write the model in --to's format into `out`; returns what was written. A head in
  `untrained` is never written as if trained: --to hf writes the class without it, --to google
  leaves its variables out, --to bertjax records it."""
  from bertjax.runtime import fs

  electra = "discriminator_predictions" in params or generator is not None
  if args.dst_kind == "hf" and electra:  # the discriminator in DST, the generator in DST/generator
    from bertjax.interop import electra as electra_interop

    written = electra_interop.save(params, cfg, generator, out)
    if tok is not None:
      written += write_hf_tokenizer(tok, out, cfg.max_position_embeddings)
      if generator is not None:  # each directory loads on its own, as google/electra-*'s do
        gen_dir = out / electra_interop.GENERATOR_DIR
        written += [
            f"{electra_interop.GENERATOR_DIR}/{name}"
            for name in write_hf_tokenizer(tok, gen_dir, cfg.max_position_embeddings)
        ]
    return ", ".join(written)
  if args.dst_kind == "sentence-transformers":  # the encoder only, never a head
    from bertjax.interop import sentence_transformers as st_lib
    from bertjax.training import pretrained

    # a contrastive run's pooling, normalisation and prompts: the directory embeds as it did
    trained = pretrained.read_embedding(args.src) if args.src_kind == "bertjax" else None
    head = st_lib.export_head(args.src, args.pooling, trained)
    written = st_lib.save(out, cfg, params, head)
    if tok is not None:
      written += write_hf_tokenizer(tok, out, cfg.max_position_embeddings)
    return ", ".join(written)
  if args.dst_kind == "hf":
    from bertjax.interop import convert as convert_lib

    cls = convert_lib.save_hf(params, cfg, out, untrained)
    written = ["config.json", "model.safetensors"]
    if tok is not None:
      written += write_hf_tokenizer(tok, out, cfg.max_position_embeddings)
    return ", ".join(written) + f" ({cls})"
  if args.dst_kind == "bertjax":
    from bertjax.training import pretrained

    pretrained.save_pretrained(
        str(out),
        cfg,
        params,
        tokenizer_path=str(vocab) if vocab else None,
        step=0,
        generator_config=generator,
        untrained_heads=untrained,
    )
    beside = fs.path(vocab).parent / "tokenizer_config.json" if vocab is not None else None
    if tok is not None and hasattr(tok, "lower_case"):
      # vocab.txt does not say whether the model is uncased; this file beside it does, and
      # `wordpiece.load_tokenizer` reads it (as transformers does).
      (out / "tokenizer_config.json").write_text(
          json.dumps({"do_lower_case": tok.lower_case}) + "\n"
      )
    elif vocab is not None and vocab.suffix == ".json" and beside.exists():
      # which of a tokenizer.json's tokens are [CLS], [SEP], ...: read by `HFTokenizer`
      beside.copy(out / beside.name, overwrite=True)
    return "a bertjax checkpoint"
  from bertjax.interop import google_ckpt

  is_wordpiece = vocab is not None and vocab.suffix == ".txt"
  google_ckpt.save_google(params, cfg, out, vocab if is_wordpiece else None, untrained)
  if vocab is not None and not is_wordpiece:
    fs.path(vocab).copy(out / "tokenizer.model", overwrite=True)
  return f"{google_ckpt.CKPT_NAME}.*, {google_ckpt.CONFIG_NAME}"


def _is_link(path: epath.Path) -> bool:
  from bertjax.runtime import fs

  # epath has no is_symlink; a link is replaced, never followed (local paths only).
  return fs.is_local(path) and os.path.islink(path)


def _remove(path: epath.Path) -> None:
  if path.is_dir() and not _is_link(path):
    path.rmtree()
  elif path.exists() or _is_link(path):
    path.unlink()


def publish(dst: epath.Path, write: Callable[[epath.Path], str]) -> str:
  """`write(tmp)` into a temporary directory beside `dst`, then rename it to `dst` (replacing
  what is there: the caller has applied the overwrite policy). A failure leaves `dst` as it
  was and no temporary directory behind.

  On an object store (no rename) `write` fills a local temporary directory, which is uploaded
  to `dst` when complete, after removing what `dst` held."""
  from bertjax.runtime import fs

  dst = fs.path(dst)
  if not fs.is_local(dst):
    with tempfile.TemporaryDirectory(prefix="bertjax-convert-") as tmp:
      what = write(fs.path(tmp) / dst.name)
      if dst.exists():
        _remove(dst)
      fs.upload_tree(fs.path(tmp) / dst.name, dst)
    return what
  dst.parent.mkdir(parents=True, exist_ok=True)
  tmp = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
  old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
  try:
    what = write(tmp)
    replacing = dst.exists() or _is_link(dst)
    if replacing:
      dst.rename(old)
    try:
      tmp.rename(dst)
    except BaseException:
      if replacing:
        old.rename(dst)
      raise
    if replacing:
      _remove(old)
  finally:
    if tmp.exists() or _is_link(tmp):
      _remove(tmp)
  return what


def main(argv: list[str]) -> int:
  from etils import epath

  from bertjax.runtime import fs

  args = _parser().parse_args(argv)
  _check_args(args)
  lower_case = {"auto": None, "true": True, "false": False}[args.lower_case]
  print(f"convert: reading {args.src_kind} checkpoint {args.src}", flush=True)
  cfg, params, vocab, generator, untrained = _load(args)
  _check_target(args, cfg, generator, params)
  print(
      f"convert: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
      f"vocab {cfg.vocab_size}",
      flush=True,
  )
  electra = generator is not None or "discriminator_predictions" in params
  if (
      args.dst_kind in ("hf", "google") and not electra
  ):  # (sentence-transformers: the encoder alone)
    from bertjax.interop import convert as convert_lib

    full = args.dst_kind == "google" or convert_lib.hf_class(
        cfg, untrained
    ) != convert_lib.hf_class(cfg)
    if untrained and full:
      print(
          f"convert: never trained, so not exported: {', '.join(untrained)} (a reader reports "
          "them missing; pretrain to train them)",
          flush=True,
      )
  tok = None
  if vocab is not None:
    tok = _check_tokenizer(vocab, cfg, lower_case)
    print(f"convert: tokenizer {vocab} ({type(tok).__name__}, {tok.vocab_size} pieces)")
  else:
    print(
        "convert: warning: no tokenizer found in SRC and no --tokenizer; the output has none",
        file=sys.stderr,
    )
  dst = epath.Path(args.dst)  # as typed
  what = publish(
      fs.path(args.dst),
      lambda out: _save(args, out, cfg, params, vocab, tok, generator, untrained),
  )
  print(f"convert: wrote {what} to {dst}")
  return 0
