"""Data layer: corpus preparation, the MLM/NSP example stream, and inspection.

    tokenizer.py    the `Tokenizer` interface, BERT's special ids, SentencePiece and tokenizer.json
    wordpiece.py    WordPiece from a BERT vocab.txt; `load_tokenizer` picks either kind
    tokenizer_train.py  training a SentencePiece tokenizer (`tokenizer train`)
    wordpiece_train.py  training a WordPiece vocab.txt (`tokenizer train --kind wordpiece`)
    coverage.py     which characters of a corpus get their own piece
    text.py         cleaning raw lines and rule-based sentence splitting
    records.py      the shard format (TFRecord of tokenized documents), metadata.json, and the
                    plain-Python reader
    tf_reader.py    the stream's default shard reader: tf.data, same documents in the same order
    prepare.py      `bertjax prepare`: checks, then streaming, multi-process text/TFDS -> shards
    corpus.py       reading the inputs: globs, decompression, chunks cut at document boundaries
    encode.py       prepare's per-chunk work in a process pool: documents, tokens, records
    shuffle.py      prepare's external shuffle over the whole corpus, and the shard writers
    bundled.py      the bundled corpus and tokenizer (data/), prepared once for demo/pretrain
    instances.py    google-research/bert's segment pairing (nsp / sop / none) and truncation
    masking.py      counter-based RNG and vectorised MLM masking
    synthetic.py    TensorFlow-free random batches, independent of the number of hosts
    packing.py      several whole examples per row: the packer, the packed layout, real_token_fraction
    input_config.py `InputConfig`, the features, the rules of packed rows, the saved state's check
    blocks.py       block t of a prepared stream -> its rows (`BlockBuilder`); `examples_per_row`
    mixture.py      several prepared datasets mixed by weight
    hosts.py        which blocks each host takes, and the stream cutting them into batches
    pretraining.py  `make_stream`: the endless, resumable MLM/NSP stream (from the rows above)
    prefetch.py     host batches -> global device arrays, built ahead in a thread
    inspect.py      `bertjax data preview` / `bertjax data stats`

Preparing text files and the synthetic source never import TensorFlow (TFDS input does); the
prepared source reads its shards with tf.data when TensorFlow is installed and with plain
Python otherwise (same batches). The shards are standard TFRecords of tf.train.Example.
"""
