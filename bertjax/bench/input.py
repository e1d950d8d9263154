"""Input benchmark: `bertjax prepare` MB/s and peak memory, and stream examples/s per core.

`bertjax bench input` is the command line (experiments/bench_input.py documents the run);
`run(InputBenchSpec(...))` returns the results as one JSON-able dict.

Purpose: check the data layer's targets (issue 3): >= 5,000 examples/s per host at seq 128,
preparation >= 10x google-research/bert's create_pretraining_data.py per core, flat memory.
Command (from the repository root; about three minutes on 2 CPU cores):

    bertjax bench input --copies 4
    bertjax bench input --copies 4 --google-bert-dir /tmp/bert-tensorflow-1.0.4

Hardware: any CPU machine. The stream builds and masks examples in one Python thread (= one
core); with the tf.data reader (default), reading and parsing the shards run in tf.data's own
threads beside it, with the Python reader in that same thread. Both readers are timed.
Expected: >10,000 examples/s at seq 128 on one core, the tf.data reader somewhat faster than
the Python one; prepare a few MB/s per core with the same peak memory for 1x and Nx the corpus.
`google_bert_dir` points at an unpacked
`pip download --no-deps --no-binary :all: bert-tensorflow==1.0.4` (Google's BERT on PyPI),
whose create_pretraining_data.py is run, not copied, on the same text with a WordPiece vocab
made from our SentencePiece pieces.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from etils import epath

from bertjax import errors, locations
from bertjax.data import pretraining, records, tf_reader
from bertjax.data.tokenizer import NUM_SPECIAL, SentencePieceTokenizer, SPECIAL_PIECES
from bertjax.runtime import fs

REPO = locations.REPO_ROOT
READERS = ("tf.data", "python")  # the shard readers of bertjax.data.pretraining
SEQ_LENS = (128, 512)  # the stream is timed at BERT's two phases' lengths


@dataclasses.dataclass(frozen=True)
class InputBenchSpec:
  """What to time: prepare (1x and `copies`x the corpus), the readers and the stream."""

  corpus: str = str(REPO / "data" / "austen.txt")  # raw text, copied `copies` times
  tokenizer: str = str(REPO / "data" / "tokenizer.model")
  copies: int = 4  # corpus copies for the large run
  batch: int = 256  # stream batch size
  steps: int = 400  # batches timed per stream run; several epochs of the default corpus
  readers: tuple[str, ...] = READERS  # shard readers to time
  data: str = ""  # only read and stream this prepared directory (no prepare)
  google_bert_dir: str = ""  # unpacked bert-tensorflow sdist; "" = skip Google's script
  google_copies: int = 1  # corpus copies for Google's script
  workdir: str = ""  # where the prepared copies go; "" = a temporary directory
  # Only `prepare` on the same documents in these formats (FORMATS), one process each.
  formats: tuple[str, ...] = ()

  def __post_init__(self):
    for field in ("copies", "batch", "steps", "google_copies"):
      if getattr(self, field) < 1:
        raise errors.ConfigError(f"InputBenchSpec.{field}={getattr(self, field)} must be >= 1")
    odd = [f for f in self.formats if f not in FORMATS]
    if odd:
      raise errors.ConfigError(
          f"InputBenchSpec.formats: unknown format {odd[0]!r} — valid: {', '.join(FORMATS)}"
      )
    bad = [r for r in self.readers if r not in READERS]
    if bad or not self.readers:
      raise errors.ConfigError(
          f"InputBenchSpec.readers={','.join(self.readers)}: "
          + (f"unknown reader {bad[0]!r}" if bad else "none given")
          + f" — valid: {', '.join(READERS)}"
      )

  def check_inputs(self) -> None:
    """`InputNotFoundError` naming the field when a path the run reads is missing."""
    if self.data:
      if not (fs.path(self.data) / "metadata.json").is_file():
        raise errors.InputNotFoundError(
            f"InputBenchSpec.data={self.data}: no metadata.json — name a directory written by "
            "`bertjax prepare`"
        )
    else:
      for field in ("corpus", "tokenizer"):
        if not fs.path(getattr(self, field)).is_file():
          raise errors.InputNotFoundError(
              f"InputBenchSpec.{field}={getattr(self, field)}: no such file — name an "
              "existing file"
          )
    script = "bert/create_pretraining_data.py"
    if self.google_bert_dir and not (fs.path(self.google_bert_dir) / script).is_file():
      raise errors.InputNotFoundError(
          f"InputBenchSpec.google_bert_dir={self.google_bert_dir}: no "
          f"{script} — unpack the bert-tensorflow==1.0.4 sdist there"
      )
    if self.workdir and fs.path(self.workdir).exists() and not fs.path(self.workdir).is_dir():
      raise errors.ConfigError(
          f"InputBenchSpec.workdir={self.workdir}: exists and is not a directory"
      )


def _tree_rss_mb(root_pid: int) -> float:
  """Resident memory of a process and all its descendants, from /proc."""
  parents, rss = {}, {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{entry}/statm") as f:
        rss[int(entry)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
      continue
  tree, frontier = {root_pid}, [root_pid]
  while frontier:
    pid = frontier.pop()
    kids = [p for p, pp in parents.items() if pp == pid and p not in tree]
    tree.update(kids)
    frontier.extend(kids)
  return sum(rss.get(p, 0) for p in tree) / 1e6


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
  """(seconds, peak MB of the process tree) of a command; fails loudly."""
  peak = [0.0]
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  done = threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], _tree_rss_mb(proc.pid))
      time.sleep(0.1)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  _, err = proc.communicate()
  seconds = time.perf_counter() - start
  done.set()
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd[:4])}... failed:\n{err.decode()[-2000:]}")
  return seconds, peak[0]


def make_corpus(source: epath.Path, copies: int, out: epath.Path) -> int:
  data = source.read_bytes()
  with out.open("wb") as f:
    for _ in range(copies):
      f.write(data)
  return len(data) * copies


def _arg(path: str | os.PathLike) -> str:
  """A path for a command run in the repository (run_measured): a local one made absolute, so
  that it still names what it named here."""
  return str(fs.absolute(path))


def bench_prepare(
    corpus: epath.Path, nbytes: int, tokenizer: str, out: epath.Path, processes: int
) -> dict:
  cmd = [
      sys.executable,
      "-m",
      "bertjax.cli",
      "prepare",
      "--input",
      _arg(corpus),
      "--tokenizer",
      _arg(tokenizer),
      "--output",
      _arg(out),
      "--num-shards",
      "8",
      "--processes",
      str(processes),
      "--no-progress",
      "--overwrite",  # the benchmark's own scratch copies: a rerun in the same workdir
  ]
  seconds, peak = run_measured(cmd)
  meta = json.loads((fs.path(out) / "metadata.json").read_text())
  return {
      "processes": processes,
      "input_mb": round(nbytes / 1e6, 1),
      "wall_s": round(seconds, 2),
      "mb_per_s": round(nbytes / 1e6 / seconds, 2),
      "mb_per_s_in_loop": round(nbytes / 1e6 / meta["seconds"], 2),
      "peak_rss_mb": round(peak),
      "tokens": meta["tokens"],
  }


def bench_stream(
    data_dir: str | os.PathLike,
    seq_len: int,
    batch: int,
    steps: int,
    reader: str,
    max_predictions: int | None = None,
    packing: bool = False,
    workers: int = 0,
) -> dict:
  cfg = pretraining.InputConfig(
      source="prepared",
      path=str(data_dir),
      seq_len=seq_len,
      max_predictions_per_seq=max_predictions or max(20, round(seq_len * 0.15)),
      reader=reader,
      packing=packing,
      workers=workers,
  )
  stream = pretraining.make_stream(cfg, global_batch_size=batch, process_index=0, process_count=1)
  try:
    for _ in range(3):  # start-up (TensorFlow, the workers) and the first block; the timed
      next(stream)  # steps span several epochs, so they include building instances
    start = time.perf_counter()
    for _ in itertools.islice(stream, steps):
      pass
    seconds = time.perf_counter() - start
  finally:
    stream.close()
  return {
      "reader": stream.reader,
      "workers": workers,
      "packing": packing,
      "seq_len": seq_len,
      "batch": batch,
      "steps": steps,
      "epochs_seen": stream.get_state()["epoch"] + 1,
      "examples_per_s": round(batch * steps / seconds),
  }


def bench_read(data_dir: str | os.PathLike, reader: str, block: int = 1024) -> dict:
  """The reader alone: every train document once, in the stream's blocks, in tokens/s."""
  meta = records.load_metadata(data_dir)
  shards = [dict(s, id=i) for i, s in enumerate(records.split_shards(meta, data_dir, "train"))]
  if reader == "tf.data":
    tf_reader.available()  # TensorFlow's import is a start-up cost, not reading
  start = time.perf_counter()
  if reader == "tf.data":
    blocks = tf_reader.read_blocks(
        shards, lambda e: list(range(len(shards))), 0, 0, block, num_epochs=1
    )
    docs = [d[2] for _, b in blocks for d in b]
  else:
    docs = [d for s in shards for d in records.read_documents(s["path"])]
  seconds = time.perf_counter() - start
  tokens = sum(len(x) for d in docs for x in d)
  return {
      "reader": reader,
      "documents": len(docs),
      "tokens": tokens,
      "seconds": round(seconds, 3),
      "tokens_per_s": round(tokens / seconds),
  }


