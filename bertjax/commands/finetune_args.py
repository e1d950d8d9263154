"""Command-line options shared by `bertjax glue`, `squad` and `ner` (no heavy imports here);
`extract` shares `--packing`.

Every numeric flag is range-checked by its argparse type; `check_recipe_args` checks what
depends on the devices (the mesh, the batch sizes it must split) and `load_encoder` what depends
on the checkpoint, so a command finds every mistake before it writes anything.
"""

from __future__ import annotations

import argparse
import json
import sys

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.tasks.defaults import LENGTH_BUCKET, MAX_LENGTHS  # --length-bucket, --max-lengths

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def add_encoder_args(p: argparse.ArgumentParser) -> None:
  """--init, --tokenizer, --preset: where the encoder and its tokenizer come from."""
  p.add_argument(
      "--init",
      required=True,
      help="a `bertjax pretrain` workdir or checkpoint, a Hugging Face or Google "
      "BERT directory, or 'random' (a baseline: --preset's shape with --tokenizer, or the "
      "architecture of the checkpoint --preset names)",
  )
  p.add_argument(
      "--tokenizer",
      default=None,
      help="override the checkpoint's tokenizer: a SentencePiece .model, a WordPiece vocab.txt or a "
      "Hugging Face tokenizer.json",
  )
  p.add_argument(
      "--preset",
      default="tiny",
      help="for --init random: a model preset (tiny mini small medium base large), or a "
      "checkpoint whose architecture (not weights) to take, with its tokenizer",
  )


# Examples per packed row at most: a fixed count (shapes stay static); rows of fine-tuning
# sentences average ~30 tokens.
TOKENS_PER_PACKED_EXAMPLE = 16


def packed_examples(max_seq_len: int) -> int:
  """Examples per packed row of `max_seq_len` tokens at most (at least 1)."""
  return max(1, max_seq_len // TOKENS_PER_PACKED_EXAMPLE)


def add_packing_arg(g, default: bool, examples: str, where: str) -> None:
  """--packing / --no-packing: several `examples` share each --max-seq-len row; `where` says
  in which docs the default was measured."""
  g.add_argument(
      "--packing",
      action=argparse.BooleanOptionalAction,
      default=None,  # None: the command's default, or off when length buckets are asked for
      help=f"pack several {examples} into each --max-seq-len row (up to --max-seq-len/"
      f"{TOKENS_PER_PACKED_EXAMPLE} a row), attention kept within each; one compiled train "
      f"and predict step, no length buckets (default: {'on' if default else 'off'}, "
      f"measured in {where}{'; --length-bucket or --max-lengths turn it off' if default else ''})",
  )
  g.set_defaults(packing_default=default)


def resolve_packing(args: argparse.Namespace) -> bool:
  """`args.packing` as True/False: as given, else the command's default -- unless
  --length-bucket or --max-lengths were given, which ask for unpacked, bucketed batches."""
  given = [f for f in ("--length-bucket", "--max-lengths") if _given(args, f)]
  if args.packing is None:
    args.packing = bool(getattr(args, "packing_default", False)) and not given
  elif args.packing and given:
    raise errors.ConfigError(
        f"{' and '.join(given)}: length buckets are for unpacked batches; --packing fills "
        "--max-seq-len rows instead — drop it or add --no-packing"
    )
  return args.packing


def _layer_decay(text: str) -> float:
  """argparse type: a number in (0, 1]."""
  value = args_lib.positive_float(text)
  if value > 1.0:
    raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1] (1: off; ELECTRA: 0.8)")
  return value


