"""The stream's shard reader on tf.data: blocks of documents, read and parsed in TF's threads.

    epochs e, e+1, ... (each: this host's files in that epoch's seeded order)
      -> flat_map per epoch: files -> flat_map: TFRecordDataset(file).skip(first record)
                                   -> batch(block size)   one block of serialized documents
      -> map(parse_example, AUTOTUNE threads)   -> flat token ids, sentence and document lengths
      -> prefetch(AUTOTUNE)                     blocks ahead of the Python consumer

Reading, CRC checks and protobuf parsing of the next blocks run in tf.data's C++ threads while
Python builds and masks the instances of the current one (instances.py, masking.py stay in numpy). The order is
exactly that of `records.read_documents` over the same files: one file at a time (`flat_map`,
not a parallel `interleave`, which would mix documents across files) and an order-preserving
parallel map, so both readers give bit-identical streams and the same resume state. Parsing is
vectorised per block (`parse_example` on a batch) rather than per document, so tf.data's
per-element overhead is paid once per block, not once per document. One pipeline covers
`EPOCHS_PER_PIPELINE` epochs, so the next epoch's first block is prefetched like any other
(blocks never span two epochs: the block structure is part of the stream's state).
"""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import numpy as np

from bertjax import errors

Document = tuple[int, int, list[np.ndarray]]  # (shard id, record number, int32 sentences)
EPOCHS_PER_PIPELINE = 64  # epochs per tf.data pipeline; a new one is built after them


@functools.lru_cache(maxsize=None)
def _tf():
  """TensorFlow, kept off the accelerators: JAX owns them, tf.data only needs the CPU."""
  import tensorflow as tf  # here: TF stays optional until the first shard is read

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


def _parse_block(epoch, shard_B, record_B, serialized_B, words=False):
  tf = _tf()
  spec = {
      "token_ids": tf.io.RaggedFeature(tf.int64),
      "sentence_lengths": tf.io.RaggedFeature(tf.int64),
  }
  if words:  # data prepared with a word segmenter; empty for records without the list
    spec["word_lengths"] = tf.io.RaggedFeature(tf.int64)
  f = tf.io.parse_example(serialized_B, spec)
  extra = {}
  if words:
    extra = {
        "word_lengths": f["word_lengths"].flat_values,
        "doc_words": f["word_lengths"].row_lengths(),
        "doc_tokens": f["token_ids"].row_lengths(),
    }
  return {
      **extra,
      "epoch": epoch,
      "shard": shard_B,
      "record": record_B,
      "tokens": tf.cast(f["token_ids"].flat_values, tf.int32),
      "sentence_lengths": f["sentence_lengths"].flat_values,
      "doc_sentences": f["sentence_lengths"].row_lengths(),
  }