def _wordpiece_vocab(tokenizer: str, out: epath.Path) -> None:
  """A WordPiece vocab.txt with the same pieces: "▁word" -> "word", "ing" -> "##ing"."""
  tok = SentencePieceTokenizer(tokenizer)
  words = list(SPECIAL_PIECES)
  for i in range(NUM_SPECIAL, tok.vocab_size):
    piece = tok.id_to_piece(i)
    if piece.startswith("<0x"):
      continue
    words.append(piece[1:] if piece.startswith("\u2581") else "##" + piece)
  out.write_text("\n".join(dict.fromkeys(w for w in words if w and w != "##")) + "\n")


def bench_google(
    bert_dir: str,
    corpus: epath.Path,
    nbytes: int,
    tokenizer: str,
    work: epath.Path,
    dupe_factor: int,
) -> dict:
  vocab = work / "vocab.txt"
  _wordpiece_vocab(tokenizer, vocab)
  env = {**os.environ, "PYTHONPATH": _arg(bert_dir), "TF_CPP_MIN_LOG_LEVEL": "3"}
  cmd = [
      sys.executable,
      "-m",
      "bert.create_pretraining_data",
      f"--input_file={_arg(corpus)}",
      f"--output_file={_arg(work / 'google.tfrecord')}",
      f"--vocab_file={_arg(vocab)}",
      "--do_lower_case=False",
      "--max_seq_length=128",
      "--max_predictions_per_seq=20",
      f"--dupe_factor={dupe_factor}",
  ]
  seconds, peak = run_measured(cmd, env)
  return {
      "dupe_factor": dupe_factor,
      "input_mb": round(nbytes / 1e6, 1),
      "wall_s": round(seconds, 2),
      "mb_per_s": round(nbytes / 1e6 / seconds, 3),
      "peak_rss_mb": round(peak),
  }


