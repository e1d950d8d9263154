"""`bertjax ner`: fine-tune a pretrained checkpoint for token classification (CoNLL-2003 NER).

  bertjax ner --init runs/base --train conll03/train.txt --dev conll03/valid.txt \\
      --test conll03/test.txt --workdir out/ner

Files are CoNLL format (TOKEN ... TAG per line, blank lines between sentences, -DOCSTART-
lines ignored; IOB1 or IOB2 tags). Writes OUT/results.json (entity-level precision/recall/F1
on dev, and test when given, per type too), OUT/dev_predictions.txt and OUT/test_predictions.txt
(TOKEN GOLD PREDICTED, conlleval's input), OUT/metrics.jsonl per epoch,
OUT/skipped_lines.txt when lines were malformed, and the best epoch's parameters in OUT/best/
with OUT/best.json. See docs/tasks.md.
"""

from __future__ import annotations

import argparse

from bertjax.commands import args as args_lib
from bertjax.commands import finetune_args

# --packing's default: off, as nothing measured it faster (docs/tasks.md, "Packing").
PACKING_DEFAULT = False

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).


def _parser() -> argparse.ArgumentParser:
  p = args_lib.ArgumentParser(prog="bertjax ner", description=__doc__)
  finetune_args.add_encoder_args(p)
  p.add_argument("--train", required=True, help="CoNLL-format training file")
  p.add_argument("--dev", required=True, help="CoNLL-format dev file (scored every epoch)")
  p.add_argument("--test", default=None, help="optional CoNLL-format test file")
  p.add_argument("--workdir", required=True, help="output directory (OUT)")
  g = p.add_argument_group("recipe")
  finetune_args.add_recipe_args(
      g, learning_rate=5e-5, epochs=3, max_seq_len=128, min_seq_len=(3, "[CLS] word [SEP]")
  )
  finetune_args.add_packing_arg(g, PACKING_DEFAULT, "sentences", 'docs/tasks.md, "Packing"')
  return p


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  finetune_args.check_recipe_args(args)
  from bertjax.runtime import fs
  from bertjax.tasks import files as files_lib
  from bertjax.tasks.ner import conll, train

  files = dict(train=args.train, dev=args.dev, **({"test": args.test} if args.test else {}))
  splits = {k: conll.read(v) for k, v in files.items()}
  enc = finetune_args.load_encoder(args)
  # Every check has passed: from here on the command prints and writes.
  fs.path(args.workdir).mkdir(parents=True, exist_ok=True)
  finetune_args.report_skipped(
      "ner",
      [s for v in splits.values() for s in v.skipped],
      files_lib.join(args.workdir, "skipped_lines.txt"),
  )
  print(
      f"ner: encoder {enc.source}: {enc.config.num_layers} layers, hidden "
      f"{enc.config.hidden_size}; tokenizer {enc.tokenizer!r}",
      flush=True,
  )
  recipe = finetune_args.recipe_from_args(args, enc.config.hidden_size, "ner")
  result = train.train_and_evaluate(
      enc,
      splits,
      recipe,
      args.max_seq_len,
      args.workdir,
      args.eval_untrained,
      progress=not args.no_progress,
      packing=finetune_args.packed_examples(args.max_seq_len) if args.packing else 0,
  )
  print(
      f"ner: best epoch {result.best_epoch}: dev precision {result.best['precision']:.4f} "
      f"recall {result.best['recall']:.4f} f1 {result.best['f1']:.4f}"
  )
  print(f"ner: wrote {files_lib.join(args.workdir, 'results.json')}")
  return 0
