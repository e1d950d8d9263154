"""`prepare`'s configuration and its checks, below both drivers (prepare.py, beam_prepare.py)
and the modules they share (corpus.py, encode.py), which take it as their only argument."""

from __future__ import annotations

import dataclasses
import os

from bertjax import errors
from bertjax.data import formats, segment

# 2% of the documents: on the bundled corpus (273 chapters) ~5 chapters, ~18k tokens; on a
# Wikipedia-sized corpus far more than an evaluation reads, at 2% of the training text.
DEFAULT_EVAL_FRACTION = 0.02


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
  output: str  # output directory (created)
  tokenizer: str  # SentencePiece PREFIX.model (`bertjax tokenizer train`) or WordPiece vocab.txt
  inputs: tuple[str, ...] = ()  # files or globs: text (google-research/bert format) or records
  # Format of the inputs: "auto" (by extension: .jsonl/.json[.gz|.zst|...] JSON lines, .parquet,
  # .arrow; else text), "text", "jsonl", "parquet" or "arrow".
  input_format: str = "auto"
  text_field: str = "text"  # the record field holding a document; `a.b` reaches nested fields
  tfds: str | None = None  # NAME[:SPLIT] of a TFDS text dataset, instead of `inputs`
  tfds_data_dir: str | None = None  # where the TFDS dataset was downloaded/prepared
  tfds_text_key: str = "text"  # feature holding the document text
  num_shards: int = 8  # train shards per worker (every host reads them all: any count works)
  # Share of documents held out for pretrain's evaluation (eval-*.tfrecord); 0 holds none.
  eval_fraction: float = DEFAULT_EVAL_FRACTION
  eval_shards: int = 1  # eval shards per worker (when eval_fraction > 0)
  worker_index: int = 0  # this worker's index, for preparing on several machines
  num_workers: int = 1  # machines preparing the same corpus
  processes: int = max(1, os.cpu_count() or 1)  # tokenizer processes on this machine
  chunk_bytes: int = 4 << 20  # input read per task; bounds memory per process
  max_line_chars: int = 20_000  # longer lines are split (a sentence is never this long)
  max_doc_sentences: int = 10_000  # longer documents are split
  max_reports: int = 10  # first problems printed as `file:line: reason`
  progress: bool = True  # tqdm bar on stderr
  seed: int = 0  # the document shuffle; the same seed gives the same shards
  overwrite: bool = False  # replace prepared data already in `output`
  shuffle_bytes: int = 256 << 20  # records shuffled in memory at a time (one pile)
  # Segment every sentence into words (segment.py: "jieba") and store each document's word
  # lengths beside its tokens, for whole-word masking of Chinese; None: no segmenter.
  word_segmenter: str | None = None


_POSITIVE_FIELDS = (
    "num_shards",
    "eval_shards",
    "num_workers",
    "processes",
    "chunk_bytes",
    "max_line_chars",
    "max_doc_sentences",
    "shuffle_bytes",
)


def check_config(cfg: PrepareConfig) -> None:
  """Every field in range; errors name the field (`PrepareConfig.num_shards=0 ...`)."""
  if bool(cfg.inputs) == bool(cfg.tfds):
    raise errors.ConfigError(
        "give one of PrepareConfig.inputs (text files) and PrepareConfig.tfds (a TFDS "
        "dataset) — " + ("both are set" if cfg.inputs else "neither is set")
    )
  for name in _POSITIVE_FIELDS:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise errors.ConfigError(f"PrepareConfig.{name}={value} must be an integer >= 1")
  if not isinstance(cfg.max_reports, int) or cfg.max_reports < 0:
    raise errors.ConfigError(f"PrepareConfig.max_reports={cfg.max_reports} must be >= 0")
  if not 0.0 <= cfg.eval_fraction < 1.0:
    raise errors.ConfigError(
        f"PrepareConfig.eval_fraction={cfg.eval_fraction} must be >= 0 and < 1 (the share of "
        "documents held out; 0 holds none)"
    )
  if not isinstance(cfg.worker_index, int) or not 0 <= cfg.worker_index < cfg.num_workers:
    raise errors.ConfigError(
        f"PrepareConfig.worker_index={cfg.worker_index} must be >= 0 and < "
        f"PrepareConfig.num_workers={cfg.num_workers}"
    )
  if not cfg.output:
    raise errors.ConfigError("PrepareConfig.output is empty — name the output directory")
  segment.check_name(cfg.word_segmenter)
  if cfg.input_format not in formats.FORMATS:
    raise errors.ConfigError(
        f"PrepareConfig.input_format={cfg.input_format!r}: valid options are "
        + ", ".join(repr(f) for f in formats.FORMATS)
    )
  if not isinstance(cfg.text_field, str) or not cfg.text_field.strip("."):
    raise errors.ConfigError(
        f"PrepareConfig.text_field={cfg.text_field!r} is empty — name the record field holding "
        "the text (e.g. text, or meta.body for a nested one)"
    )