# ------------------------------------------------------------- corpus formats

FORMATS = ("text", "jsonl", "jsonl.gz", "parquet")  # `--formats`: the same documents in each


def write_formats(corpus: epath.Path, copies: int, work: epath.Path, formats) -> dict:
  """The corpus's documents (blank-line separated, one sentence per line), `copies` times, in
  each format: text as it is; a record per document, its sentences joined by spaces into a
  paragraph per 5 sentences (as web corpora ship them, so `prepare` splits the sentences
  itself). Paths."""
  import gzip

  docs = [d for d in corpus.read_text().split("\n\n") if d.strip()] * copies
  out = {}
  for fmt in formats:
    path = work / f"docs.{'txt' if fmt == 'text' else fmt}"
    if fmt == "text":
      path.write_text("\n\n".join(docs) + "\n")
    elif fmt in ("jsonl", "jsonl.gz"):
      lines = "".join(json.dumps({"text": _paragraphs(d)}) + "\n" for d in docs)
      path.write_bytes(gzip.compress(lines.encode()) if fmt == "jsonl.gz" else lines.encode())
    elif fmt == "parquet":
      import pyarrow as pa
      import pyarrow.parquet as pq

      table = pa.table({"text": [_paragraphs(d) for d in docs]})
      pq.write_table(table, str(path), row_group_size=256)
    else:
      raise errors.ConfigError(f"--formats {fmt}: valid formats are {', '.join(FORMATS)}")
    out[fmt] = path
  return out


