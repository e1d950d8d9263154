"""The pretraining input stream: endless, deterministic, per-host MLM/NSP batches.

    stream = make_stream(cfg, global_batch_size=256, process_index=jax.process_index(),
                         process_count=jax.process_count())
    batch = next(stream)        # host-local numpy rows: global_batch_size // process_count
    state = stream.get_state()  # small JSON dict; make_stream(..., state=state) resumes exactly

Features (all int32; B = host rows, L = seq_len, P = max_predictions_per_seq):
    input_ids [B,L], attention_mask [B,L], token_type_ids [B,L],
    masked_positions [B,P], masked_ids [B,P], masked_weights [B,P] (1 = real prediction),
    nsp_labels [B] (nsp: 0 = IsNext, 1 = NotNext; sop: 1 = swapped; none: all 0).
The model computes the MLM loss only at masked_positions, weighted by masked_weights.

Packing (`packing=True`, packing.py): a row holds up to E = max_examples_per_row whole
examples, each laid out and masked exactly as in a row of its own; the batch gains
segment_ids [B,L], position_ids [B,L], cls_positions [B,E] and nsp_weights [B,E],
nsp_labels becomes [B,E] and the masked arrays [B,R] (R = packing.prediction_budget). Each
block's instances are packed into rows (best-fit decreasing), the rows shuffled, and batches
take rows; the offset of the state then counts rows of the block.

Prepared source. An epoch visits all the shards in a seeded order; every `shuffle_buffer`
consecutive documents form a block whose instances are built (instances.py), shuffled together
and masked (masking.py) as batches are drawn. The hosts take the epoch's blocks in turns (host h
of H: blocks h, h+H, ...; `HostPlan`), each reading only the blocks it builds, so in each epoch
every document is used exactly once across hosts; with one host, block after block.
`prepare` shuffled the documents across the whole corpus, so a block is a random sample of it
(not neighbouring chapters or titles) and a NotNext segment, taken from another document of the
block, comes from a random other document of the corpus, as in google-research/bert. The
shards are read by a tf.data pipeline (tf_reader.py: TFRecordDataset -> blocks -> parallel
parse_example -> prefetch), so reading and parsing the next blocks run in tf.data's threads
while Python builds and masks the current one; without TensorFlow (or with
`reader="python"`) records.py reads them in plain Python. Both give the same documents in the
same order, hence bit-identical batches. The state is (position in the hosts' schedule of
blocks, offset in that block): resuming re-reads that block's documents, skipping the records
before it in one shard (no replay of the stream), and rebuilds the same instances; a state saved
with one reader resumes with the other. States saved by H hosts resume on H' others through
`resume_states`: the blocks the old hosts left partly used (finished from their offsets) and
those nobody touched become the schedule the new hosts share out (docs/data.md). Instance building and masking stay in numpy: every random choice is a hash of
the example's identity, which is what makes the stream deterministic and the resume exact.

Worker processes (`workers`, docs/data.md): a block's rows are a pure function of its number
t across epochs (`BlockBuilder`), so blocks are built, masked and packed on Grain worker
processes (`prefetch.map_blocks`), handed back in order, and the stream only cuts their rows
into batches: the same batches and states for any number of workers.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Iterator

import numpy as np

from bertjax import errors
from bertjax.data import (
    instances as instances_lib,
    masking,
    packing as packing_lib,
    records,
    segment,
    synthetic,
    tf_reader,
    wordpiece,
)
from bertjax.runtime import fs

# Moving the stream's batches to the devices (prefetch.py), and which blocks each host takes
# (hosts.py); importable from here, where the stream's callers have always found them.
from bertjax.data.hosts import HostPlan, PreparedStream, resume_states  # noqa: F401
from bertjax.data.prefetch import Prefetcher, global_batch, prefetch_to_device  # noqa: F401

FEATURES = (
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "masked_positions",
    "masked_ids",
    "masked_weights",
    "nsp_labels",
)
PACKED_FEATURES = FEATURES + packing_lib.EXTRA_FEATURES  # what a packed stream yields
_FILE_ORDER, _BLOCK_ORDER, _DOC_RNG, _ROW_ORDER = 21, 22, 23, 24  # purposes of the hashes


@dataclasses.dataclass(frozen=True)
class InputConfig:
  source: str = "prepared"  # "prepared" (shards from `bertjax prepare`) | "synthetic"
  path: str = ""  # prepared data directory (metadata.json, *.tfrecord, tokenizer.model)
  seq_len: int = 128  # L: tokens per example, [CLS] and [SEP]s included
  max_predictions_per_seq: int = 20  # P: BERT used 20 at L=128, 80 at L=512
  pair_mode: str = "nsp"  # "nsp" (BERT) | "sop" (ALBERT) | "none" (no second objective)
  mask_prob: float = 0.15  # predictions per token ([CLS]/[SEP] counted, as google's)
  short_seq_prob: float = 0.1  # share of examples with a random shorter target length
  # Mask all pieces of a word together ("▁x" / not "##x"), or all tokens of a segmenter's word
  # in data prepared with `--word-segmenter` (segment.py).
  whole_word_mask: bool = False
  seed: int = 0  # the same seed gives the same stream
  vocab_size: int | None = None  # synthetic: required; prepared: must be >= the tokenizer's
  shuffle_buffer: int = 1024  # documents whose instances are shuffled together
  mask_token_prob: float = 0.8  # of the predicted tokens: [MASK]
  random_token_prob: float = 0.1  # of the predicted tokens: a random token; rest unchanged
  # Prepared shards' reader: "tf.data" (TensorFlow's threads; falls back to "python" with a
  # warning when TensorFlow is not installed) | "python" (records.py). Same batches either way.
  reader: str = "tf.data"
  # Several whole examples per row (packing.py): attention, positions and NSP stay per example.
  packing: bool = False
  # E: examples a packed row may hold, so NSP labels per row. 0 (AUTO): measured on the
  # corpus at this seq_len (`examples_per_row`): the most examples any row of the first blocks
  # holds when packed with no cap, rounded up to a multiple of 8, 8..`auto_examples_cap`. A
  # fixed cap binds on short documents: at most 8 filled 70.5% of the slots at L=512 with
  # film-review snippets (mean 35 tokens), where the measured E fills 99%.
  max_examples_per_row: int = 0
  # Processes that build blocks (prefetch.map_blocks, on Grain); 0 or 1: in this process.
  # The batches are the same for any number.
  workers: int = 0
  # Several prepared datasets mixed by weight (mixture.py): ((name, path, weight), ...) for
  # this phase, weights summing to 1; `path` is then unused. (): `path` alone.
  sources: tuple = ()


AUTO = 0  # max_examples_per_row: measured on the corpus
_AUTO_BLOCKS = 2  # blocks of the training split packed to measure it
_SYNTHETIC_E = 8  # synthetic rows are drawn, not read: no corpus to measure


def auto_examples_cap(seq_len: int) -> int:
  """The most examples per row AUTO chooses: rows of examples of at least 8 tokens, 8..64
  (16 at L=128, 64 at L=512). Each example adds a [B, E] NSP slot and a prediction slot
  (`packing.prediction_budget`), so the cap bounds what a few very short texts can cost."""
  return max(8, min(64, seq_len // 8))


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
    from bertjax.data import mixture

    return max(examples_per_row(c) for c in mixture.source_configs(cfg))
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


def _check(
    cfg: InputConfig, global_batch_size: int, process_index: int, process_count: int, split: str
) -> None:
  if cfg.source not in ("prepared", "synthetic"):
    raise errors.ConfigError(
        f"InputConfig.source={cfg.source!r}: valid options are 'prepared', 'synthetic'"
    )
  if cfg.reader not in ("tf.data", "python"):
    raise errors.ConfigError(
        f"InputConfig.reader {cfg.reader!r}: valid options are 'tf.data', 'python'"
    )
  if cfg.pair_mode not in ("nsp", "sop", "none"):
    raise errors.ConfigError(
        f"InputConfig.pair_mode={cfg.pair_mode!r}: valid options are 'nsp', 'sop', 'none'"
    )
  need = 5 if cfg.pair_mode != "none" else 3  # [CLS] A [SEP] B [SEP], or [CLS] A [SEP]
  if cfg.seq_len < need:
    raise errors.ConfigError(
        f"InputConfig.seq_len={cfg.seq_len} is too short for pair_mode {cfg.pair_mode!r}: "
        f"it must be >= {need}"
    )
  if cfg.max_predictions_per_seq < 1:
    raise errors.ConfigError(
        f"InputConfig.max_predictions_per_seq={cfg.max_predictions_per_seq} must be >= 1"
    )
  for name in ("mask_prob", "short_seq_prob", "mask_token_prob", "random_token_prob"):
    if not 0.0 <= getattr(cfg, name) <= 1.0:
      raise errors.ConfigError(f"InputConfig.{name}={getattr(cfg, name)} must be in [0, 1]")
  if cfg.mask_token_prob + cfg.random_token_prob > 1.0:
    raise errors.ConfigError(
        f"InputConfig.mask_token_prob + random_token_prob = "
        f"{cfg.mask_token_prob + cfg.random_token_prob:g} must be <= 1"
    )
  if cfg.shuffle_buffer < 1:
    raise errors.ConfigError(f"InputConfig.shuffle_buffer={cfg.shuffle_buffer} must be >= 1")
  if cfg.workers < 0:
    raise errors.ConfigError(f"InputConfig.workers={cfg.workers} must be >= 0 (0: in-process)")
  if cfg.max_examples_per_row < 0:
    raise errors.ConfigError(
        f"InputConfig.max_examples_per_row={cfg.max_examples_per_row} must be >= 1, "
        f"or {AUTO} to measure it on the corpus"
    )
  if global_batch_size < 1:
    raise errors.ConfigError(f"global_batch_size {global_batch_size} must be >= 1")
  if not 0 <= process_index < process_count:
    raise errors.ConfigError(f"process_index {process_index} not in [0, {process_count})")
  if global_batch_size % process_count:
    raise errors.ConfigError(
        f"global_batch_size {global_batch_size} is not divisible by "
        f"process_count {process_count}"
    )
  if split not in ("train", "eval"):
    raise errors.ConfigError(f"split {split!r}: valid options are 'train', 'eval'")


def _fingerprint(
    cfg: InputConfig, global_batch_size: int, process_index: int, process_count: int, split: str
) -> dict:
  """What a saved state must agree with to resume exactly."""
  return {
      "source": cfg.source,
      "split": split,
      "seed": cfg.seed,
      "seq_len": cfg.seq_len,
      "pair_mode": cfg.pair_mode,
      "global_batch_size": global_batch_size,
      "process_index": process_index,
      "process_count": process_count,
      "packing": cfg.packing,
      **({"max_examples_per_row": cfg.max_examples_per_row} if cfg.packing else {}),
  }


def check_state(state: dict, fingerprint: dict) -> None:
  """A saved state resumes only a stream with the settings it was saved with."""
  mismatched = {k: (state[k], v) for k, v in fingerprint.items() if k in state and state[k] != v}
  if mismatched:
    raise errors.ConfigError(
        "input state was saved with different settings "
        f"(saved, now): {mismatched}; resume with the same config and hosts"
    )


def _budget(cfg: InputConfig) -> int:
  """R: the masked arrays' width in a packed batch."""
  return packing_lib.prediction_budget(
      cfg.seq_len, cfg.max_predictions_per_seq, cfg.mask_prob, cfg.max_examples_per_row
  )


