"""`bertjax prepare`: raw text, records or a TFDS corpus -> TFRecord shards of tokenized documents.

Streaming: the parent process reads each input in chunks of ~4 MB cut at document boundaries
(corpus.py: a document over 1 MB, even one line, is cut into several, so no line is ever held
whole), a pool of worker processes cleans, tokenizes and encodes them as TFRecords (encode.py,
in pure Python: preparing text never imports TensorFlow), and the parent shuffles the documents
as results arrive in input order. At most `2 * processes` chunks are in flight, and the output does
not depend on the number of processes. Documents go to the held-out `eval` split by a hash of
their tokens, so the split is the same however the work is divided, and duplicates stay together.

Shuffle: input order is often correlated (one book per file, Wikipedia by title), and the
stream shuffles within blocks of consecutive documents, so each split is shuffled here, over
the whole corpus (this worker's part of it), with the seed `PrepareConfig.seed`, by an external
shuffle in a temporary directory of the output (shuffle.py).

Checks first: the config, the tokenizer, every input and the output are checked before anything
is written, and a corpus without a single document is an error. The shards are written in the
temporary directory and moved into the output only when all are complete, after removing this
worker's old metadata; its new metadata is written last. An interrupted run leaves the output as
it was (a directory it created is removed again); finished data there is replaced only with
`overwrite`. Inputs compressed with gzip, bzip2 or xz (recognised by content) are decompressed;
an empty file or one that is mostly not UTF-8 text is skipped and counted.

Records: JSON lines (`.jsonl`, `.json`, plain or compressed, zstandard too), Parquet and Arrow
(`datasets` save_to_disk) files hold one document per record, its text in the field
`text_field` (formats.py); a record without text is skipped and counted by file and record.

Paths: inputs, tokenizer and output may be local or on an object store (`gs://...`); all go
through `bertjax.runtime.fs` (etils.epath). A remote output is shuffled and written in a local
temporary directory, then each finished shard is uploaded (an object appears whole or not at all).

Past one host: beam_prepare.py does the same work as an Apache Beam pipeline (`prepare
--runner beam`), through this module's checks, placing and metadata (`prepare(cfg, run=...)`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from typing import Callable

from etils import epath
from tqdm import tqdm

from bertjax import errors
from bertjax.data import corpus, encode, problems, records, segment, shuffle, wordpiece
from bertjax.data.prepare_config import DEFAULT_EVAL_FRACTION, PrepareConfig, check_config
from bertjax.runtime import fs, outputs, workdir_lock

__all__ = ["DEFAULT_EVAL_FRACTION", "PrepareConfig", "check_config", "prepare"]

# ----------------------------------------------------------------------------- the output


def _check_output(cfg: PrepareConfig, out: epath.Path) -> list:
  """Refuses an output that cannot be written or holds this worker's finished data (unless
  `overwrite`); returns the local directories that preparing will create, deepest first (an
  object store has none to remove again)."""
  meta = out / records.metadata_name(cfg.worker_index, cfg.num_workers)
  if meta.exists() and not cfg.overwrite:
    raise errors.OutputExistsError(
        f"PrepareConfig.output {epath.Path(cfg.output)} already holds prepared data "
        f"({meta.name}) — pass PrepareConfig.overwrite=True to replace it, or choose another "
        "PrepareConfig.output"
    )
  created = outputs.missing_dirs(out, "PrepareConfig.output")
  return created if fs.is_local(out) else []


def _ensure_open_files(cfg: PrepareConfig) -> None:
  """The shard files of both splits, a split's piles and the interpreter's own files are open
  at once: raise the soft limit on open files when that is allowed, else say how."""
  try:
    import resource
  except ImportError:  # not a POSIX system: no such limit to check
    return
  need = cfg.num_shards + cfg.eval_shards + shuffle.MAX_PILES + 64
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft == resource.RLIM_INFINITY or need <= soft:
    return
  if hard == resource.RLIM_INFINITY or need <= hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return
  raise errors.ConfigError(
      f"PrepareConfig.num_shards={cfg.num_shards}: writing {cfg.num_shards + cfg.eval_shards} "
      f"shards needs about {need} open files, over this system's limit of {hard} — prepare "
      "fewer shards per worker (more workers), or raise the limit (`ulimit -n`)"
  )


def _place(
    out: epath.Path, name: str, worker_index: int, write: Callable[[epath.Path], object]
) -> None:
  """`write(path)` makes out/name whole or not at all: a local file is written beside it under
  a temporary name and renamed over; an object store publishes an object once it is whole."""
  if not fs.is_local(out):
    write(out / name)
    return
  tmp = out / f"{name}.{worker_index}.tmp"
  write(tmp)
  tmp.replace(out / name)


def copy_tokenizer(tok, out: epath.Path, worker_index: int) -> dict:
  """Copies the tokenizer into the data directory (self-contained); its metadata entry.

  The special ids go into metadata.json, so the stream frames and masks with the right ids
  (WordPiece: [CLS]=101 ...) without loading the tokenizer.
  """
  is_wordpiece = isinstance(tok, wordpiece.WordPieceTokenizer)
  is_json = fs.path(tok.path).suffix == ".json"
  name = "vocab.txt" if is_wordpiece else "tokenizer.json" if is_json else "tokenizer.model"
  _place(out, name, worker_index, lambda p: fs.path(tok.path).copy(p, overwrite=True))
  meta = {
      "file": name,
      "type": "wordpiece" if is_wordpiece else "json" if is_json else "sentencepiece",
      "sha256": tok.sha256,
      "vocab_size": tok.vocab_size,
      "special_ids": {
          "pad": tok.pad_id,
          "unk": tok.unk_id,
          "cls": tok.cls_id,
          "sep": tok.sep_id,
          "mask": tok.mask_id,
      },
  }
  if is_wordpiece:
    # vocab.txt does not say whether it is uncased; this file beside it does, and
    # `wordpiece.load_tokenizer` reads it (as transformers does).
    meta["lower_case"] = tok.lower_case
    config = json.dumps({"do_lower_case": tok.lower_case}) + "\n"
    _place(out, "tokenizer_config.json", worker_index, lambda p: p.write_text(config))
  beside = fs.path(tok.path).parent / "tokenizer_config.json"
  if is_json and beside.exists():  # it names the special tokens (RoBERTa's <s>, </s>, ...)
    _place(out, beside.name, worker_index, lambda p: beside.copy(p, overwrite=True))
  return meta


def _drop_empty_shards(cfg: PrepareConfig, out: epath.Path, writers: shuffle.Writers) -> None:
  """Deletes shards that got no document (more shards asked than documents), saying so.

  Shard names keep their `-of-N` numbering; metadata.json lists the shards that remain.
  """
  asked = {split: sum(s["split"] == split for s in writers.shards) for split in records.SPLITS}
  for s in writers.shards:
    if s["documents"] == 0:
      (out / s["file"]).unlink(missing_ok=True)
  writers.shards = [s for s in writers.shards if s["documents"]]
  say_missing_shards(cfg, asked, writers.shards)


def say_missing_shards(cfg: PrepareConfig, asked: dict[str, int], shards: list[dict]) -> None:
  """Says why fewer shards of a split than `asked` hold documents (`shards`: those that do)."""
  for split, flag in (("train", "--num-shards"), ("eval", "--eval-shards")):
    kept = sum(s["split"] == split for s in shards)
    if not asked[split] or kept == asked[split]:
      continue
    if kept == 0 and split == "eval":
      print(
          f"prepare: no document fell into the held-out split ({cfg.eval_fraction:g} of "
          "the documents); `bertjax pretrain` will train without held-out evaluation. "
          "Raise --eval-fraction, or split the text into more documents (blank lines)",
          file=sys.stderr,
      )
    elif kept == 0:
      if shards:
        print(
            "prepare: no training document: every document is in the held-out "
            "split; lower --eval-fraction",
            file=sys.stderr,
        )
    else:
      print(
          f"prepare: wrote {kept} {split} shard(s), not {flag} {asked[split]}: only "
          f"{kept} {split} document(s)",
          file=sys.stderr,
      )


def publish(cfg: PrepareConfig, tmp: epath.Path, out: epath.Path, shards: list[dict]) -> None:
  """Moves the finished shards from `tmp` into `out` (a remote `out`: uploads them); the old
  metadata goes first, so a reader never sees it beside new shards, and the new one is written
  last (by the caller). A single worker owns `out`: shards of an earlier preparation that are
  not replaced go."""
  (out / records.metadata_name(cfg.worker_index, cfg.num_workers)).unlink(missing_ok=True)
  for shard in shards if tmp != out else ():  # written in place (beam_prepare.py)
    if fs.is_local(out):
      (tmp / shard["file"]).replace(out / shard["file"])
    else:
      (tmp / shard["file"]).copy(out / shard["file"], overwrite=True)
  if cfg.num_workers == 1:
    keep = {s["file"] for s in shards}
    for path in out.glob("*.tfrecord"):
      if path.name not in keep:
        path.unlink()


def _shufflers(
    cfg: PrepareConfig, tasks: corpus.Tasks, directory: epath.Path
) -> dict[str, shuffle.Shuffler]:
  """One seeded shuffle per split, with piles for the input's size (TFDS: unknown, one)."""
  share = tasks.total_bytes // cfg.num_workers
  expected = {"train": share, "eval": int(share * cfg.eval_fraction)}
  return {
      split: shuffle.Shuffler(
          directory,
          split,
          expected[split],
          cfg.shuffle_bytes,
          random.Random(f"prepare/{cfg.seed}/{cfg.worker_index}/{split}"),
      )
      for split in records.SPLITS
  }


