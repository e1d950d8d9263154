"""Downstream tasks on a pretrained encoder.

    encoder.py     the encoder to start from (`--init`: bertjax, Hugging Face, Google, random)
    inputs.py      special ids, pair truncation and [CLS] A [SEP] B [SEP] packing, for every task
    recipe.py      the fine-tuning recipe (checked fields) and its optimizer
    batching.py    length-aware batches: buckets, padding, each process's rows
    finetuning/    the runner every task goes through (`run`), the interface a task implements
                   (`TaskAdapter`), the trainer (state, steps, prediction) and the epoch loop
    glue/          GLUE and custom TSV tasks, sweeps, leaderboard submissions
    squad/         SQuAD 1.1/2.0
    ner/           CoNLL-style token classification
    extract.py     per-token and pooled features (`bertjax extract`)

Nothing below this package (model, data, training) imports it.
"""
