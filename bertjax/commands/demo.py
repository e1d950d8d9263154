"""`bertjax demo --workdir runs/demo`: the README's main job, end to end on 2 CPU cores.

1. tokenizer: the committed data/tokenizer.model (or `--train-tokenizer`: a new 8k SentencePiece
   model trained on the bundled corpus into WORKDIR/tokenizer/),
2. data: the bundled corpus (data/austen.txt) prepared into WORKDIR/data/austen with the
   `bertjax prepare` machinery (98% train / 2% held out),
3. pretraining: a tiny BERT (experiments/pretrain.py:demo, or another recipe with `--config`,
   e.g. modern_tiny: ModernBERT's network at tiny scale) for a few minutes, printing the MLM
   loss as it falls and the NSP accuracy (when the recipe has NSP), with checkpoints,
   TensorBoard logs and metrics.jsonl in WORKDIR. Rerunning continues from the last checkpoint.

WORKDIR may be on an object store (gs://), as `bertjax pretrain`'s.
"""

from __future__ import annotations

import json

from bertjax.commands import args as args_lib

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def _summary(workdir, pairs: bool = True) -> str:
  """The first and last training loss and the last held-out evaluation; NSP figures only when
  the recipe trains NSP or SOP (`pairs`)."""
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines() if l]
  train = [r for r in rows if "mlm_loss" in r]
  evals = [r for r in rows if "eval_mlm_loss" in r]
  lines = []
  if train:
    a, b = train[0], train[-1]
    nsp = f"; NSP accuracy {b['nsp_accuracy']:.3f} (chance 0.5)" if pairs else ""
    lines.append(
        f"MLM loss {a['mlm_loss']:.3f} (step {a['step']}) -> {b['mlm_loss']:.3f} "
        f"(step {b['step']}){nsp}"
    )
    if "disc_accuracy_replaced" in b:  # ELECTRA: the MLM figures above are its generator's
      lines.append(
          f"ELECTRA discriminator at step {b['step']}: accuracy {b['disc_accuracy_replaced']:.3f} "
          f"on replaced tokens, {b['disc_accuracy_original']:.3f} on original ones "
          f"({b['replaced_fraction']:.1%} of the tokens replaced)"
      )
  if evals:
    e = evals[-1]
    nsp = f", NSP accuracy {e['eval_nsp_accuracy']:.3f}" if pairs else ""
    lines.append(
        f"held-out at step {e['step']}: MLM accuracy {e['eval_mlm_accuracy']:.3f}, "
        f"MLM perplexity {e['eval_mlm_perplexity']:.1f}{nsp}"
    )
    if "eval_mask_accuracy" in e:
      acc, const = e["eval_mask_accuracy"], e["eval_mask_constant_accuracy"]
      lines.append(
          f"held-out accuracy at [MASK] positions: {acc:.3f}, against {const:.3f} for "
          f"the best constant guess ({acc / max(const, 1e-9):.1f}x): the model "
          + (
              "fills masks from context"
              if acc >= 2 * const
              else "has not yet learned to use context (train longer: --steps)"
          )
      )
  return "\n".join(lines)


def _held_out_sentences(data_dir, n: int) -> list[list[int]]:
  """The first `n` held-out sentences of 10-40 pieces (the model never trained on them)."""
  from bertjax.data import records

  meta = records.load_metadata(data_dir)
  out = []
  for shard in records.split_shards(meta, data_dir, "eval"):
    for doc in records.read_documents(shard["path"]):
      out += [s.tolist() for s in doc if 10 <= len(s) <= 40]
      if len(out) >= 4 * n:
        break
  return out[::4][:n]  # spread over the held-out chapters' first pages