class SyntheticStream:
  """Global batch at step s = f(seed, s); this host yields its slice of rows."""

  def __init__(
      self, cfg: InputConfig, spec: masking.MaskSpec, rows: np.ndarray, fingerprint: dict, step: int
  ):
    self.cfg, self.spec, self.rows, self.fingerprint, self.step = cfg, spec, rows, fingerprint, step

  def __iter__(self) -> "SyntheticStream":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = self._packed() if self.cfg.packing else self._examples(self.rows)
    self.step += 1
    return batch

  def _examples(self, rows: np.ndarray) -> dict[str, np.ndarray]:
    batch = synthetic.synthetic_batch(
        seed=self.cfg.seed,
        step=self.step,
        rows=rows,
        seq_len=self.cfg.seq_len,
        pair_mode=self.cfg.pair_mode,
        short_seq_prob=self.cfg.short_seq_prob,
        spec=self.spec,
    )
    return {k: batch[k] for k in FEATURES}

  def _packed(self) -> dict[str, np.ndarray]:
    """Row r holds those of its E candidates r*E, ..., r*E+E-1 (synthetic rows of their own)
    that fit, in order (first fit): a function of (seed, step, r) only, like an unpacked row;
    with E=1 the examples are the unpacked stream's."""
    E = self.cfg.max_examples_per_row
    examples = self._examples((self.rows[:, None] * E + np.arange(E)).ravel())
    length_BxE = examples["attention_mask"].sum(1).reshape(-1, E)
    room_B, take_BxE = np.full(len(length_BxE), self.cfg.seq_len), np.zeros_like(length_BxE, bool)
    for j in range(E):
      take_BxE[:, j] = length_BxE[:, j] <= room_B
      room_B = room_B - np.where(take_BxE[:, j], length_BxE[:, j], 0)
    rows = [b * E + np.flatnonzero(take) for b, take in enumerate(take_BxE)]
    return packing_lib.pack(
        examples, rows, max_examples=E, max_predictions=_budget(self.cfg), pad_id=self.spec.pad_id
    )

  def get_state(self) -> dict:
    return {**self.fingerprint, "step": self.step}


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
        max_predictions=_budget(self.cfg),
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