# ----------------------------------------------------------------------------- prepare


def prepare(cfg: PrepareConfig, run: Callable | None = None) -> dict:
  """Prepares the shards and metadata of this worker; returns the metadata.

  Everything is checked before anything is written: the config, the tokenizer, the inputs and
  the output. On an error later on (a corpus without documents, an interruption) the output is
  left as it was, and a directory this run created is removed again. `run(cfg, tokenizer, out,
  tasks)` does the work once all is checked: by default on this machine, beam_prepare.py's in a
  Beam pipeline.
  """
  check_config(cfg)
  tok = wordpiece.load_tokenizer(cfg.tokenizer)  # fail early on a bad model file
  if cfg.word_segmenter:
    segment.load(cfg.word_segmenter)  # fail early when it is not installed
  tasks = corpus.Tasks(cfg)
  out = fs.path(cfg.output)
  created = _check_output(cfg, out)
  _ensure_open_files(cfg)
  out.mkdir(parents=True, exist_ok=True)
  try:
    # One preparation per worker and output directory at a time (workers share `out`).
    with workdir_lock.Lock(str(out), "bertjax prepare", name=f".prepare-{cfg.worker_index}.lock"):
      _check_output(cfg, out)  # again: another run may have finished meanwhile
      return (run or _prepare)(cfg, tok, out, tasks)
  except BaseException:
    for directory in created:  # deepest first; another worker's files keep theirs
      try:
        # Local directories only (_check_output). os.rmdir refuses a non-empty one at once;
        # epath's rmdir lists it, then removes the whole tree.
        os.rmdir(directory)
      except OSError:
        break
    raise


