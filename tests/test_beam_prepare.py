"""`bertjax prepare --runner beam`: the same data as the local path, through Apache Beam.

Needs the `beam` extra, which `make test` does not install (apache-beam pins protobuf and
pyarrow below the test environment's); `make test-beam` runs this file in a venv of its own.
"""

import collections
import dataclasses
import gzip
import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip(
    "apache_beam", reason="needs the beam extra (apache-beam), in its own venv: make test-beam"
)

from bertjax import cli, errors  # noqa: E402
from bertjax.commands import prepare as prepare_cmd  # noqa: E402
from bertjax.data import beam_prepare, prepare, records  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER = str(REPO / "data" / "tokenizer.model")


def _corpus(root: pathlib.Path) -> list[str]:
  """Every input kind with bad records mixed in: text (a byte-order mark, CRLF, invalid UTF-8,
  NUL, long lines, a single-document file, an empty and a blank one), JSON lines plain and gzip,
  Parquet in row groups."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  chapters = [d for d in (REPO / "data" / "austen.txt").read_text().split("\n\n") if d.strip()]
  good = "\ufeff" + "\n\n".join(chapters[:12]) + "\n"  # a BOM; 33 spans of 3 kB
  (root / "good.txt").write_text(good)
  bad = "\r\n\r\n".join(c.replace("\n", "\r\n") for c in chapters[12:16])
  bad = bad.encode().replace(b"Elinor", b"Eli\xffnor", 3).replace(b"the ", b"th\x00e ", 2)
  (root / "crlf.txt").write_bytes(bad + b"\r\n" + b"word " * 100 + b"\r\n")
  (root / "single.txt").write_text(chapters[16] + "\n")
  (root / "empty.txt").write_bytes(b"")
  (root / "blank.txt").write_text("\n \n\t\n")
  texts = [c.replace("\n", " ") for c in chapters[17:40]]
  lines = []
  for i, t in enumerate(texts):
    lines.append(json.dumps({"text": t, "id": i}))
    bad_line = ["{not json", '{"id": 1}', '{"text": null}', '{"text": 7}', '{"text": "  "}'][i % 5]
    lines.append(bad_line)
  (root / "r.jsonl").write_text("\n".join(lines) + "\n")
  (root / "r.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines[:9]) + "\n").encode()))
  column = [c.replace("\n", " ") for c in chapters[40:52]] + [None, "   "]
  pq.write_table(pa.table({"text": column}), str(root / "t.parquet"), row_group_size=4)
  return [str(root / "*.txt"), str(root / "r.jsonl"), str(root / "r.jsonl.gz")] + [
      str(root / "t.parquet")
  ]


def _documents(out: str, split: str) -> collections.Counter:
  """The documents of a split as a multiset of their records (token ids, sentence lengths and,
  with a word segmenter, word lengths)."""
  meta = records.load_metadata(out)
  return collections.Counter(
      payload
      for shard in records.split_shards(meta, out, split)
      for payload in records.read_records(shard["path"])
  )


@pytest.fixture(scope="module")
def both(tmp_path_factory):
  """The corpus prepared by the local path and by Beam's DirectRunner (2 worker processes),
  every text and JSON-lines file read in spans of 3 kB."""
  root = tmp_path_factory.mktemp("beam")
  inputs = _corpus(root)
  cfg = dict(
      tokenizer=TOKENIZER,
      inputs=tuple(inputs),
      num_shards=3,
      eval_fraction=0.1,
      max_line_chars=300,
      processes=2,
      chunk_bytes=2048,
      progress=False,
  )
  local = prepare.prepare(prepare.PrepareConfig(output=str(root / "local"), **cfg))
  beam = beam_prepare.prepare(
      prepare.PrepareConfig(output=str(root / "beam"), **cfg), split_bytes=3000
  )
  return root, local, beam


@pytest.mark.process
@pytest.mark.slow
def test_beam_writes_the_local_paths_data(both):
  root, local, beam = both
  for key in ("documents", "sentences", "tokens", "input_bytes", "skipped", "repaired"):
    assert beam[key] == local[key], key
  assert beam["warnings"] == local["warnings"]
  assert set(beam) == set(local) and beam["tokenizer"] == local["tokenizer"]
  # Every kind of problem was met, so the counts compared above are not empty ones.
  assert {"unparseable JSON line", "record whose text field is null", "empty file"} <= set(
      beam["skipped"]
  )
  repaired = {"invalid UTF-8 (replaced)", "CRLF line endings (normalised)", "NUL bytes (removed)"}
  assert repaired | {"byte-order mark (removed)"} <= set(beam["repaired"])
  assert beam["warnings"] == {"single-document file": 1}
  for split in records.SPLITS:
    docs = _documents(str(root / "beam"), split)
    assert docs and docs == _documents(str(root / "local"), split), split
  # The file of the bad text split in spans: its problems are reported at their lines in it.
  lines = (root / "crlf.txt").read_bytes().split(b"\n")
  bad = next(i for i, line in enumerate(lines, 1) if b"\xff" in line)
  assert f"{root / 'crlf.txt'}:{bad}: invalid UTF-8 (replaced)" in beam["examples_of_problems"]
  meta = records.load_metadata(str(root / "beam"))
  records.check_shards(meta, str(root / "beam"))
  assert [s["file"] for s in meta["shards"]] == [
      "train-00000-of-00003.tfrecord",
      "train-00001-of-00003.tfrecord",
      "train-00002-of-00003.tfrecord",
      "eval-00000-of-00001.tfrecord",
  ]
  assert not list((root / "beam").glob(".prepare*"))


@pytest.mark.process
@pytest.mark.slow
def test_pretrain_and_data_stats_read_the_beam_output(both, tmp_path, capsys):
  from bertjax.training import loop
  from experiments import pretrain

  root = both[0]
  c = pretrain.get_config("tiny")
  c.data.path = str(root / "beam")
  c.data.seq_len, c.data.max_predictions_per_seq, c.data.workers = 32, 5, 1
  c.train.batch_size, c.train.steps, c.train.warmup_steps = 8, 2, 1
  c.eval.every_steps, c.eval.steps, c.eval.batch_size = 2, 1, 8
  c.checkpoint.every_steps, c.log_every_steps, c.tensorboard = 2, 1, False
  assert loop.train_and_evaluate(c, str(tmp_path / "run")) == 0
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert any("eval_loss" in r for r in rows)  # the held-out split Beam wrote was read
  capsys.readouterr()
  assert (
      cli.main(["data", "stats", "--data", str(root / "beam"), "--seq-len", "32", "-n", "20"]) == 0
  )
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["examples"] >= 20


def test_beam_flags_are_checked_before_anything_runs(tmp_path):
  (tmp_path / "a.txt").write_text("One sentence.\nAnother one.\n\nA second document.\n")
  base = ["--input", str(tmp_path / "a.txt"), "--tokenizer", TOKENIZER, "--no-progress"]
  out = ["--output", str(tmp_path / "out")]
  with pytest.raises(errors.UsageError, match="--beam-option goes with --runner beam"):
    prepare_cmd.main(base + out + ["--beam-option", "runner=DirectRunner"])
  with pytest.raises(errors.ConfigError, match="--beam-option bogus=1: bogus is not a Beam"):
    prepare_cmd.main(base + out + ["--runner", "beam", "--beam-option", "bogus=1"])
  with pytest.raises(errors.ConfigError, match="drop --worker-index and --num-workers"):
    prepare_cmd.main(base + out + ["--runner", "beam", "--num-workers", "2"])
  assert not (tmp_path / "out").exists()
  # Beam's own flag names (extra_package, whose destination is extra_packages) and switches.
  argv = ["runner=DataflowRunner", "extra_package=dist/b.tar.gz", "save_main_session"]
  options = beam_prepare.pipeline_options(argv, 2).get_all_options()
  assert options["runner"] == "DataflowRunner" and options["extra_packages"] == ["dist/b.tar.gz"]
  assert options["save_main_session"] and options["direct_num_workers"] == 2


@pytest.mark.slow
def test_tfds_on_the_in_process_runner(tmp_path):
  """A TFDS split on Beam's in-process runner, where TFDS's mock data reaches the workers."""
  import tensorflow_datasets as tfds

  with tfds.testing.mock_data(num_examples=12):
    cfg = prepare.PrepareConfig(
        output=str(tmp_path / "out"),
        tokenizer=TOKENIZER,
        tfds="wikipedia/20230601.en:train",
        num_shards=2,
        eval_fraction=0,
        processes=1,
        progress=False,
    )
    local = prepare.prepare(cfg)
    beam = beam_prepare.prepare(
        dataclasses.replace(cfg, output=str(tmp_path / "beam")),
        ["direct_running_mode=in_memory"],
    )
  assert beam["documents"] == local["documents"] > 0
  assert beam["tokens"] == local["tokens"]
  assert _documents(str(tmp_path / "beam"), "train") == _documents(str(tmp_path / "out"), "train")


UPLOAD = r"""
import sys
from etils import epath
for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
  epath.Path(dst).write_bytes(open(src, "rb").read())