def _mask_spec(
    cfg: InputConfig,
    vocab_size: int,
    word_start: np.ndarray | None,
    special: dict[str, int] | None = None,
    segmented: bool = False,
) -> masking.MaskSpec:
  """special: the tokenizer's {pad, unk, cls, sep, mask} ids; None: the module constants."""
  ids = {}
  if special is not None:
    ids = {f"{k}_id": special[k] for k in ("pad", "cls", "sep", "mask")}
    ids["random_ids"] = masking.replacement_ids(vocab_size, special)
  return masking.MaskSpec(
      vocab_size=vocab_size,
      max_predictions=cfg.max_predictions_per_seq,
      mask_prob=cfg.mask_prob,
      mask_token_prob=cfg.mask_token_prob,
      random_token_prob=cfg.random_token_prob,
      whole_word=cfg.whole_word_mask,
      word_start=word_start,
      segmented=segmented,
      **ids,
  )


def _reader(cfg: InputConfig) -> str:
  """The engine that reads the shards: cfg.reader, or "python" when TensorFlow is missing."""
  if cfg.reader == "tf.data":
    if not tf_reader.available():
      logging.warning(
          "InputConfig.reader='tf.data' but TensorFlow is not installed: "
          "reading the shards with the Python reader (same batches)"
      )
      return "python"
  return cfg.reader


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


