"""The bundled corpus: data/austen.txt and the tokenizer data/tokenizer.model, prepared once.

`bertjax demo` and `bertjax pretrain` without config.data.path train on it. The files live in
the repository's data/ directory, beside the `bertjax` package: an editable install
(`pip install -e .`, what `make demo` does) finds them there; a wheel carries the package but
not 4 MB of novels, so `find` says where it looked and how to go on.
"""

from __future__ import annotations

import dataclasses
import pathlib

from etils import epath

from bertjax import errors, locations
from bertjax.runtime import fs

DATA_DIR = locations.DATA_DIR
CORPUS_PATH = DATA_DIR / "austen.txt"
TOKENIZER_PATH = DATA_DIR / "tokenizer.model"  # the committed 8k SentencePiece model
# `bertjax prepare` settings for it: 98% train / 2% held out in 8 shards (`prepare`'s default).
NUM_SHARDS = 8
EVAL_FRACTION = 0.02

_FIX = (
    "set config.data.path to shards written by `bertjax prepare`, or install bertjax from a "
    "clone of its repository (`pip install -e .`), which has data/"
)


@dataclasses.dataclass(frozen=True)
class Corpus:
  text: pathlib.Path
  tokenizer: pathlib.Path


def find(fix: str = _FIX) -> Corpus:
  """The bundled corpus and tokenizer; `InputNotFoundError` naming what is missing and `fix`."""
  missing = [p for p in (CORPUS_PATH, TOKENIZER_PATH) if not p.is_file()]
  if missing:
    raise errors.InputNotFoundError(
        f"the bundled corpus is not installed ({', '.join(map(str, missing))} not found: it "
        f"ships with the repository, not with the package) — {fix}"
    )
  return Corpus(CORPUS_PATH, TOKENIZER_PATH)


def output_dir(workdir: str) -> epath.Path:
  """Where a run in `workdir` keeps the prepared corpus: WORKDIR/data/austen, or a local cache
  for an object-store workdir."""
  if not fs.is_local(workdir):
    return epath.Path(pathlib.Path.home() / ".cache" / "bertjax" / "data" / "austen")
  return fs.path(workdir) / "data" / "austen"


def prepare_into(out: str | epath.Path, tokenizer: str | epath.Path | None = None) -> None:
  """`bertjax prepare` of the bundled corpus into `out` (with `tokenizer`, or the bundled one)."""
  from bertjax.data import prepare  # TensorFlow: only when something is prepared

  corpus = find()
  prepare.prepare(
      prepare.PrepareConfig(
          output=str(out),
          tokenizer=str(tokenizer or corpus.tokenizer),
          inputs=(str(corpus.text),),
          num_shards=NUM_SHARDS,
          eval_fraction=EVAL_FRACTION,
          processes=2,
          progress=False,
      )
  )


def prepared_dir(workdir: str) -> str:
  """The bundled corpus prepared for a run in `workdir` (once, by process 0; every process
  waits for it and gets the same directory)."""
  import jax
  from jax.experimental import multihost_utils

  out = output_dir(workdir)
  if jax.process_index() == 0 and not (out / "metadata.json").exists():
    print(f"data: preparing the bundled corpus {CORPUS_PATH.name} into {out}", flush=True)
    prepare_into(out)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("bertjax_bundled_data")
  return str(out)