def _paragraphs(doc: str, sentences: int = 5) -> str:
  """A document of one sentence per line as web text: paragraphs of 5 sentences joined by
  spaces, one paragraph per line."""
  lines = doc.split("\n")
  return "\n".join(" ".join(lines[i : i + sentences]) for i in range(0, len(lines), sentences))


def profile_prepare(path: epath.Path, tokenizer: str, out: epath.Path) -> dict:
  """Where one `prepare` process spends its time on `path` (cProfile, in this process): the
  shares of its own time in tokenizing, sentence splitting, reading and parsing, framing and
  writing the records, the shuffle, and the rest."""
  import cProfile
  import pstats

  from bertjax.data import prepare as prepare_lib

  cfg = prepare_lib.PrepareConfig(
      output=str(out), tokenizer=tokenizer, inputs=(str(path),), processes=1, progress=False
  )
  prof = cProfile.Profile()
  prof.runcall(prepare_lib.prepare, cfg)
  groups = {
      "tokenize (sentencepiece)": ("sentencepiece", "tokenizer.py", "wordpiece.py"),
      "split sentences (sentencex)": ("sentencex", "text.py"),
      "read and parse (json, pyarrow, gzip)": ("json", "pyarrow", "formats.py", "gzip", "zlib"),
      "frame and write records": ("records.py", "encode.py", "crc", "struct"),
      "shuffle": ("shuffle.py",),
  }
  spent = dict.fromkeys([*groups, "other"], 0.0)
  for (file, _, name), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():
    where = f"{file}:{name}"
    group = next((g for g, keys in groups.items() if any(k in where for k in keys)), "other")
    spent[group] += tottime
  total = sum(spent.values())
  return {k: round(v / total, 3) for k, v in spent.items()}


def bench_formats(spec: InputBenchSpec, work: epath.Path) -> list[dict]:
  """`prepare` on one process over the same documents in each of `spec.formats`: documents/s,
  tokens/s and MB/s of input, peak memory, and where the time goes."""
  paths = write_formats(fs.path(spec.corpus), spec.copies, work, spec.formats)
  rows = []
  for fmt, path in paths.items():
    out = work / f"fmt_{fmt}"
    row = bench_prepare(path, path.stat().length, spec.tokenizer, out, 1)
    meta = json.loads((fs.path(out) / "metadata.json").read_text())
    row.update(
        format=fmt,
        documents=meta["documents"],
        sentences=meta["sentences"],
        docs_per_s=round(meta["documents"] / row["wall_s"]),
        tokens_per_s=round(meta["tokens"] / row["wall_s"]),
        time_shares=profile_prepare(path, spec.tokenizer, work / f"prof_{fmt}"),
    )
    rows.append(row)
  return rows


def _bench_all(spec: InputBenchSpec, work: epath.Path) -> dict:
  """Prepares 1x and Nx the corpus (1 and all processes), then reads and streams the latter."""
  small, large = work / "corpus1.txt", work / f"corpus{spec.copies}.txt"
  n_small = make_corpus(fs.path(spec.corpus), 1, small)
  n_large = make_corpus(fs.path(spec.corpus), spec.copies, large)
  cores = os.cpu_count() or 1
  results = {
      "cpu_cores": cores,
      "prepare": [
          bench_prepare(small, n_small, spec.tokenizer, work / "p_small_1", 1),
          bench_prepare(large, n_large, spec.tokenizer, work / "p_large_1", 1),
          bench_prepare(large, n_large, spec.tokenizer, work / "p_large_n", cores),
      ],
  }
  results.update(_bench_data(work / "p_large_n", spec))
  if spec.google_bert_dir:
    g_corpus = work / "google.txt"
    n_g = make_corpus(fs.path(spec.corpus), spec.google_copies, g_corpus)
    results["google_create_pretraining_data"] = bench_google(
        spec.google_bert_dir, g_corpus, n_g, spec.tokenizer, work, dupe_factor=1
    )
  return results