"""


@pytest.mark.process
@pytest.mark.slow
def test_beam_writes_the_shards_in_place_on_gs(gcs, tmp_path):
  """Input and output on a (fake) bucket, as on Dataflow: the shards are written in place, the
  metadata and shards of an earlier preparation go, nothing is left beside them, and the data
  is the local path's."""
  chapters = (REPO / "data" / "austen.txt").read_text().split("\n\n")
  (tmp_path / "a.txt").write_text("\n\n".join(chapters[:30]) + "\n")
  (tmp_path / "old").write_text("an earlier preparation's file")
  pairs = [(tmp_path / "a.txt", "in/a.txt")]
  pairs += [
      (tmp_path / "old", f"out/{n}") for n in ("metadata.json", "train-00005-of-00008.tfrecord")
  ]
  upload = [
      sys.executable,
      "-c",
      UPLOAD,
      *[x for a, b in pairs for x in (str(a), f"{gcs.url}/{b}")],
  ]
  subprocess.run(upload, env=gcs.environ(), check=True, timeout=120)
  argv = [sys.executable, "-m", "bertjax.cli", "prepare", "--input", f"{gcs.url}/in/a.txt"]
  argv += ["--output", f"{gcs.url}/out", "--tokenizer", TOKENIZER, "--num-shards", "2"]
  argv += ["--eval-fraction", "0.3", "--processes", "1", "--no-progress", "--overwrite"]
  r = subprocess.run(
      argv + ["--runner", "beam"],
      env=gcs.environ(),
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  names = sorted(n.removeprefix("out/") for n in gcs.objects("out/"))
  assert [n for n in names if n] == [
      "eval-00000-of-00001.tfrecord",
      "metadata.json",
      "tokenizer.model",
      "train-00000-of-00002.tfrecord",
      "train-00001-of-00002.tfrecord",
  ]
  meta = json.loads(gcs.read("out/metadata.json"))
  local = prepare.prepare(
      prepare.PrepareConfig(
          output=str(tmp_path / "local"),
          tokenizer=TOKENIZER,
          inputs=(str(tmp_path / "a.txt"),),
          eval_fraction=0.3,
          processes=1,
          progress=False,
      )
  )
  for key in ("documents", "sentences", "tokens", "input_bytes"):
    assert meta[key] == local[key]
  held_out = sum(s["documents"] for s in meta["shards"] if s["split"] == "eval")
  assert held_out == sum(s["documents"] for s in local["shards"] if s["split"] == "eval") > 0


@pytest.mark.slow
def test_wordpiece_word_segmenter_arrow_and_zstd_in_process(tmp_path, monkeypatch, capsys):
  """Chinese through a WordPiece vocabulary and jieba's words, from text, an Arrow file and
  zstandard JSON lines, on the in-process runner: the same records as the local path."""
  import pyarrow as pa
  import zstandard

  docs = (REPO / "data" / "chinese" / "corpus.txt").read_text().split("\n\n")[:40]
  chars = sorted({c for d in docs for c in d if not c.isspace()})
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  (tmp_path / "vocab.txt").write_text("\n".join(specials + chars) + "\n")
  (tmp_path / "zh.txt").write_text("\n\n".join(docs[:20]) + "\n")
  with pa.ipc.new_stream(str(tmp_path / "zh.arrow"), pa.schema([("text", pa.string())])) as w:
    w.write_table(pa.table({"text": docs[20:30]}))
  lines = "".join(json.dumps({"text": d}) + "\n" for d in docs[30:])
  (tmp_path / "zh.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
  cfg = prepare.PrepareConfig(
      output=str(tmp_path / "local"),
      tokenizer=str(tmp_path / "vocab.txt"),
      inputs=tuple(str(tmp_path / n) for n in ("zh.txt", "zh.arrow", "zh.jsonl.zst")),
      num_shards=2,
      eval_fraction=0.2,
      processes=1,
      progress=False,
      word_segmenter="jieba",
  )
  local = prepare.prepare(cfg)
  monkeypatch.setattr(beam_prepare, "PROGRESS_S", 0.0)  # every task: the progress line
  capsys.readouterr()
  beam = beam_prepare.prepare(
      dataclasses.replace(cfg, output=str(tmp_path / "beam")),
      ["direct_running_mode=in_memory"],
      split_bytes=4000,
  )
  assert f"a worker has done {beam['documents']} documents" in capsys.readouterr().err
  for key in ("documents", "tokens", "skipped", "repaired", "warnings", "word_segmenter"):
    assert beam[key] == local[key], key
  assert beam["tokenizer"] == local["tokenizer"] and beam["tokenizer"]["type"] == "wordpiece"
  for split in records.SPLITS:
    assert _documents(str(tmp_path / "beam"), split) == _documents(str(tmp_path / "local"), split)
