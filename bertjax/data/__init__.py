"""Data layer: corpus preparation, the MLM/NSP example stream, and inspection.

    text.py         cleaning raw lines and rule-based sentence splitting
    records.py      the shard format (TFRecord of tokenized documents), metadata.json, and the
                    plain-Python reader
    tf_reader.py    the stream's default shard reader: tf.data, same documents in the same order
    prepare.py      `bertjax prepare`: streaming, multi-process text/TFDS -> shards
    instances.py    google-research/bert's segment pairing (nsp / sop / none) and truncation
    masking.py      counter-based RNG and vectorised MLM masking
    synthetic.py    TensorFlow-free random batches, independent of the number of hosts
    pretraining.py  `make_stream`, `InputConfig`, global batches and device prefetch
    inspect.py      `bertjax data preview` / `bertjax data stats`

Preparing text files and the synthetic source never import TensorFlow (TFDS input does); the
prepared source reads its shards with tf.data when TensorFlow is installed and with plain
Python otherwise (same batches). The shards are standard TFRecords of tf.train.Example.
"""