def block_dataset(
    shards: list[dict],
    epochs: list[int],
    orders: np.ndarray,
    first_records: np.ndarray,
    block_size: int,
    num_blocks: int | None = None,
    words: bool = False,
):
  """A tf.data.Dataset of blocks of `block_size` documents of the given epochs (the first
  `num_blocks` of them when given, so that nothing after them is read ahead).

  orders [E, F]: the shards' indices in each epoch's order; first_records [E, F]: records to
  skip in each (the shard's document count skips it whole, without opening it). The last
  block of an epoch may be shorter.
  """
  tf = _tf()
  paths = tf.constant([s["path"] for s in shards], tf.string)
  ids = tf.constant([s["id"] for s in shards], tf.int64)
  docs = tf.constant([s["documents"] for s in shards], tf.int64)

  def records_of(path, shard_id, first):
    ds = tf.data.TFRecordDataset(path, buffer_size=1 << 20).skip(first).enumerate(first)
    return ds.map(lambda record, x: (shard_id, record, x))

  def blocks_of(epoch, order, first):
    files = tf.data.Dataset.from_tensor_slices(
        (tf.gather(paths, order), tf.gather(ids, order), first, tf.gather(docs, order))
    )
    files = files.filter(lambda path, shard_id, first, n: first < n)
    ds = files.map(lambda path, shard_id, first, n: (path, shard_id, first))
    return (
        ds.flat_map(records_of)
        .batch(block_size)
        .map(lambda shard_B, record_B, x_B: (epoch, shard_B, record_B, x_B))
    )

  ds = tf.data.Dataset.from_tensor_slices(
      (
          tf.constant(epochs, tf.int64),
          tf.constant(orders, tf.int64),
          tf.constant(first_records, tf.int64),
      )
  ).flat_map(blocks_of)
  if num_blocks is not None:
    ds = ds.take(num_blocks)
  parse = functools.partial(_parse_block, words=words)
  ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  options = tf.data.Options()
  options.deterministic = True
  return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def _documents(block: dict[str, np.ndarray]) -> list[Document]:
  """One parsed block -> documents as `records.read_documents` gives them."""
  tokens = block["tokens"]
  if "word_lengths" in block:  # read with words=True: mark the tokens continuing a word
    from bertjax.data import segment

    word_ends = np.cumsum(block["doc_words"])
    token_ends = np.cumsum(block["doc_tokens"])
    tokens = np.concatenate(
        [tokens[:0]]
        + [
            segment.mark(
                tokens[t0:t1], segment.continuation_flags(block["word_lengths"][w0:w1], t1 - t0)
            )
            for w0, w1, t0, t1 in zip(
                word_ends - block["doc_words"],
                word_ends,
                token_ends - block["doc_tokens"],
                token_ends,
            )
        ]
    )
  sentences = np.split(tokens, np.cumsum(block["sentence_lengths"])[:-1])
  ends = np.cumsum(block["doc_sentences"])
  starts = ends - block["doc_sentences"]
  return [
      (int(s), int(r), sentences[a:b])
      for s, r, a, b in zip(block["shard"], block["record"], starts, ends)
  ]


def _first_records(shards: list[dict], order: list[int], first_doc: int) -> list[int]:
  """Records to skip per shard (in epoch order) to start at document `first_doc`."""
  out = []
  for i in order:
    skip = min(first_doc, shards[i]["documents"])
    out.append(skip)
    first_doc -= skip
  return out


def read_blocks(
    shards: list[dict],
    epoch_order: Callable[[int], list[int]],
    epoch: int,
    first_doc: int,
    block_size: int,
    num_epochs: int | None = None,
    num_blocks: int | None = None,
    words: bool = False,
) -> Iterator[tuple[int, list[Document]]]:
  """(epoch, block of documents) from document `first_doc` of `epoch` on; at most
  `num_blocks` blocks when given. `words`: as `records.read_documents`.

  `shards` are records.split_shards entries with `id`, `path` and `documents`;
  `epoch_order(e)` gives the indices of `shards` in epoch e's order. Endless unless
  `num_epochs` is given.
  """
  tf = _tf()
  end = None if num_epochs is None else epoch + num_epochs
  while end is None or epoch < end:
    epochs = list(
        range(
            epoch,
            epoch + EPOCHS_PER_PIPELINE if end is None else min(end, epoch + EPOCHS_PER_PIPELINE),
        )
    )
    orders = np.array([epoch_order(e) for e in epochs], np.int64)
    firsts = np.zeros_like(orders)
    firsts[0] = _first_records(shards, list(orders[0]), first_doc)
    it = block_dataset(
        shards, epochs, orders, firsts, block_size, num_blocks, words
    ).as_numpy_iterator()
    while True:
      try:
        block = next(it)
      except StopIteration:
        break
      except tf.errors.OpError as e:  # e.g. a truncated or corrupted shard
        message = e.message.strip().splitlines()[0]
        names = sorted({s["path"] for s in shards})
        raise errors.BadInputError(
            f"tf.data could not read the shards {names}: {message}; "
            "InputConfig(reader='python') names the file and record"
        ) from None
      yield int(block["epoch"]), _documents(block)
      if num_blocks is not None:
        num_blocks -= 1
        if not num_blocks:
          return
    epoch, first_doc = epochs[-1] + 1, 0
