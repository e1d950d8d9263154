"""`bertjax extract`: per-token (or pooled) features of chosen layers, as .jsonl or .npy.

  bertjax extract --init ckpt/bert_base --input sentences.txt --layers -1,-2,-3,-4 \\
      --output features.jsonl
  bertjax extract --init hf/bert_base --input pairs.txt --layers -1,-2,-3,-4 --concat \\
      --pooling mean --output features.npy
  bertjax extract --init ckpt/bert_base --input sentences.txt --layers embeddings,0,-1 \\
      --output features.jsonl

Layers are numbered as in google-research/bert's extract_features.py: 0 is the first
Transformer layer, -1 the last; `embeddings` is the embedding output (which google's script
does not offer).

Each input line is one example, "text" or "text_a ||| text_b". The .jsonl output follows
google-research/bert's extract_features.py: one object per line,
  {"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]},
  ...]}, ...]}
"index" is the layer as given to --layers (an integer, or "embeddings"). With --concat, each
token has one entry {"index": [-1, -2, -3, -4], "values": [4H floats]}.
With --pooling (cls, mean, max, ... as `bertjax embed` pools), "features" is replaced by "layers"
(one pooled vector per layer).

The .npy output is float32: [N, K, H] pooled ([N, K*H] with --concat); per token
[N, max_seq_len, K, H] ([N, max_seq_len, K*H]), zero past each line's tokens, which are listed
in OUT.tokens.jsonl beside it.

An existing output is refused unless --overwrite; outputs are written under temporary names
and renamed when complete (on an object store such as gs://: written locally, then uploaded),
so a failed run leaves none behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.commands import finetune_args
from bertjax.interop import sentence_transformers as st_lib

# --packing's default, by measurement (docs/tasks.md, "Packing").
PACKING_DEFAULT = True

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def _parser() -> argparse.ArgumentParser:
  p = args_lib.ArgumentParser(prog="bertjax extract", description=__doc__)
  p.add_argument(
      "--init",
      required=True,
      help="bertjax checkpoint (workdir, step dir or pretrained dir), Hugging Face "
      "model directory, or Google BERT directory",
  )
  p.add_argument("--input", required=True, help="UTF-8 text file, one example per line")
  p.add_argument("--output", required=True, help="OUT.jsonl or OUT.npy")
  p.add_argument(
      "--overwrite", action="store_true", help="replace an existing output (and its tokens file)"
  )
  p.add_argument(
      "--layers",
      default=None,
      help="layers to output, as google's extract_features.py numbers them: 0 = "
      "first Transformer layer, -1 = last; 'embeddings' = the embedding "
      "output (default: -1,-2,-3,-4, or every layer of a smaller model)",
  )
  p.add_argument(
      "--concat",
      action="store_true",
      help="concatenate the chosen layers into one vector per token",
  )
  p.add_argument(
      "--pooling",
      choices=("none",) + st_lib.POOLINGS,
      default="none",
      help="one vector per example, pooled over its tokens as `bertjax embed` pools "
      "(cls: [CLS]; default: none, per token)",
  )
  p.add_argument(
      "--normalize",
      action=argparse.BooleanOptionalAction,
      default=None,
      help="with --pooling: unit-length vectors, per layer (default: if --init is a "
      "sentence-transformers directory with a Normalize module, or a contrastive run trained "
      "with normalize)",
  )
  p.add_argument(
      "--batch-size",
      type=args_lib.positive_int,
      default=32,
      help="examples per forward pass (with --packing: rows of --max-seq-len)",
  )
  finetune_args.add_packing_arg(p, PACKING_DEFAULT, "lines", 'docs/tasks.md, "Packing"')
  p.add_argument(
      "--max-seq-len",
      type=args_lib.int_at_least(4, "[CLS] a [SEP] b [SEP]"),
      default=None,
      help="tokens per example incl. [CLS]/[SEP]; longer ones are truncated and counted "
      "(default: a sentence-transformers directory's max_seq_length, else the model's "
      "max_position_embeddings)",
  )
  p.add_argument(
      "--tokenizer",
      "--vocab",
      dest="tokenizer",
      help="tokenizer (vocab.txt, a SentencePiece .model or a transformers tokenizer.json) if "
      "the checkpoint has none, or to override it",
  )
  p.add_argument(
      "--lower-case",
      choices=("auto", "true", "false"),
      default="auto",
      help="WordPiece only: uncased? (default: auto)",
  )
  return p


def _round(values) -> list[float]:
  return [round(float(x), 6) for x in values]


def _jsonl_record(example, feats, layers, concat: bool, pooling: str) -> dict:
  def entries(x_KxH):
    if concat:
      return [{"index": list(layers), "values": _round(x_KxH.reshape(-1))}]
    return [{"index": li, "values": _round(x_KxH[k])} for k, li in enumerate(layers)]

  if pooling != "none":
    return {"linex_index": example.index, "pooling": pooling, "layers": entries(feats)}
  return {
      "linex_index": example.index,
      "features": [{"token": t, "layers": entries(feats[j])} for j, t in enumerate(example.tokens)],
  }


def _outputs(args):
  """The files this run writes (OUT, and OUT.tokens.jsonl for per-token .npy) as
  `etils.epath` paths, checked."""
  from etils import epath

  from bertjax.runtime import fs, outputs

  if args.init == "random":
    raise errors.ConfigError(
        "--init random: extract reads the features of a trained encoder — pass a checkpoint"
    )
  shown, out = epath.Path(args.output), fs.path(args.output)  # as typed; as opened
  if out.suffix not in (".jsonl", ".npy"):
    raise errors.ConfigError(f"--output {shown}: use a .jsonl or .npy file name")
  if not fs.path(args.input).is_file():
    raise errors.InputNotFoundError(f"--input {args.input}: no such file")
  outs = [out]
  if out.suffix == ".npy" and args.pooling == "none":
    outs.append(out.with_suffix(".tokens.jsonl"))
  outputs.refuse_existing(str(shown), args.overwrite, "--output")
  if len(outs) > 1 and outs[1].exists() and not args.overwrite:
    raise errors.OutputExistsError(
        f"{shown.with_suffix('.tokens.jsonl')} (the tokens beside --output) already exists — "
        "pass --overwrite to replace it, or choose another --output"
    )
  return outs


def _read_lines(path: str) -> list[str]:
  from bertjax.runtime import fs

  raw = fs.path(path).read_bytes()
  try:
    lines = raw.decode("utf-8").splitlines()
  except UnicodeDecodeError as e:
    line = raw[: e.start].count(b"\n") + 1
    raise errors.BadInputError(
        f"{path}:{line}: invalid UTF-8 — --input must be UTF-8 text"
    ) from None
  if not lines:
    raise errors.BadInputError(f"{path}: empty — --input holds one example per line")
  return lines


def _join_layers(argv: list[str]) -> list[str]:
  """`--layers -1,-2` -> `--layers=-1,-2`: argparse reads "-1,-2" as an option otherwise."""
  out = list(argv)
  for i, a in enumerate(out[:-1]):
    if a == "--layers" and re.fullmatch(r"-\d+(,.*)?", out[i + 1]):
      out[i : i + 2] = [f"--layers={out[i + 1]}"]
      break
  return out


def main(argv: list[str]) -> int:
  args = _parser().parse_args(_join_layers(argv))
  outs = _outputs(args)
  lines = _read_lines(args.input)
  from bertjax.tasks import extract as features

  lower = {"auto": None, "true": True, "false": False}[args.lower_case]
  enc = finetune_args.load_encoder(args, lower_case=lower)
  cfg = enc.config
  if args.max_seq_len is None:  # what the directory declares, as `bertjax embed` takes it
    declared = enc.sentence.max_seq_length if enc.sentence else None
    args.max_seq_len = min(declared or cfg.max_seq_len, cfg.max_seq_len)
  if args.normalize is None:
    args.normalize = bool(enc.sentence and enc.sentence.normalize)
  layers = (
      features.default_layers(cfg.num_layers)
      if args.layers is None
      else features.parse_layers(args.layers, cfg.num_layers, name="--layers")
  )
  # Every check has passed: from here on the command writes.
  from bertjax.runtime import fs

  if fs.is_local(outs[0]):
    partial = [p.with_name(f".{p.name}.partial") for p in outs]
    try:
      _write(args, enc, lines, layers, partial)
      for tmp, path in zip(partial, outs):
        tmp.replace(path)
    finally:
      for tmp in partial:
        tmp.unlink(missing_ok=True)
  else:  # an object store: written here (the .npy is memory-mapped), uploaded once complete
    with tempfile.TemporaryDirectory(prefix="bertjax-extract-") as tmp:
      local = [fs.path(tmp) / p.name for p in outs]
      _write(args, enc, lines, layers, local)
      outs[0].parent.mkdir(parents=True, exist_ok=True)
      for done, path in zip(local, outs):
        done.copy(path, overwrite=True)
  print(f"extract: wrote {' and '.join(map(str, outs))}", file=sys.stderr)
  return 0


def _write(args, enc, lines: list[str], layers, paths: list) -> None:
  """Features of every line to paths[0] (and the tokens to paths[1]: per-token .npy), local
  `etils.epath` paths."""
  import jax
  import numpy as np
  from tqdm import tqdm

  from bertjax.runtime import fs
  from bertjax.tasks import extract as features
  from bertjax.training import sharding

  cfg = enc.config
  examples = [
      features.make_example(i, line, enc.tokenizer, args.max_seq_len)
      for i, line in enumerate(
          tqdm(lines, desc="tokenize", unit="line", file=sys.stderr, disable=len(lines) < 1000)
      )
  ]
  mesh = sharding.make_mesh(data=-1) if jax.process_count() == 1 else None
  k, h = len(layers), cfg.hidden_size
  print(
      f"extract: {len(examples)} examples, {enc.source} model with {cfg.num_layers} layers, "
      f"layers {layers}, pooling {args.pooling}{', concat' if args.concat else ''}; "
      f"{sum(e.cut for e in examples)} cut at {args.max_seq_len} tokens",
      file=sys.stderr,
      flush=True,
  )
  packing = (
      finetune_args.packed_examples(args.max_seq_len) if finetune_args.resolve_packing(args) else 0
  )
  stream = features.extract(
      enc,
      examples,
      layers,
      args.pooling,
      args.batch_size,
      args.max_seq_len,
      mesh,
      packing,
      normalize=args.normalize and args.pooling != "none",
  )
  out = paths[0]
  out.parent.mkdir(parents=True, exist_ok=True)
  bar = tqdm(total=len(examples), desc="extract", unit="ex", file=sys.stderr)
  if fs.path(args.output).suffix == ".jsonl":
    with out.open("w") as f:
      for e, x in stream:
        f.write(json.dumps(_jsonl_record(e, x, layers, args.concat, args.pooling)) + "\n")
        bar.update(1)
  else:
    per_token = args.pooling == "none"
    shape = (
        (len(examples),)
        + ((args.max_seq_len,) if per_token else ())
        + ((k * h,) if args.concat else (k, h))
    )
    array = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=shape)
    tokens = paths[1].open("w") if per_token else contextlib.nullcontext()
    with tokens as tokens_f:
      for e, x in stream:
        x = x.reshape(x.shape[:-2] + (k * h,)) if args.concat else x
        if per_token:  # rows past the example's tokens stay zero
          array[e.index, : len(x)] = x
          tokens_f.write(json.dumps({"linex_index": e.index, "tokens": e.tokens}) + "\n")
        else:
          array[e.index] = x
        bar.update(1)
    array.flush()
    del array
  bar.close()