def add_recipe_args(
    g,
    *,
    learning_rate: float,
    epochs: int,
    max_seq_len: int | None,
    min_seq_len: tuple[int, str] = (3, "[CLS] a [SEP]"),
    eval_untrained: bool = True,
) -> None:
  """The fine-tuning recipe: optimizer and its schedule, dropout, global batch sizes.

  `min_seq_len` is the smallest --max-seq-len the task takes, and why.
  """
  if max_seq_len is not None:
    g.add_argument("--max-seq-len", type=args_lib.int_at_least(*min_seq_len), default=max_seq_len)
  g.add_argument(
      "--learning-rate",
      type=args_lib.positive_float,
      default=None,
      help=f"peak learning rate (default: by the encoder's width: {learning_rate:g} "
      "(BERT's) for base/large, 1e-4 up to hidden 512, 5e-4 up to 256, 1e-3 up "
      "to 128; printed)",
  )
  g.set_defaults(bert_learning_rate=learning_rate)
  g.add_argument("--epochs", type=args_lib.positive_int, default=epochs)
  g.add_argument("--batch-size", type=args_lib.positive_int, default=32, help="global batch size")
  g.add_argument(
      "--eval-batch-size",
      type=args_lib.positive_int,
      default=64,
      help="global batch size for eval",
  )
  g.add_argument(
      "--warmup",
      type=args_lib.open_fraction,
      default=0.1,
      help="warmup fraction of all steps, in [0, 1)",
  )
  g.add_argument("--weight-decay", type=args_lib.nonneg_float, default=0.01)
  g.add_argument(
      "--layerwise-lr-decay",
      type=_layer_decay,
      default=1.0,
      help="layer-wise learning-rate decay in (0, 1]: a layer d below the task head learns at "
      "decay^d of the peak, the embeddings lowest (ELECTRA's fine-tuning: 0.8; default 1: off)",
  )
  g.add_argument(
      "--optimizer",
      choices=("bert_adamw", "adamw"),
      default=None,
      help="bert_adamw: google-research/bert's (no bias correction, its schedule); "
      "adamw: bias-corrected, warmup then linear decay (default: bert_adamw "
      "for base/large, adamw up to hidden 512; printed)",
  )
  g.add_argument("--dropout", type=args_lib.open_fraction, default=0.1, help="in [0, 1)")
  g.add_argument("--seed", type=args_lib.nonneg_int, default=0)
  g.add_argument(
      "--max-steps",
      type=args_lib.nonneg_int,
      default=0,
      help="cap steps per epoch (smoke runs); 0: no cap",
  )
  g.add_argument(
      "--length-bucket",
      type=args_lib.nonneg_int,
      default=None,
      help="with --no-packing: pad each batch to its longest row rounded up to a multiple of "
      f"this (the cost of the real tokens); 0: every row to --max-seq-len (default "
      f"{LENGTH_BUCKET})",
  )
  g.add_argument(
      "--max-lengths",
      type=args_lib.nonneg_int,
      default=None,
      help="with --no-packing: at most this many batch lengths, i.e. compiled steps; a length "
      "is kept only if the padding it saves over the run outweighs a compile; 0: no cap "
      f"(default {MAX_LENGTHS})",
  )
  g.add_argument(
      "--mesh",
      default=None,
      help="device mesh as `bertjax pretrain`'s config.mesh, e.g. data=1,fsdp=-1,tensor=1 "
      "for FSDP (one axis may be -1: the rest of the devices; an axis left out is 1) "
      "(default: the mesh the checkpoint was pretrained on, when it fits these devices, "
      "else data=-1; printed)",
  )
  if eval_untrained:
    g.add_argument(
        "--eval-untrained",
        action="store_true",
        help="also score the model before fine-tuning (epoch 0 in metrics.jsonl)",
    )
  g.add_argument("--no-progress", action="store_true", help="no progress bars")


def mesh_of(args: argparse.Namespace) -> tuple[tuple[int, int, int], str | None]:
  """(data, fsdp, tensor) of --mesh, or of the pretraining run behind --init when it is unset
  (then also why, for the log line)."""
  if args.mesh is None:
    return pretrained_mesh(getattr(args, "init", None))
  axes = {"data": 1, "fsdp": 1, "tensor": 1, **args_lib.parse_mesh(args.mesh)}
  return (axes["data"], axes["fsdp"], axes["tensor"]), None


def _given(args: argparse.Namespace, flag: str) -> bool:
  return getattr(args, flag[2:].replace("-", "_"), None) is not None


def spell_mesh(mesh: tuple[int, int, int]) -> str:
  return ",".join(f"{a}={n}" for a, n in zip(args_lib.MESH_AXES, mesh))


def check_recipe_args(args: argparse.Namespace) -> None:
  """What the flags' types cannot see: the mesh must fit the devices, and each global batch
  must split evenly over its batch shards."""
  import jax

  from bertjax.training import sharding

  mesh, why = mesh_of(args)
  where = f"--mesh {args.mesh}" if why is None else f"the mesh {spell_mesh(mesh)} ({why})"
  try:
    data, fsdp, _ = sharding.axis_sizes(*mesh, jax.device_count())
  except ValueError as e:
    detail = str(e).removeprefix("mesh: ").replace("; change config.mesh", "")
    raise errors.ConfigError(f"{where}: {detail} — e.g. --mesh data=-1 uses every device") from None
  if hasattr(args, "packing"):
    resolve_packing(args)
  shards = data * fsdp * jax.process_count()
  for flag in ("--batch-size", "--eval-batch-size"):
    value = getattr(args, flag[2:].replace("-", "_"))
    if value % shards:
      raise errors.ConfigError(
          f"{flag} {value} does not split over the {shards} batch shards of {where} — use a "
          f"multiple of {shards}"
      )


