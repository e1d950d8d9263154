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

import numpy as np

from bertjax import errors
from bertjax.data import masking, mixture, packing as packing_lib, records, synthetic, tf_reader
from bertjax.data import wordpiece
from bertjax.data.blocks import BlockBuilder, examples_per_row, split_shards
from bertjax.data.hosts import PreparedStream
from bertjax.data.input_config import AUTO, check_state, FEATURES, InputConfig, masked_width
from bertjax.runtime import fs

# The rest of the stream's config (input_config.py), moving its batches to the devices
# (prefetch.py) and which blocks each host takes (hosts.py): importable from here, where the
# stream's callers have always found them, as InputConfig and BlockBuilder above.
from bertjax.data.input_config import auto_examples_cap, PACKED_FEATURES  # noqa: F401
from bertjax.data.hosts import HostPlan, resume_states  # noqa: F401
from bertjax.data.prefetch import Prefetcher, global_batch, prefetch_to_device  # noqa: F401


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
        examples,
        rows,
        max_examples=E,
        max_predictions=masked_width(self.cfg),
        pad_id=self.spec.pad_id,
    )

  def get_state(self) -> dict:
    return {**self.fingerprint, "step": self.step}


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
