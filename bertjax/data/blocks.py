"""Block t of a prepared stream -> the features of its rows (`BlockBuilder`), the shards of a
split (`split_shards`), and the examples a packed row holds, measured on them
(`examples_per_row`). `pretraining.py`'s module docstring has the whole design.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Iterator

import numpy as np

from bertjax import errors
from bertjax.data import instances as instances_lib, masking, packing as packing_lib, records
from bertjax.data import segment, tf_reader
from bertjax.data.input_config import (
    AUTO,
    auto_examples_cap,
    InputConfig,
    masked_width,
    source_configs,
)

_FILE_ORDER, _BLOCK_ORDER, _DOC_RNG, _ROW_ORDER = 21, 22, 23, 24  # purposes of the hashes
_AUTO_BLOCKS = 2  # blocks of the training split packed to measure it
_SYNTHETIC_E = 8  # synthetic rows are drawn, not read: no corpus to measure


def examples_per_row(cfg: InputConfig) -> int:
  """E for `max_examples_per_row=AUTO`: the most examples any row holds when the first blocks
  of the training split are packed at cfg.seq_len with no cap, rounded up to a multiple of 8
  (stable shapes), within 8..`auto_examples_cap`. A pure function of the corpus, the seed and
  the pair settings, so every host and every resume computes the same E. Unless the cap clips
  it, packing with it leaves those blocks' rows as with no cap; a later block with more short
  examples than these may hit it, which only closes its rows earlier."""
  if cfg.max_examples_per_row != AUTO:
    return cfg.max_examples_per_row
  if cfg.source == "synthetic":
    return _SYNTHETIC_E
  if cfg.sources:  # a mixture: the rows of every source have one shape
    return max(examples_per_row(c) for c in source_configs(cfg))
  _, shards = split_shards(cfg, "train")
  uncapped = dataclasses.replace(cfg, packing=True, max_examples_per_row=cfg.seq_len)
  builder = BlockBuilder(uncapped, None, shards, "python", one_block_reads=True)  # rows only
  most = max(
      (
          len(row)
          for t in range(min(_AUTO_BLOCKS, builder.blocks_per_epoch))
          for row in builder.rows(t)
      ),
      default=1,
  )
  return min(auto_examples_cap(cfg.seq_len), max(8, -(-most // 8) * 8))


class BlockBuilder:
  """Block t of the stream -> the features of its rows: a pure function of t, the same for
  every host count (the blocks are those of all the shards; hosts only choose which to build).

  t counts blocks across epochs (epoch t // blocks_per_epoch, block t % blocks_per_epoch).
  The worker processes (prefetch.map_blocks) get a pickled copy each; a copy keeps its reader open
  while the blocks it is asked for follow one another (the in-process case).
  """

  def __init__(
      self,
      cfg: InputConfig,
      spec: masking.MaskSpec,
      shards: list[dict],
      reader: str,
      one_block_reads: bool = False,
  ):
    self.cfg, self.spec, self.shards, self.reader = cfg, spec, shards, reader
    # Documents with a segmenter's words, masked whole: continuing tokens are read as ~id.
    self.words = spec is not None and spec.whole_word and spec.segmented
    # Several hosts take blocks in turns: a reader opened at a block reads that block only.
    self.one_block_reads = one_block_reads
    self.pairs = instances_lib.PairSpec(cfg.seq_len, cfg.pair_mode, cfg.short_seq_prob)
    documents = sum(s["documents"] for s in shards)
    self.blocks_per_epoch = -(-documents // cfg.shuffle_buffer)
    self._open: tuple[int, Iterator] | None = None  # (next block t, its reader)

  def __getstate__(self) -> dict:
    return {**self.__dict__, "_open": None}  # a reader does not cross processes

  def epoch_order(self, epoch: int) -> list[int]:
    """Indices of the shards in the order epoch `epoch` reads them."""
    order = list(range(len(self.shards)))
    random.Random(int(masking.key(self.cfg.seed, _FILE_ORDER, epoch))).shuffle(order)
    return order

  def _python_blocks(self, epoch: int, first_doc: int) -> Iterator[tuple[int, list]]:
    while True:
      block = []
      for shard in (self.shards[i] for i in self.epoch_order(epoch)):
        if first_doc >= shard["documents"]:
          first_doc -= shard["documents"]
          continue
        for record, doc in enumerate(
            records.read_documents(shard["path"], first_doc, self.words), start=first_doc
        ):
          block.append((shard["id"], record, doc))
          if len(block) == self.cfg.shuffle_buffer:
            yield epoch, block
            block = []
        first_doc = 0
      if block:
        yield epoch, block
      epoch, first_doc = epoch + 1, 0

  def read_blocks(
      self,
      epoch: int,
      first_doc: int,
      num_epochs: int | None = None,
      num_blocks: int | None = None,
  ) -> Iterator[tuple[int, list]]:
    """(epoch, block of (shard id, record, sentences)) from document `first_doc` of
    `epoch` on, endlessly unless `num_epochs`; a block never spans two epochs. The Python
    reader reads lazily; `num_blocks` keeps tf.data from reading ahead past those blocks."""
    if self.reader == "tf.data":
      return tf_reader.read_blocks(
          self.shards,
          self.epoch_order,
          epoch,
          first_doc,
          self.cfg.shuffle_buffer,
          num_epochs,
          num_blocks,
          self.words,
      )
    return self._python_blocks(epoch, first_doc)

  def documents(self, t: int) -> list:
    """Block t's documents; reads on from the previous call's block when t follows it."""
    if self._open is None or self._open[0] != t:
      epoch, block = divmod(t, self.blocks_per_epoch)
      num_blocks = 1 if self.one_block_reads else None
      self._open = (t, self.read_blocks(epoch, block * self.cfg.shuffle_buffer, None, num_blocks))
    _, docs = next(self._open[1])
    self._open = None if self.one_block_reads else (t + 1, self._open[1])
    return docs

  def __call__(self, t: int) -> dict[str, np.ndarray]:
    """The rows of block t, in stream order, as arrays of the batch's features."""
    return self._features(self.rows(t))

  def rows(self, t: int) -> list[list]:
    """Block t's rows, each a list of (epoch, shard, record, instance): one instance per row
    unless packing."""
    epoch, block = divmod(t, self.blocks_per_epoch)
    docs = self.documents(t)
    sentences = [d[2] for d in docs]
    if len(docs) == 1 and block > 0:
      # The epoch's last block holds one document: its NotNext segments come from the
      # block before, never from the document itself.
      _, previous = next(self.read_blocks(epoch, (block - 1) * self.cfg.shuffle_buffer, 1, 1))
      sentences += [d[2] for d in previous]
    items = []
    for j, (shard_id, record, _) in enumerate(docs):
      rng = random.Random(int(masking.key(self.cfg.seed, _DOC_RNG, epoch, shard_id, record)))
      items.extend(
          (epoch, shard_id, record, inst)
          for inst in instances_lib.create_instances(sentences, j, self.pairs, rng)
      )
    random.Random(int(masking.key(self.cfg.seed, _BLOCK_ORDER, epoch, block))).shuffle(items)
    return self._rows(items, epoch, block)

  def _rows(self, items: list, epoch: int, block: int) -> list[list]:
    """The block's rows: one instance each, or packed (packing.py) and put in a seeded order."""
    if not self.cfg.packing:
      return [[item] for item in items]
    plan = packing_lib.plan_rows(
        [item[3].length for item in items], self.cfg.seq_len, self.cfg.max_examples_per_row
    )
    rows = [[items[i] for i in row] for row in plan]
    # Best-fit decreasing made the rows longest examples first: shuffle them again.
    random.Random(int(masking.key(self.cfg.seed, _ROW_ORDER, epoch, block))).shuffle(rows)
    return rows

  def _features(self, rows: list[list]) -> dict[str, np.ndarray]:
    """The features of these rows: every example masked as in a row of its own, then packed."""
    examples = [item for row in rows for item in row]
    batch = self._example_features(examples)
    if not self.cfg.packing:
      return batch
    starts = np.cumsum([0] + [len(row) for row in rows])
    return packing_lib.pack(
        batch,
        [range(a, b) for a, b in zip(starts[:-1], starts[1:])],
        max_examples=self.cfg.max_examples_per_row,
        max_predictions=masked_width(self.cfg),
        pad_id=self.spec.pad_id,
    )

  def _example_features(self, picked: list) -> dict[str, np.ndarray]:
    """Unpacked features: one row per (epoch, shard, record, instance) of `picked`."""
    ids, types, labels = instances_lib.layout(
        [inst for *_, inst in picked],
        self.cfg.seq_len,
        self.spec.cls_id,
        self.spec.sep_id,
        self.spec.pad_id,
    )
    epoch_B, shard_B, record_B, index_B = (
        np.array(x, np.int64).reshape(-1)
        for x in zip(*[(e, s, r, inst.index) for e, s, r, inst in picked])
    )
    continues = None
    if self.words:
      ids, continues = segment.unmark(ids)
    # The masking key: (seed, epoch, document identity, instance number) and nothing else.
    keys = masking.key(self.cfg.seed, epoch_B, shard_B, record_B, index_B)
    masked = masking.mask_batch(ids, keys, self.spec, continues)
    return {
        **masked,
        "attention_mask": (ids != self.spec.pad_id).astype(np.int32),
        "token_type_ids": types,
        "nsp_labels": labels,
    }


def split_shards(cfg: InputConfig, split: str = "train") -> tuple[dict, list[dict]]:
  """(metadata, the split's shards), each with its `id`. Every host reads blocks of all of them
  (`HostPlan`), so any number of files serves any number of hosts."""
  meta = records.load_metadata(cfg.path)
  shards = records.split_shards(meta, cfg.path, split)
  for i, shard in enumerate(shards):
    shard["id"] = i  # stable across host counts: part of every example's identity
  if not shards:
    fix = (
        "prepare it again: the corpus gave no training document"
        if split == "train"
        else f"none of its documents is held out (eval_fraction {meta.get('eval_fraction', 0):g})"
        " — read the train split, or prepare it again with a larger `--eval-fraction`"
    )
    raise errors.ConfigError(f"{cfg.path}: no {split} shard — {fix}")
  return meta, shards