def _scratch(cfg: PrepareConfig, out: epath.Path) -> epath.Path:
  """Where piles and shards are written first: a hidden directory in a local `out` (the shards
  are renamed into place), a local temporary one for a remote `out` (they are uploaded)."""
  if not fs.is_local(out):
    return epath.Path(tempfile.mkdtemp(prefix=f"bertjax-prepare-{cfg.worker_index}-"))
  tmp = out / f".prepare-{cfg.worker_index}.tmp"
  remove_dir(tmp)  # left by an interrupted run
  tmp.mkdir()
  return tmp


def remove_dir(directory: epath.Path) -> None:
  with contextlib.suppress(OSError):
    directory.rmtree(missing_ok=True)


def _prepare(cfg: PrepareConfig, tok, out: epath.Path, tasks: corpus.Tasks) -> dict:
  tally = problems.Tally(cfg.max_reports, cfg.tfds_text_key, cfg.tfds, tasks.record_files)
  # Piles and shards are written here first, the shards moved into `out` when complete.
  tmp = _scratch(cfg, out)
  totals = collections.Counter()
  start = time.perf_counter()
  bar = tqdm(
      total=tasks.total_bytes or None,
      unit="B",
      unit_scale=True,
      desc="prepare",
      disable=not cfg.progress,
      file=sys.stderr,
      smoothing=0.1,
  )

  def handle(result: encode.Result) -> None:
    tally.drain(tasks)
    for line, reason in result.problems:
      tally.problem(result.source, line, reason)
    for record, sentences, tokens, is_eval in result.records:
      shufflers["eval" if is_eval else "train"].add(record, sentences, tokens)
    tally.docs_per_source[result.source] = tally.docs_per_source.get(result.source, 0) + len(
        result.records
    )
    totals.update(
        documents=len(result.records),
        sentences=result.sentences,
        tokens=result.tokens,
        input_bytes=result.nbytes,
    )
    bar.update(result.nbytes)
    bar.set_postfix_str(
        f"{totals['documents'] / (time.perf_counter() - start):.0f} docs/s", refresh=False
    )

  try:
    shufflers = _shufflers(cfg, tasks, tmp)
    try:
      encode.run_tasks(cfg, tasks, handle)
      tally.drain(tasks)
    finally:
      bar.close()
      for shuffler in shufflers.values():
        shuffler.close()
    # With several workers, this one's part may hold no document while the others' do.
    if not totals["documents"] and cfg.num_workers == 1:
      raise corpus.no_documents(tally.why_empty(tasks), records=bool(tasks.record_files))
    counts = {"train": cfg.num_shards, "eval": cfg.eval_shards if cfg.eval_fraction else 0}
    writers = shuffle.Writers(tmp, counts, cfg.worker_index, cfg.num_workers)
    try:
      for split, shuffler in shufflers.items():
        for record, sentences, tokens in shuffler.shuffled():
          writers.write(record, sentences, tokens, split)
    finally:
      writers.close()
    tally.finish_files(tasks)
    _drop_empty_shards(cfg, tmp, writers)
    publish(cfg, tmp, out, writers.shards)
  finally:
    remove_dir(tmp)
  tokenizer_meta = copy_tokenizer(tok, out, cfg.worker_index)
  return finish(cfg, out, tasks, tally, totals, writers.shards, tokenizer_meta, start)


