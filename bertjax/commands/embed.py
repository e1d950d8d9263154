"""`bertjax embed`: one float32 vector per text, as the model's sentence-transformers
directory declares it (pooling, Dense, normalisation, length, prompts), into a .npy file.

  bertjax embed --init all-MiniLM-L6-v2 --input texts.txt --output texts.npy
  bertjax embed --init e5-small --input queries.jsonl --text-field question --prompt query \\
      --output queries.npy
  bertjax embed --init runs/base --input docs.parquet --output docs.npy --pooling cls

--init is a sentence-transformers directory or any checkpoint `bertjax extract` reads (a
bertjax run, a Hugging Face or Google BERT directory); without a sentence-transformers
directory's declarations, texts are mean-pooled at the model's full length, not normalised.
Row i of OUT.npy is the i-th text of --input ([N, D]). Texts are packed several to a row of
--max-seq-len tokens and cut at it (the count of cut texts is printed). A line without text
(empty, not UTF-8, not JSON, no --text-field) stops the command naming its file and line,
before any work; --skip-bad-lines writes a row of NaN for each instead, names each on stderr
and counts them. See docs/retrieval.md.
"""

from __future__ import annotations

import argparse
import sys

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.interop import sentence_transformers as st_lib

# Bad lines named one by one on stderr; the rest are counted.
SHOW_BAD = 10


def add_model_args(p: argparse.ArgumentParser) -> None:
  """The flags `embed` and `retrieval` share: the model and how it embeds."""
  p.add_argument(
      "--init",
      required=True,
      help="sentence-transformers directory, bertjax checkpoint (workdir, step dir or "
      "pretrained dir), Hugging Face model directory, Google BERT directory, or random",
  )
  p.add_argument(
      "--pooling",
      choices=st_lib.POOLINGS,
      default=None,
      help="how token states become one vector (default: the directory's, else mean)",
  )
  p.add_argument(
      "--normalize",
      action=argparse.BooleanOptionalAction,
      default=None,
      help="unit-length vectors (default: if the directory has a Normalize module)",
  )
  p.add_argument(
      "--max-seq-len",
      type=args_lib.int_at_least(3, "[CLS] text [SEP]"),
      default=None,
      help="tokens per text incl. [CLS]/[SEP]; longer texts are cut (default: the "
      "directory's max_seq_length, else the model's max_position_embeddings)",
  )
  p.add_argument(
      "--batch-size",
      type=args_lib.positive_int,
      default=32,
      help="packed rows of --max-seq-len per forward pass (default: 32)",
  )
  p.add_argument(
      "--tokenizer",
      help="tokenizer (tokenizer.json, vocab.txt or .model) if the checkpoint has none",
  )
  p.add_argument(
      "--preset",
      default="tiny",
      help="with --init random (fresh weights, seed 0: the no-pretraining baseline): a model "
      "preset, or a checkpoint whose architecture to take",
  )


def _parser() -> argparse.ArgumentParser:
  p = args_lib.ArgumentParser(prog="bertjax embed", description=__doc__)
  add_model_args(p)
  p.add_argument("--input", required=True, help="texts: .txt (one a line), .jsonl or .parquet")
  p.add_argument("--output", required=True, help="OUT.npy, float32 [texts, dim]")
  p.add_argument("--text-field", default="text", help=".jsonl/.parquet: the field holding the text")
  p.add_argument(
      "--prompt",
      default=None,
      help="a prompt NAME of the directory's prompts, or a TEXT put before every text "
      "(default: the directory's default prompt, if any)",
  )
  p.add_argument(
      "--skip-bad-lines",
      action="store_true",
      help="write a NaN row for a line without text instead of stopping",
  )
  p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
  return p


def scan(path: str, field: str, skip_bad: bool) -> tuple[int, list]:
  """(records in `path`, (index, `text_file.Bad`) of those without text); the first of those
  stops the command unless `skip_bad`."""
  from bertjax.tasks import text_file

  n, bad = 0, []
  for r in text_file.records(path, field):
    n += 1
    if isinstance(r, text_file.Bad):
      if not skip_bad:
        raise errors.BadInputError(f"{r} — fix the line, or pass --skip-bad-lines")
      bad.append((n - 1, r))
  if n == 0:
    raise errors.BadInputError(f"{path}: empty — --input holds one text a line")
  return n, bad