def fill_mask(workdir, data_dir, n: int = 5, k: int = 5) -> list[str]:
  """Lines showing the top-`k` predictions for one masked word in `n` held-out sentences."""
  import numpy as np

  from bertjax.training import pretrained

  from bertjax import model as model_lib

  from bertjax.data import tokenizer as tokenizer_lib

  pre = pretrained.load_pretrained(str(workdir))
  tok = tokenizer_lib.SentencePieceTokenizer(pre.tokenizer_path)
  if pre.generator_config is not None:  # ELECTRA: the generator fills the mask
    from bertjax.model import electra

    electra_model = electra.ElectraForPreTraining(pre.config, pre.generator_config)
    bert = electra_model.bind({"params": pre.params})
    fill = lambda *a, **kw: bert.generate(*a, **kw)
  else:
    bert = model_lib.BertForPreTraining(pre.config)
    fill = lambda *a, **kw: bert.apply({"params": pre.params}, *a, **kw)
  lines = []
  for ids in _held_out_sentences(data_dir, n):
    # A one-piece word of 3+ letters in the middle of the sentence.
    words = [
        i
        for i in range(2, len(ids) - 2)
        if tok.is_word_start(ids[i])
        and tok.is_word_start(ids[i + 1])
        and len(tok.id_to_piece(ids[i])) > 3
    ]
    if not words:
      continue
    pos = words[len(words) // 2]
    x = (
        [tokenizer_lib.CLS_ID]
        + ids[:pos]
        + [tokenizer_lib.MASK_ID]
        + ids[pos + 1 :]
        + [tokenizer_lib.SEP_ID]
    )
    arr = np.asarray([x], np.int32)
    out = fill(
        arr,
        np.zeros_like(arr),
        np.ones_like(arr),
        np.asarray([[pos + 1]], np.int32),
        deterministic=True,
    )
    top = np.argsort(-np.asarray(out.mlm_logits[0, 0]))[:k]
    text = tok.decode(ids[:pos]) + " [MASK] " + tok.decode(ids[pos + 1 :])
    guesses = ", ".join(tok.id_to_piece(int(t)).lstrip(tokenizer_lib.WORD_START) for t in top)
    lines.append(
        f"  {text}\n    answer {tok.id_to_piece(ids[pos]).lstrip(tokenizer_lib.WORD_START)!r}; "
        f"model's top {k}: {guesses}"
    )
  return lines


def _parser():
  p = args_lib.ArgumentParser(prog="bertjax demo", description=__doc__)
  p.add_argument("--workdir", default="runs/demo", help="output directory")
  p.add_argument(
      "--config",
      default="demo",
      metavar="RECIPE",
      help="the recipe to pretrain, as `bertjax pretrain --config` names it (default: demo; "
      "modern_tiny: ModernBERT's network at tiny scale; electra_tiny: ELECTRA's)",
  )
  p.add_argument(
      "--steps",
      type=args_lib.positive_int,
      default=None,
      help="training steps (default: the recipe's; demo: 2000)",
  )
  p.add_argument(
      "--train-tokenizer",
      action="store_true",
      help="train a new tokenizer on the corpus instead of data/tokenizer.model",
  )
  return p


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)

  from bertjax import errors
  from bertjax.commands import pretrain
  from bertjax.data import bundled
  from bertjax.runtime import fs
  from bertjax.training import config_checks

  workdir = fs.path(args.workdir)
  data_dir = workdir / "data" / "austen"
  # The same flag parsing as `bertjax pretrain` (checked before anything is written), so the
  # demo is exactly that command.
  overrides = [f"--config.data.path={data_dir}"]
  overrides += [f"--config.train.steps={args.steps}"] if args.steps else []
  config = pretrain.parse(["--config", args.config, *overrides], "bertjax demo").config
  corpus = bundled.find(
      fix="run `bertjax demo` where bertjax was installed from a clone of its repository "
      "(`pip install -e .`), which has data/"
  )
  if workdir.exists() and not workdir.is_dir():
    raise errors.ConfigError(
        f"--workdir {workdir}: exists and is not a directory — choose another --workdir"
    )
  config_checks.preflight(config)  # the mesh and the batch split, before anything is written
  workdir.mkdir(parents=True, exist_ok=True)
  tokenizer = corpus.tokenizer
  if args.train_tokenizer:
    from bertjax.data import tokenizer_train

    prefix = workdir / "tokenizer" / "austen"
    if not prefix.with_suffix(".model").exists():
      print(f"demo: training a tokenizer on {corpus.text.name} -> {prefix}.model", flush=True)
      tokenizer_train.train_tokenizer([str(corpus.text)], str(prefix))
    tokenizer = prefix.with_suffix(".model")
  if not (data_dir / "metadata.json").exists():
    print(f"demo: preparing {corpus.text.name} with {tokenizer} -> {data_dir}", flush=True)
    bundled.prepare_into(data_dir, tokenizer)

  print(
      f"demo: pretraining {config.variant} for {config.train.steps} steps "
      f"(`bertjax pretrain --config {args.config} --workdir {workdir} "
      f"--config.data.path={data_dir}` is the same run)",
      flush=True,
  )
  from bertjax.training import loop

  rc = loop.train_and_evaluate(config, str(workdir))
  if (workdir / "metrics.jsonl").exists():
    print(_summary(workdir, pairs=config.data.pair_mode != "none"))
  if rc == 0:
    print(
        "fill-mask on held-out sentences:\n" + "\n".join(fill_mask(workdir, data_dir)), flush=True
    )
  print(
      f"checkpoints: {workdir / 'checkpoints'}\n"
      f"TensorBoard: tensorboard --logdir {workdir / 'tensorboard'}\n"
      f"metrics:     {workdir / 'metrics.jsonl'}",
      flush=True,
  )
  return rc
