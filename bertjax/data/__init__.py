"""Data layer: corpus preparation, the MLM/NSP example stream, and inspection.

    text.py         cleaning raw lines and rule-based sentence splitting
    records.py      the shard format (TFRecord of tokenized documents) and metadata.json
    prepare.py      `bertjax prepare`: streaming, multi-process text/TFDS -> shards
    instances.py    google-research/bert's segment pairing (nsp / sop / none) and truncation
    masking.py      counter-based RNG and vectorised MLM masking
    synthetic.py    TensorFlow-free random batches, independent of the number of hosts
    pretraining.py  `make_stream`, `InputConfig`, global batches and device prefetch
    inspect.py      `bertjax data preview` / `bertjax data stats`

Nothing here needs TensorFlow except TFDS input (`prepare --tfds`) and remote paths (gs://):
the shards are standard TFRecords of tf.train.Example, written and read with numpy.
"""
