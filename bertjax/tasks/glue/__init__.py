"""GLUE fine-tuning and evaluation: restore a pretrained encoder, train a task head, score it.

Modules, in the order data flows through them:
  tasks        the registry: each task's files, columns, label lists, metrics, submission names
  tsv          reader for a GLUE download (`GLUE_DIR/SST-2/train.tsv`, ...) and custom TSVs
  tfds_source  the same splits from TFDS `glue/<task>`
  features     Examples -> [CLS] A [SEP] B [SEP] token ids, segment ids and masks
  metrics      accuracy, F1, Matthews correlation, Pearson, Spearman (numpy only)
  finetune     GLUE's adapter for `bertjax.tasks.finetuning.run`: loss, predictions, metric, files
  sweep        every task x learning rate x seed of `bertjax glue`; medians over seeds
  submission   leaderboard files under OUT/submission/, results.json and the Markdown table
The command line is `bertjax glue` (bertjax/commands/glue.py).
"""