def load_encoder(args: argparse.Namespace, tokenizer_flag: str = "--tokenizer", **kw):
  """The encoder of --init (and --tokenizer), its messages in flag words; --max-seq-len must
  fit its position embeddings."""
  from bertjax.tasks import encoder as encoder_lib

  names = {"init": "--init", "tokenizer": tokenizer_flag, "preset": "--preset"}
  enc = encoder_lib.load_encoder(
      args.init, args.tokenizer, getattr(args, "preset", "tiny"), names=names, **kw
  )
  limit = enc.config.max_seq_len  # max_position_embeddings, less RoBERTa's offset
  if getattr(args, "max_seq_len", None) and args.max_seq_len > limit:
    raise errors.ConfigError(
        f"--max-seq-len {args.max_seq_len} exceeds the model's max_position_embeddings={limit}"
        f" — use at most {limit}"
    )
  return enc


def recipe_from_args(
    args: argparse.Namespace, hidden_size: int, prefix: str, announce: bool = True
):
  """The recipe of the flags; an unset --learning-rate or --optimizer follows the encoder's
  width (printed; the learning rate only when `announce`: a sweep prints its grid instead)."""
  from bertjax.tasks import recipe as recipe_lib

  lr = args.learning_rate
  if lr is None:
    lr, _, why = recipe_lib.learning_rates_for(hidden_size, args.bert_learning_rate)
    if announce:
      print(f"{prefix}: learning rate {lr:g} ({why}; --learning-rate overrides)", flush=True)
  optimizer = args.optimizer
  if optimizer is None:
    optimizer, why = recipe_lib.optimizer_for(hidden_size)
    print(f"{prefix}: optimizer {optimizer} ({why}; --optimizer overrides)", flush=True)
  mesh, why = mesh_of(args)
  if why is not None:
    print(f"{prefix}: mesh {spell_mesh(mesh)} ({why}; --mesh overrides)", flush=True)
  return recipe_lib.Recipe(
      learning_rate=lr,
      epochs=args.epochs,
      batch_size=args.batch_size,
      eval_batch_size=args.eval_batch_size,
      warmup_fraction=args.warmup,
      weight_decay=args.weight_decay,
      layerwise_lr_decay=getattr(args, "layerwise_lr_decay", 1.0),  # a caller without the flag: off
      optimizer=optimizer,
      dropout=args.dropout,
      seed=args.seed,
      max_steps=args.max_steps,
      length_bucket=LENGTH_BUCKET if args.length_bucket is None else args.length_bucket,
      max_lengths=MAX_LENGTHS if args.max_lengths is None else args.max_lengths,
      mesh=mesh,
  )


def pretrained_mesh(init: str | None) -> tuple[tuple[int, int, int], str]:
  """(data, fsdp, tensor) of the `bertjax pretrain` run behind `init` (its workdir's
  config.json, also for a checkpoints/<step> dir) if that mesh fits this job's devices, else
  data-parallel (-1, 1, 1); and why, for the log line."""
  from bertjax.runtime import fs
  from bertjax.training import sharding

  default = (-1, 1, 1)
  if not init or init == "random":
    return default, "data-parallel over every device"
  path = fs.absolute(init)
  # A workdir itself, or the workdir of its checkpoints/<step> (not above a bucket: "gs://").
  for d in [x for x in (path, path.parent.parent) if not str(x).endswith("://")]:
    cfg_path = d / "config.json"
    if (d / "checkpoints").is_dir() and cfg_path.is_file():
      break
  else:
    return default, "data-parallel over every device; no pretraining mesh recorded"
  try:
    m = json.loads(cfg_path.read_text())["mesh"]
    mesh = (int(m["data"]), int(m["fsdp"]), int(m["tensor"]))
  except (OSError, ValueError, KeyError, TypeError):
    return default, f"data-parallel over every device; {cfg_path} records no mesh"
  try:
    sharding.make_mesh(*mesh)
  except ValueError as e:
    return default, f"data-parallel; the pretraining mesh {mesh} does not fit here: {e}"
  return mesh, f"the pretraining mesh, from {cfg_path}"


def report_skipped(prefix: str, skipped: list[str], path: str) -> None:
  """Name the first few bad entries, list them all in `path`."""
  if not skipped:
    return
  from bertjax.runtime import fs

  fs.path(path).write_text("\n".join(skipped) + "\n")
  shown = "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
  print(
      f"{prefix}: skipped {len(skipped)} malformed entries ({shown}); all listed in {path}",
      file=sys.stderr,
  )
