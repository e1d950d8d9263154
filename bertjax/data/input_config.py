"""The pretraining stream's configuration and the rules its rows follow.

`InputConfig` (every setting of the stream), the features a batch holds, the AUTO number of
examples per packed row and its cap, the masked arrays' width, the check a saved state must
pass, and the config of each source of a mixture. Below `blocks.py`, `mixture.py`, `hosts.py`
and `pretraining.py`, which all read it; `pretraining` re-exports what its callers use.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from bertjax import errors
from bertjax.data import masking, packing as packing_lib

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


@dataclasses.dataclass(frozen=True)
class InputConfig:
  source: str = "prepared"  # "prepared" (shards from `bertjax prepare`) | "synthetic"
  path: str = ""  # prepared data directory (metadata.json, *.tfrecord, tokenizer.model)
  seq_len: int = 128  # L: tokens per example, [CLS] and [SEP]s included
  max_predictions_per_seq: int = 20  # P: BERT used 20 at L=128, 80 at L=512
  pair_mode: str = "nsp"  # "nsp" (BERT) | "sop" (ALBERT) | "none" (no second objective)
  mask_prob: float = (
      masking.MaskSpec.mask_prob
  )  # predictions per token ([CLS]/[SEP] counted, as google's)
  short_seq_prob: float = 0.1  # share of examples with a random shorter target length
  # Mask all pieces of a word together ("▁x" / not "##x"), or all tokens of a segmenter's word
  # in data prepared with `--word-segmenter` (segment.py).
  whole_word_mask: bool = False
  seed: int = 0  # the same seed gives the same stream
  vocab_size: int | None = None  # synthetic: required; prepared: must be >= the tokenizer's
  shuffle_buffer: int = 1024  # documents whose instances are shuffled together
  mask_token_prob: float = masking.MaskSpec.mask_token_prob  # of the predicted tokens: [MASK]
  random_token_prob: float = (
      masking.MaskSpec.random_token_prob
  )  # of the predicted tokens: a random token; rest unchanged
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


def auto_examples_cap(seq_len: int) -> int:
  """The most examples per row AUTO chooses: rows of examples of at least 8 tokens, 8..64
  (16 at L=128, 64 at L=512). Each example adds a [B, E] NSP slot and a prediction slot
  (`packing.prediction_budget`), so the cap bounds what a few very short texts can cost."""
  return max(8, min(64, seq_len // 8))


def check_state(state: dict, fingerprint: dict) -> None:
  """A saved state resumes only a stream with the settings it was saved with."""
  mismatched = {k: (state[k], v) for k, v in fingerprint.items() if k in state and state[k] != v}
  if mismatched:
    raise errors.ConfigError(
        "input state was saved with different settings "
        f"(saved, now): {mismatched}; resume with the same config and hosts"
    )


def masked_width(cfg: InputConfig) -> int:
  """R: the masked arrays' width in a packed batch."""
  return packing_lib.prediction_budget(
      cfg.seq_len, cfg.max_predictions_per_seq, cfg.mask_prob, cfg.max_examples_per_row
  )


def source_seed(seed: int, name: str) -> int:
  """The seed of one source's stream: the run's seed and the source's name (not its place in
  the list, so reordering the sources changes nothing)."""
  return int(masking.key(seed, zlib.crc32(name.encode())) >> np.uint64(33))


def source_configs(cfg) -> list:
  """One InputConfig per source of `cfg.sources`: its path, and its own seed."""
  return [
      dataclasses.replace(cfg, sources=(), path=path, seed=source_seed(cfg.seed, name))
      for name, path, _ in cfg.sources
  ]
