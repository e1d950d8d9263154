"""The stream's shard reader on tf.data: blocks of documents, read and parsed in TF's threads.

    files (this host's, in the epoch's order)
      -> flat_map: TFRecordDataset(file).skip(first record).enumerate(first record)
      -> batch(block size)                      one block of serialized documents
      -> map(parse_example, AUTOTUNE threads)   -> flat token ids, sentence and document lengths
      -> prefetch(AUTOTUNE)                     blocks ahead of the Python consumer

Reading, CRC checks and protobuf parsing run in tf.data's C++ threads while Python builds and
masks the instances of the previous block (instances.py, masking.py stay in numpy). The order is
exactly that of `records.read_documents` over the same files: one file at a time (`flat_map`,
not a parallel `interleave`, which would mix documents across files) and an order-preserving
parallel map, so both readers give bit-identical streams and the same resume state. Parsing is
vectorised per block (`parse_example` on a batch) rather than per document, so tf.data's
per-element overhead is paid once per block, not once per document.
"""

from __future__ import annotations

import functools
from typing import Iterator

import numpy as np

Document = tuple[int, int, list[np.ndarray]]  # (shard id, record number, int32 sentences)


@functools.lru_cache(maxsize=None)
def _tf():
    """TensorFlow, kept off the accelerators: JAX owns them, tf.data only needs the CPU."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow was initialised earlier by the caller; leave it be
        pass
    return tf


def available() -> bool:
    """Whether TensorFlow can be imported (the stream falls back to the Python reader)."""
    try:
        _tf()
    except ImportError:
        return False
    return True


def _parse_block(shard_B, record_B, serialized_B):
    tf = _tf()
    spec = {"token_ids": tf.io.RaggedFeature(tf.int64),
            "sentence_lengths": tf.io.RaggedFeature(tf.int64)}
    f = tf.io.parse_example(serialized_B, spec)
    return {"shard": shard_B, "record": record_B,
            "tokens": tf.cast(f["token_ids"].flat_values, tf.int32),
            "sentence_lengths": f["sentence_lengths"].flat_values,
            "doc_sentences": f["sentence_lengths"].row_lengths()}


def block_dataset(paths: list[str], shard_ids: list[int], first_records: list[int],
                  block_size: int):
    """A tf.data.Dataset of blocks of `block_size` documents (the last one may be shorter)."""
    tf = _tf()

    def records_of(path, shard_id, first):
        ds = tf.data.TFRecordDataset(path, buffer_size=1 << 20).skip(first).enumerate(first)
        return ds.map(lambda record, x: (shard_id, record, x))

    files = tf.data.Dataset.from_tensor_slices(
        (tf.constant(paths, tf.string), tf.constant(shard_ids, tf.int64),
         tf.constant(first_records, tf.int64)))
    ds = files.flat_map(records_of).batch(block_size)
    ds = ds.map(_parse_block, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def _documents(block: dict[str, np.ndarray]) -> list[Document]:
    """One parsed block -> documents as `records.read_documents` gives them."""
    sentences = np.split(block["tokens"], np.cumsum(block["sentence_lengths"])[:-1])
    ends = np.cumsum(block["doc_sentences"])
    starts = ends - block["doc_sentences"]
    return [(int(s), int(r), sentences[a:b]) for s, r, a, b in
            zip(block["shard"], block["record"], starts, ends)]


def read_blocks(shards: list[dict], first_doc: int, block_size: int) -> Iterator[list[Document]]:
    """Blocks of documents of `shards` (in this order) from document `first_doc` on.

    `shards` are records.split_shards entries with `id`, `path` and `documents`; whole shards
    before `first_doc` are skipped by their document counts, without opening them.
    """
    paths, ids, firsts = [], [], []
    for shard in shards:
        if first_doc >= shard["documents"]:
            first_doc -= shard["documents"]
            continue
        paths.append(shard["path"])
        ids.append(shard["id"])
        firsts.append(first_doc)
        first_doc = 0
    if not paths:
        return
    tf = _tf()
    it = block_dataset(paths, ids, firsts, block_size).as_numpy_iterator()
    while True:
        try:
            block = next(it)
        except StopIteration:
            return
        except tf.errors.OpError as e:  # e.g. a truncated or corrupted shard
            message = e.message.strip().splitlines()[0]
            raise ValueError(f"tf.data could not read the shards {paths}: {message}; "
                             "InputConfig(reader='python') names the file and record") from None
        yield _documents(block)