def _bench_data(data: str | os.PathLike, spec: InputBenchSpec) -> dict:
  return {
      "read": [bench_read(data, r) for r in spec.readers],
      "stream": [
          bench_stream(data, L, spec.batch, spec.steps, r) for L in SEQ_LENS for r in spec.readers
      ],
  }


def run(spec: InputBenchSpec) -> dict:
  """Every measurement of `spec`, as one JSON-able dict (see the module docstring)."""
  spec.check_inputs()
  if spec.data:
    return {"cpu_cores": os.cpu_count() or 1, **_bench_data(fs.path(spec.data), spec)}
  bench = _bench_all
  if spec.formats:
    bench = lambda spec, work: {
        "cpu_cores": os.cpu_count() or 1,
        "formats": bench_formats(spec, work),
    }
  if spec.workdir:
    work = fs.path(spec.workdir)
    work.mkdir(parents=True, exist_ok=True)
    return bench(spec, work)
  with tempfile.TemporaryDirectory() as tmp:
    return bench(spec, epath.Path(tmp))


# ------------------------------------------------------------- does the host keep up?

BERT_VOCAB = 30_522  # the vocabulary when the recipe leaves it to the data (as the compile table)


def host_needs(config, accelerator: str) -> list[dict]:
  """Per phase of the recipe: rows per second each host must deliver if the step ran at the
  bound (the model's FLOPs at the chips' peak, `bertjax.training.flops`; no step is faster)."""
  from bertjax.training import flops, phases, tpu, train

  target = tpu.parse_accelerator(accelerator, what="--accelerator")
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.model.vocab_size = config.model.vocab_size or BERT_VOCAB
  model = train.model_config(config)
  peak = flops.PEAK_FLOPS[f"TPU {target.generation.name}"]
  out = []
  for ph in phases.phases(config):
    step_flops = flops.pretraining_flops_per_step(
        model, ph.batch_size, ph.seq_len, ph.max_predictions
    )
    bound_s = step_flops / (target.chips * peak)
    out.append(
        {
            "phase": ph.index + 1,
            "seq_len": ph.seq_len,
            "max_predictions": ph.max_predictions,
            "global_batch": ph.batch_size,
            "hosts": target.hosts,
            "bound_ms": round(bound_s * 1e3, 2),
            "rows_per_s_per_host_at_bound": round(ph.batch_size / bound_s / target.hosts),
        }
    )
  return out


def host_check(config, accelerator: str, data: str | os.PathLike, steps: int, batch: int) -> dict:
  """`host_needs`, the stream's measured rows/s on one worker (in this process) for each
  phase, and the workers that makes."""
  packing = bool(config.data.get("packing", False))
  needs = host_needs(config, accelerator)
  for need in needs:
    rate = bench_stream(
        data, need["seq_len"], batch, steps, "tf.data", need["max_predictions"], packing
    )["examples_per_s"]
    need["packing"] = packing
    need["measured_rows_per_s_per_worker"] = rate
    need["workers_needed"] = -(-need["rows_per_s_per_host_at_bound"] // rate)
  return {"accelerator": accelerator, "cpu_cores": os.cpu_count() or 1, "phases": needs}


def format_host_check(result: dict) -> str:
  lines = [
      f"{result['accelerator']}: rows/s each host must deliver for a step at the bound (model "
      "FLOPs at peak), the stream's rows/s on one worker here, and the workers that needs"
  ]
  for p in result["phases"]:
    lines.append(
        f"  phase {p['phase']}: seq {p['seq_len']}{' packed' if p['packing'] else ''}, "
        f"batch {p['global_batch']} over {p['hosts']} host(s), bound {p['bound_ms']} ms/step -> "
        f"{p['rows_per_s_per_host_at_bound']:,} rows/s per host; measured "
        f"{p['measured_rows_per_s_per_worker']:,} per worker -> {p['workers_needed']} workers"
    )
  return "\n".join(lines)