def finish(
    cfg: PrepareConfig,
    out: epath.Path,
    tasks: corpus.Tasks,
    tally: problems.Tally,
    totals: collections.Counter,
    shards: list[dict],
    tokenizer_meta: dict,
    start: float,
) -> dict:
  """Writes this worker's metadata (last, once the shards and tokenizer are in place) and
  returns it."""
  seconds = time.perf_counter() - start
  meta = {
      "format_version": records.FORMAT_VERSION,
      **{k: totals[k] for k in ("documents", "sentences", "tokens", "input_bytes")},
      **{k: dict(sorted(v.items())) for k, v in tally.counts.items()},
      "examples_of_problems": tally.reports,
      "tokenizer": tokenizer_meta,
      "shards": shards,
      "inputs": list(cfg.inputs) if cfg.inputs else [f"tfds:{cfg.tfds}"],
      **({"text_field": cfg.text_field} if tasks.record_files else {}),
      **(
          {
              "word_segmenter": {
                  "name": cfg.word_segmenter,
                  "version": segment.version(cfg.word_segmenter),
              }
          }
          if cfg.word_segmenter
          else {}
      ),
      "eval_fraction": cfg.eval_fraction,
      "shuffle_seed": cfg.seed,
      "worker_index": cfg.worker_index,
      "num_workers": cfg.num_workers,
      "seconds": round(seconds, 3),
  }
  path = records.write_metadata(out, meta, cfg.worker_index, cfg.num_workers)
  n_problems = sum(sum(v.values()) for v in tally.counts.values())
  if n_problems > len(tally.reports):
    print(
        f"prepare: {n_problems - len(tally.reports)} more problems; counts in {path}",
        file=sys.stderr,
    )
  return meta