def load(args) -> tuple:
  """(encoder, EmbedSpec, mesh) of the model flags (`add_model_args`)."""
  import jax

  from bertjax.commands import finetune_args
  from bertjax.tasks import embed as embed_lib
  from bertjax.training import sharding

  enc = embed_lib.with_weights(finetune_args.load_encoder(args))
  spec = embed_lib.spec_for(
      enc,
      pooling=args.pooling,
      normalize=args.normalize,
      max_seq_len=args.max_seq_len,
      prompt=getattr(args, "prompt", None),
  )
  mesh = sharding.make_mesh(data=-1) if jax.process_count() == 1 else None
  return enc, spec, mesh


def describe(enc, spec) -> str:
  prompt = f", prompt {spec.prompt!r}" if spec.prompt else ""
  return (
      f"{enc.source}, {spec.pooling} pooling{', normalized' if spec.normalize else ''}, "
      f"{spec.max_seq_len} tokens{prompt}"
  )


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  from etils import epath

  from bertjax.runtime import fs, outputs

  if epath.Path(args.output).suffix != ".npy":
    raise errors.ConfigError(f"--output {args.output}: use a .npy file name")
  if not fs.path(args.input).is_file():
    raise errors.InputNotFoundError(f"--input {args.input}: no such file")
  outputs.refuse_existing(args.output, args.overwrite, "--output")
  if args.init != "random" and not fs.path(args.init).exists():  # before reading --input
    raise errors.InputNotFoundError(f"--init {args.init}: no such checkpoint or directory")
  n, bad = scan(args.input, args.text_field, args.skip_bad_lines)
  for _, b in bad[:SHOW_BAD]:
    print(f"embed: {b}: skipped (a NaN row)", file=sys.stderr)
  enc, spec, mesh = load(args)
  print(f"embed: {n - len(bad)} texts, {describe(enc, spec)}", file=sys.stderr, flush=True)
  counts, shape = _write(args, enc, spec, mesh, n, [i for i, _ in bad])
  more = f", {len(bad)} lines without text (NaN rows)" if bad else ""
  print(
      f"embed: wrote {args.output} {list(shape)}; {counts.cut} of {counts.texts} texts cut at "
      f"{spec.max_seq_len} tokens{more}",
      file=sys.stderr,
  )
  return 0


def _write(args, enc, spec, mesh, n: int, bad_rows: list[int]):
  """Embeds the texts of --input into --output (written under a temporary name, then moved;
  on an object store written locally and uploaded): (counts, shape)."""
  import tempfile

  import numpy as np
  from tqdm import tqdm

  from bertjax.runtime import fs
  from bertjax.tasks import embed as embed_lib
  from bertjax.tasks import text_file

  dim = spec.dense[-1].kernel.shape[1] if spec.dense else enc.config.hidden_size
  out = fs.path(args.output)
  with tempfile.TemporaryDirectory(prefix="bertjax-embed-") as tmp:
    local = out.with_name(f".{out.name}.partial") if fs.is_local(out) else fs.path(tmp) / out.name
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
      array = np.lib.format.open_memmap(local, mode="w+", dtype=np.float32, shape=(n, dim))
      array[bad_rows] = np.nan
      texts = (r for r in text_file.records(args.input, args.text_field) if isinstance(r, str))
      keep = np.setdiff1d(np.arange(n), bad_rows)
      counts = embed_lib.Counts()
      with tqdm(total=len(keep), desc="embed", unit="text", file=sys.stderr) as bar:
        at = 0
        for y in embed_lib.embed_groups(
            enc,
            texts,
            spec,
            batch_rows=args.batch_size,
            mesh=mesh,
            counts=counts,
            progress=bar.update,
        ):
          array[keep[at : at + len(y)]] = y
          at += len(y)
      array.flush()
      del array
      if fs.is_local(out):
        local.replace(out)
      else:
        out.parent.mkdir(parents=True, exist_ok=True)
        local.copy(out, overwrite=True)
    finally:
      local.unlink(missing_ok=True)
  return counts, (n, dim)
