"""`bertjax convert`: move a BERT between Google's TF checkpoints, Hugging Face and bertjax.

  bertjax convert --from google uncased_L-12_H-768_A-12 --to bertjax ckpt/bert_base
  bertjax convert --from google uncased_L-12_H-768_A-12 --to hf hf/bert_base
  bertjax convert --from bertjax runs/demo/pretrained --to hf hf/demo
  bertjax convert --from hf hf/bert_base --to bertjax ckpt/bert_base

Pretraining heads (MLM, NSP) travel with the encoder, so a converted model can continue
pretraining. The tokenizer goes along: `vocab.txt` (WordPiece) or `tokenizer.model`
(SentencePiece).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from bertjax.commands.args import HelpFormatter

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

SOURCES = ("google", "hf", "bertjax")
TARGETS = ("hf", "bertjax", "google")
_SPECIAL = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="bertjax convert", description=__doc__, formatter_class=HelpFormatter
  )
  p.add_argument(
      "--from",
      dest="src_kind",
      required=True,
      choices=SOURCES,
      help="format of SRC: google (bert_model.ckpt + bert_config.json), hf "
      "(BertForPreTraining directory), bertjax (orbax checkpoint)",
  )
  p.add_argument("src", metavar="SRC", help="model directory or checkpoint prefix")
  p.add_argument("--to", dest="dst_kind", required=True, choices=TARGETS, help="format to write")
  p.add_argument("dst", metavar="DST", help="output directory")
  p.add_argument(
      "--bert-config",
      help="bert_config.json for --from google " "(default: the one beside the checkpoint)",
  )
  p.add_argument(
      "--vocab",
      help="tokenizer to record: vocab.txt or a SentencePiece .model "
      "(default: the one found in SRC)",
  )
  p.add_argument(
      "--lower-case",
      choices=("auto", "true", "false"),
      default="auto",
      help="WordPiece only: uncased model? auto reads tokenizer_config.json, else "
      "guesses from the vocab's capitals (default: auto)",
  )
  return p


def _find_vocab(kind: str, src: Path, explicit: str | None, recorded: str | None) -> Path | None:
  if explicit:
    path = Path(explicit)
    if not path.is_file():
      raise FileNotFoundError(f"--vocab {path}: no such file")
    return path
  if recorded:
    return Path(recorded)
  base = src if src.is_dir() else src.parent
  for name in ("vocab.txt", "tokenizer.model"):
    if (base / name).is_file():
      return base / name
  return None


def _load(args):
  """(config, params, tokenizer path or None) from SRC."""
  from bertjax.interop import convert as convert_lib

  src = Path(args.src)
  recorded = None
  if args.src_kind == "google":
    from bertjax.interop import google_ckpt

    cfg, params = google_ckpt.load_google(src, args.bert_config)
  elif args.src_kind == "hf":
    cfg, params = convert_lib.load_hf(src)
  elif args.src_kind == "bertjax":
    from bertjax.training import checkpoint

    loaded = checkpoint.load_pretrained(src)
    cfg, params, recorded = loaded.config, loaded.params, loaded.tokenizer_path
  else:
    raise ValueError(f"--from {args.src_kind!r}; valid: {', '.join(SOURCES)}")
  return cfg, params, _find_vocab(args.src_kind, src, args.vocab, recorded)


def _check_tokenizer(vocab: Path, cfg, lower_case):
  from bertjax.data import wordpiece

  tok = wordpiece.load_tokenizer(vocab, lower_case)
  if tok.vocab_size > cfg.vocab_size:
    raise ValueError(
        f"{vocab}: {tok.vocab_size} pieces but the model's vocab_size is "
        f"{cfg.vocab_size}; pass the tokenizer this model was trained with (--vocab)"
    )
  return tok


def write_hf_tokenizer(tok, dst: Path, max_len: int) -> list[str]:
  """Tokenizer files for `transformers.AutoTokenizer`; returns the names written."""
  from bertjax.data import wordpiece

  if isinstance(tok, wordpiece.WordPieceTokenizer):
    shutil.copyfile(tok.path, dst / "vocab.txt")
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
  return _write_hf_sentencepiece(tok, dst, max_len)


def _write_hf_sentencepiece(tok, dst: Path, max_len: int) -> list[str]:
  """A `tokenizer.json` (tokenizers' Unigram) equivalent to the SentencePiece model.

  transformers has no BERT tokenizer class for SentencePiece, so the model is rebuilt with
  transformers' own SentencePiece converter and loads as `PreTrainedTokenizerFast`, which
  adds [CLS]/[SEP] like BertTokenizer. Tests check its ids against SentencePiece's. The
  `.model` file is copied too, for `sentencepiece` users.
  """
  shutil.copyfile(tok.path, dst / "tokenizer.model")
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
  proto.ParseFromString(Path(tok.path).read_bytes())
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


def _save(args, cfg, params, vocab: Path | None, tok) -> None:
  dst = Path(args.dst)
  if args.dst_kind == "hf":
    from bertjax.interop import convert as convert_lib

    convert_lib.save_hf(params, cfg, dst)
    written = ["config.json", "model.safetensors"]
    if tok is not None:
      written += write_hf_tokenizer(tok, dst, cfg.max_position_embeddings)
    print(f"convert: wrote {', '.join(written)} to {dst}")
  elif args.dst_kind == "bertjax":
    from bertjax.training import checkpoint

    checkpoint.save_pretrained(
        dst, cfg, params, tokenizer_path=str(vocab) if vocab else None, step=0
    )
    if tok is not None and hasattr(tok, "lower_case"):
      # vocab.txt does not say whether the model is uncased; this file beside it does, and
      # `wordpiece.load_tokenizer` reads it (as transformers does).
      (dst / "tokenizer_config.json").write_text(
          json.dumps({"do_lower_case": tok.lower_case}) + "\n"
      )
    print(f"convert: wrote a bertjax checkpoint to {dst}")
  elif args.dst_kind == "google":
    from bertjax.interop import google_ckpt

    is_wordpiece = vocab is not None and vocab.suffix == ".txt"
    google_ckpt.save_google(params, cfg, dst, vocab if is_wordpiece else None)
    if vocab is not None and not is_wordpiece:
      shutil.copyfile(vocab, dst / "tokenizer.model")
    print(f"convert: wrote {google_ckpt.CKPT_NAME}.*, {google_ckpt.CONFIG_NAME} to {dst}")
  else:
    raise ValueError(f"--to {args.dst_kind!r}; valid: {', '.join(TARGETS)}")


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  from bertjax.interop import convert as convert_lib
  from bertjax.data import wordpiece

  lower_case = {"auto": None, "true": True, "false": False}[args.lower_case]
  try:
    print(f"convert: reading {args.src_kind} checkpoint {args.src}", flush=True)
    cfg, params, vocab = _load(args)
    print(
        f"convert: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
        f"vocab {cfg.vocab_size}",
        flush=True,
    )
    tok = None
    if vocab is None:
      print(
          "convert: warning: no tokenizer found in SRC and no --vocab; the output has none",
          file=sys.stderr,
      )
    else:
      tok = _check_tokenizer(vocab, cfg, lower_case)
      print(f"convert: tokenizer {vocab} ({type(tok).__name__}, {tok.vocab_size} pieces)")
    _save(args, cfg, params, vocab, tok)
  except (
      convert_lib.ConversionError,
      wordpiece.WordPieceError,
      FileNotFoundError,
      ValueError,
  ) as e:
    print(f"bertjax convert: error: {e}", file=sys.stderr)
    return 1
  return 0