def make_stream(
    cfg: InputConfig,
    *,
    global_batch_size: int,
    process_index: int,
    process_count: int,
    state: dict | None = None,
    split: str = "train",
) -> SyntheticStream | PreparedStream:
  """This host's endless stream of batches; `state` from `get_state()` resumes exactly
  (a state saved with another host count: through `resume_states` first)."""
  _check(cfg, global_batch_size, process_index, process_count, split)
  if cfg.sources and cfg.source == "prepared":
    from bertjax.data import mixture

    return mixture.make(
        cfg,
        global_batch_size=global_batch_size,
        process_index=process_index,
        process_count=process_count,
        state=state,
        split=split,
        make_one=make_stream,
    )
  if cfg.packing and cfg.max_examples_per_row == AUTO:
    cfg = dataclasses.replace(cfg, max_examples_per_row=examples_per_row(cfg))
  rows = global_batch_size // process_count
  fingerprint = _fingerprint(cfg, global_batch_size, process_index, process_count, split)
  state = dict(state or {})
  if "source" in state:  # a fingerprinted state saved before packing existed was unpacked
    state.setdefault("packing", False)
  check_state(state, fingerprint)
  if cfg.source == "synthetic":
    if not cfg.vocab_size:
      raise errors.ConfigError("source 'synthetic' needs InputConfig.vocab_size")
    word_start = synthetic.word_start_table(cfg.vocab_size)
    return SyntheticStream(
        cfg,
        _mask_spec(cfg, cfg.vocab_size, word_start),
        np.arange(process_index * rows, (process_index + 1) * rows),
        fingerprint,
        state.get("step", 0),
    )
  if process_count > 1 and "source" in state and "untouched_from" not in state:
    raise errors.ConfigError(
        f"the input state of host {process_index} was saved by an earlier version of the stream "
        "(which gave each host whole shard files); it cannot resume"
    )
  meta, shards = split_shards(cfg, split)
  vocab_size = meta["tokenizer"]["vocab_size"]
  # A model vocab padded past the tokenizer's (for speed) is fine; a smaller one is not.
  if cfg.vocab_size and cfg.vocab_size < vocab_size:
    raise errors.ConfigError(
        f"InputConfig.vocab_size={cfg.vocab_size} but {cfg.path} was "
        f"tokenized with vocab_size={vocab_size}; the model needs >= that"
    )
  word_start = None
  if cfg.whole_word_mask:
    tok = wordpiece.load_tokenizer(fs.path(cfg.path) / meta["tokenizer"]["file"])
    word_start = np.array(tok.word_start_table(), bool)

  # Data prepared with a word segmenter: whole-word masking masks its words.
  segmented = cfg.whole_word_mask and bool(meta.get("word_segmenter"))
  spec = _mask_spec(cfg, vocab_size, word_start, records.special_ids(meta), segmented)
  builder = BlockBuilder(cfg, spec, shards, _reader(cfg), one_block_reads=process_count > 1)
  return PreparedStream(cfg, builder, rows, fingerprint, state)
