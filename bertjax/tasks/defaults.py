"""Defaults of fine-tuning that more than one place states, declared once (no imports: the
command-line help reads them before JAX loads).

    LENGTH_BUCKET  batches padded to a multiple of this many tokens (`Recipe.length_bucket`,
                   `--length-bucket`, `bertjax bench finetune`)
    MAX_LENGTHS    at most this many batch lengths, each a compiled shape (`Recipe.max_lengths`,
                   `--max-lengths`, `bertjax bench finetune`)
"""

LENGTH_BUCKET = 8
MAX_LENGTHS = 8
