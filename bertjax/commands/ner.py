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
import os
import sys


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="bertjax ner", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--init", required=True,
                 help="a `bertjax pretrain` workdir or checkpoint, a Hugging Face or Google "
                      "BERT directory, or 'random' (with --preset and --tokenizer: a baseline)")
  p.add_argument("--train", required=True, help="CoNLL-format training file")
  p.add_argument("--dev", required=True, help="CoNLL-format dev file (scored every epoch)")
  p.add_argument("--test", default=None, help="optional CoNLL-format test file")
  p.add_argument("--workdir", required=True, help="output directory (OUT)")
  p.add_argument("--tokenizer", default=None, help="override the checkpoint's tokenizer: a "
                 "SentencePiece .model or a WordPiece vocab.txt")
  p.add_argument("--preset", default="tiny", help="model preset for --init random")
  g = p.add_argument_group("recipe")
  g.add_argument("--max-seq-len", type=int, default=128)
  g.add_argument("--learning-rate", type=float, default=5e-5)
  g.add_argument("--epochs", type=int, default=3)
  g.add_argument("--batch-size", type=int, default=32, help="global batch size")
  g.add_argument("--eval-batch-size", type=int, default=64, help="global batch size for eval")
  g.add_argument("--warmup", type=float, default=0.1, help="warmup fraction of all steps")
  g.add_argument("--weight-decay", type=float, default=0.01)
  g.add_argument("--dropout", type=float, default=0.1)
  g.add_argument("--seed", type=int, default=0)
  g.add_argument("--max-steps", type=int, default=0, help="cap steps per epoch (smoke runs)")
  g.add_argument("--eval-untrained", action="store_true",
                 help="also score the model before fine-tuning (epoch 0 in metrics.jsonl)")
  g.add_argument("--no-progress", action="store_true", help="no progress bars")
  return p


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  from bertjax.commands.squad import report_skipped
  from bertjax import finetuning
  from bertjax.glue import restore
  from bertjax.ner import conll, train

  try:
    enc = restore.load_encoder(args.init, args.tokenizer, args.preset, "ner")
    files = dict(train=args.train, dev=args.dev, **({"test": args.test} if args.test else {}))
    splits = {k: conll.read(v) for k, v in files.items()}
  except (ValueError, FileNotFoundError) as e:
    print(str(e) if str(e).startswith("ner:") else f"ner: {e}", file=sys.stderr)
    return 2
  os.makedirs(args.workdir, exist_ok=True)
  report_skipped("ner", [s for v in splits.values() for s in v.skipped],
                 os.path.join(args.workdir, "skipped_lines.txt"))
  print(f"ner: encoder {enc.source}: {enc.config.num_layers} layers, hidden "
        f"{enc.config.hidden_size}; tokenizer {enc.tokenizer!r}", flush=True)
  recipe = finetuning.Recipe(learning_rate=args.learning_rate, epochs=args.epochs,
                             batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
                             warmup_fraction=args.warmup, weight_decay=args.weight_decay,
                             dropout=args.dropout, seed=args.seed, max_steps=args.max_steps)
  try:
    result = train.train_and_evaluate(enc, splits, recipe, args.max_seq_len, args.workdir,
                                      args.eval_untrained, progress=not args.no_progress)
  except ValueError as e:
    print(str(e), file=sys.stderr)
    return 2
  print(f"ner: best epoch {result.best_epoch}: dev precision {result.best['precision']:.4f} "
        f"recall {result.best['recall']:.4f} f1 {result.best['f1']:.4f}")
  print(f"ner: wrote {os.path.join(args.workdir, 'results.json')}")
  return 0
