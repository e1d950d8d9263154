"""`bertjax prepare`: bad input never crashes nor loses good text; workers; eval split; TFDS."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bertjax import cli, errors
from bertjax.commands import args as args_lib, prepare as prepare_cmd
from bertjax.data import corpus, encode, prepare, records, text, tokenizer as tok_lib
from bertjax.data import tokenizer_train as tok_train

REPO = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER = str(REPO / "data" / "tokenizer.model")
GOOD_DOCS = [
    [
        "Emma Woodhouse, handsome, clever, and rich, had lived nearly twenty-one years.",
        "She was the youngest of the two daughters of a most affectionate father.",
    ],
    ["Sir Walter Elliot never took up any book but the Baronetage.", "There he found occupation."],
    [
        "It is a truth universally acknowledged.",
        "However little known the feelings may be.",
        "This truth is so well fixed in the minds of the surrounding families.",
    ],
]


def _bert_format(docs, newline="\n") -> str:
  return (newline * 2).join(newline.join(d) for d in docs) + newline


def _bad_corpus(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """One file per kind of bad input; each also carries good sentences that must survive."""
  files = {
      "good": _bert_format(GOOD_DOCS).encode(),
      "empty": b"",
      "blank": b"\n  \n\t\n\n",
      "utf8": _bert_format(GOOD_DOCS[:2]).encode().replace(b"Sir Walter", b"Sir \xff\xfeWalter"),
      "nul": _bert_format(GOOD_DOCS[1:]).encode().replace(b"There he", b"There\x00 he"),
      "crlf": _bert_format(GOOD_DOCS, newline="\r\n").encode(),
      "bom": b"\xef\xbb\xbf"
      + _bert_format(GOOD_DOCS[:1]).encode()
      + b"\n"
      + _bert_format(GOOD_DOCS[2:]).encode(),
      "long": (
          _bert_format(GOOD_DOCS[:1])
          + "\n"
          + "x" * (1 << 20)
          + "\n\n"
          + _bert_format(GOOD_DOCS[1:2])
      ).encode(),
      "single": "\n".join(GOOD_DOCS[2]).encode() + b"\n",
  }
  paths = {}
  for name, data in files.items():
    paths[name] = root / f"{name}.txt"
    paths[name].write_bytes(data)
  return paths


def _decoded_docs(out: pathlib.Path, split: str = "train") -> list[list[str]]:
  tok = tok_lib.SentencePieceTokenizer(out / "tokenizer.model")
  meta = records.load_metadata(out)
  docs = []
  for shard in records.split_shards(meta, out, split):
    for doc in records.read_documents(shard["path"]):
      docs.append([tok.decode(s) for s in doc])
  return docs


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("bad")
  paths = _bad_corpus(root)
  out = root / "out"
  cfg = prepare.PrepareConfig(
      output=str(out),
      tokenizer=TOKENIZER,
      inputs=(str(root / "*.txt"),),
      num_shards=3,
      processes=1,
      max_line_chars=10_000,
      max_reports=50,
      progress=False,
  )
  meta = prepare.prepare(cfg)
  return paths, out, meta


def test_bad_input_is_counted(bad_run):
  _, out, meta = bad_run
  assert meta == json.loads((out / "metadata.json").read_text()) | {}
  assert meta["skipped"] == {text.EMPTY_FILE: 1, text.BLANK_FILE: 1}
  repaired = meta["repaired"]
  assert repaired[text.INVALID_UTF8] == 1
  assert repaired[text.NUL_BYTES] == 1
  assert repaired[text.CRLF] == 1  # counted once per file, not per line
  assert repaired[text.BOM] == 1
  assert repaired[text.LONG_LINE] == 1
  assert meta["warnings"] == {text.SINGLE_DOCUMENT: 1}
  assert meta["tokenizer"]["sha256"] == tok_lib.SentencePieceTokenizer(TOKENIZER).sha256
  assert meta["tokenizer"]["vocab_size"] == tok_lib.SentencePieceTokenizer(TOKENIZER).vocab_size
  assert sum(s["documents"] for s in meta["shards"]) == meta["documents"]
  assert sum(s["tokens"] for s in meta["shards"]) == meta["tokens"]


def test_bad_input_reports_file_and_line(bad_run):
  paths, _, meta = bad_run
  reports = meta["examples_of_problems"]
  # "Sir Walter" is on line 4 of utf8.txt (2 sentences, blank line, then line 4).
  assert f"{paths['utf8']}:4: {text.INVALID_UTF8}" in reports
  assert f"{paths['nul']}:2: {text.NUL_BYTES}" in reports
  assert f"{paths['long']}:4: {text.LONG_LINE}" in reports
  assert f"{paths['empty']}: {text.EMPTY_FILE}" in reports


def test_bad_input_keeps_all_good_text(bad_run):
  _, out, meta = bad_run
  sentences = {s for doc in _decoded_docs(out) for s in doc}
  for doc in GOOD_DOCS:
    for sentence in doc:
      assert sentence in sentences
  # The line with invalid bytes is kept (SentencePiece's normaliser drops the U+FFFD).
  every = [s for doc in _decoded_docs(out) for s in doc]
  assert every.count(GOOD_DOCS[1][0]) == 5  # good, utf8, nul, crlf and long files
  assert not any("\x00" in s or "\ufeff" in s or "\r" in s for s in sentences)
  # The 1 MB line was split, not dropped: its characters are all there.
  assert sum(s.count("x") for s in every) >= 1 << 20
  # good 3 + utf8 2 + nul 2 + crlf 3 + bom 2 + long 2 (+1 for the split line) + single 1.
  assert meta["documents"] == 3 + 2 + 2 + 3 + 2 + 3 + 1


@pytest.mark.slow
def test_output_independent_of_processes_and_chunking(bad_run, tmp_path):
  paths, out, _ = bad_run
  cfg = prepare.PrepareConfig(
      output=str(tmp_path / "p2"),
      tokenizer=TOKENIZER,
      inputs=tuple(str(p) for p in sorted(paths.values())),
      num_shards=3,
      processes=2,
      chunk_bytes=1 << 17,
      max_line_chars=10_000,
      progress=False,
  )
  prepare.prepare(cfg)
  # Same set of documents; shard order may differ as the file order does.
  assert sorted(map(tuple, _decoded_docs(tmp_path / "p2"))) == sorted(
      map(tuple, _decoded_docs(out))
  )


def test_small_chunks_keep_line_numbers(tmp_path):
  lines = [f"Sentence number {i} is here." for i in range(200)]
  body = "\n\n".join("\n".join(lines[i : i + 4]) for i in range(0, 200, 4)) + "\n"
  body = body.replace("number 150 ", "number 150 \x00")
  (tmp_path / "a.txt").write_text(body)
  meta = prepare.prepare(
      prepare.PrepareConfig(
          output=str(tmp_path / "out"),
          tokenizer=TOKENIZER,
          inputs=(str(tmp_path / "a.txt"),),
          num_shards=2,
          processes=1,
          chunk_bytes=100,
          progress=False,
      )
  )
  line = body.splitlines().index("Sentence number 150 \x00is here.") + 1
  assert meta["examples_of_problems"] == [f"{tmp_path / 'a.txt'}:{line}: {text.NUL_BYTES}"]
  assert meta["documents"] == 50 and meta["sentences"] == 200


def test_workers_split_the_input_and_metadata_merges(tmp_path):
  body = _bert_format(GOOD_DOCS * 20)
  (tmp_path / "a.txt").write_text(body)
  out = tmp_path / "out"
  for k in range(2):
    rc = prepare_cmd.main(
        [
            "--input",
            str(tmp_path / "a.txt"),
            "--tokenizer",
            TOKENIZER,
            "--output",
            str(out),
            "--num-shards",
            "2",
            "--worker-index",
            str(k),
            "--num-workers",
            "2",
            "--processes",
            "1",
            "--eval-fraction",
            "0",
            "--no-progress",
        ]
    )
    assert rc == 0
    if k == 0:  # one worker's part alone is an incomplete dataset
      with pytest.raises(FileNotFoundError, match=r"workers \[1\] of 2"):
        records.load_metadata(out)
  meta = records.load_metadata(out)
  assert meta["documents"] == 60 == sum(s["documents"] for s in meta["shards"])
  # Shards that got no document are not written (here: worker 1 got no chunk).
  names = {records.shard_name("train", i, 4) for i in range(4)}
  assert {s["file"] for s in meta["shards"]} <= names
  assert all(s["documents"] > 0 and (out / s["file"]).is_file() for s in meta["shards"])
  assert sorted(p.name for p in out.glob("*.tfrecord")) == sorted(s["file"] for s in meta["shards"])
  assert sorted(map(tuple, _decoded_docs(out))) == sorted(map(tuple, GOOD_DOCS * 20))


def test_eval_split_is_disjoint_and_stable(tmp_path):
  docs = [[f"Document {i} opens here.", f"Document {i} closes there."] for i in range(200)]
  (tmp_path / "a.txt").write_text(_bert_format(docs))
  metas = []
  for name in ("x", "y"):
    metas.append(
        prepare.prepare(
            prepare.PrepareConfig(
                output=str(tmp_path / name),
                tokenizer=TOKENIZER,
                inputs=(str(tmp_path / "a.txt"),),
                num_shards=2,
                eval_fraction=0.2,
                eval_shards=2,
                processes=1,
                progress=False,
            )
        )
    )
  train, held = _decoded_docs(tmp_path / "x"), _decoded_docs(tmp_path / "x", "eval")
  assert 20 <= len(held) <= 60 and len(train) + len(held) == 200
  assert not set(map(tuple, train)) & set(map(tuple, held))
  assert sorted(map(tuple, _decoded_docs(tmp_path / "y", "eval"))) == sorted(map(tuple, held))
  assert {s["split"] for s in metas[0]["shards"]} == {"train", "eval"}


def test_chinese_text(tmp_path):
  chinese = REPO / "tests" / "fixtures" / "data" / "chinese.txt"
  tok_train.train_tokenizer(
      [str(chinese)], str(tmp_path / "zh"), tok_train.TrainOptions(num_threads=1)
  )
  meta = prepare.prepare(
      prepare.PrepareConfig(
          output=str(tmp_path / "out"),
          tokenizer=str(tmp_path / "zh.model"),
          inputs=(str(chinese),),
          num_shards=1,
          processes=1,
          progress=False,
      )
  )
  assert meta["documents"] == 4 and meta["skipped"] == {} and meta["repaired"] == {}
  docs = _decoded_docs(tmp_path / "out")
  assert "学而时习之,不亦说乎?" in [s for d in docs for s in d]


def test_cli_errors_are_one_line(tmp_path, capsys):
  rc = cli.main(
      [
          "prepare",
          "--input",
          str(tmp_path / "none.txt"),
          "--tokenizer",
          TOKENIZER,
          "--output",
          str(tmp_path / "o"),
          "--no-progress",
      ]
  )
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err == f"bertjax prepare: {tmp_path / 'none.txt'}: no such file"
  (tmp_path / "a.txt").write_text("Hello there.\n")
  (tmp_path / "bad.model").write_text("Hello there.\n")
  rc = cli.main(
      [
          "prepare",
          "--input",
          str(tmp_path / "a.txt"),
          "--tokenizer",
          str(tmp_path / "bad.model"),
          "--output",
          str(tmp_path / "o"),
      ]
  )
  err = capsys.readouterr().err.strip()
  assert rc == 2 and "not a SentencePiece model" in err and len(err.splitlines()) == 1
  # A .txt is taken for a WordPiece vocab.txt, and checked as one.
  rc = cli.main(
      [
          "prepare",
          "--input",
          str(tmp_path / "a.txt"),
          "--tokenizer",
          str(tmp_path / "a.txt"),
          "--output",
          str(tmp_path / "o"),
      ]
  )
  err = capsys.readouterr().err.strip()
  assert rc == 2 and "special token [PAD] is missing" in err and len(err.splitlines()) == 1
  assert not (tmp_path / "o").exists()  # every check runs before the output is created


def test_tfds_mock_corpus(tmp_path):
  import tensorflow as tf
  import tensorflow_datasets as tfds

  texts = [
      "Mr. Darcy danced. He did not smile!\nA new paragraph starts here.",
      "道可道，非常道。名可名，非常名。",
      "",
      "One more document. It has two sentences.",
  ]

  def as_dataset(self, split, *args, **kwargs):
    del self, split, args, kwargs
    return tf.data.Dataset.from_tensor_slices({"text": texts, "title": ["t"] * len(texts)})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    meta = prepare.prepare(
        prepare.PrepareConfig(
            output=str(tmp_path / "out"),
            tokenizer=TOKENIZER,
            tfds="wikipedia/20230601.en",
            tfds_data_dir=str(tmp_path / "tfds"),
            num_shards=2,
            processes=1,
            progress=False,
        )
    )
  assert meta["documents"] == 3 and meta["inputs"] == ["tfds:wikipedia/20230601.en"]
  docs = _decoded_docs(tmp_path / "out")
  assert ["Mr. Darcy danced.", "He did not smile!", "A new paragraph starts here."] in docs
  assert ["One more document.", "It has two sentences."] in docs
  assert any(len(d) == 2 and d[0].endswith("。") for d in docs)  # Chinese split at 。


def test_tfds_default_mock_data(tmp_path):
  import tensorflow_datasets as tfds

  with tfds.testing.mock_data(num_examples=12):
    meta = prepare.prepare(
        prepare.PrepareConfig(
            output=str(tmp_path / "out"),
            tokenizer=TOKENIZER,
            tfds="wikipedia/20230601.en:train",
            num_shards=2,
            processes=1,
            progress=False,
        )
    )
  assert 0 < meta["documents"] <= 12 and meta["tokens"] > 0


def test_shards_are_standard_tfrecords_of_tf_examples(bad_run):
  import tensorflow as tf

  _, out, meta = bad_run
  spec = {
      "token_ids": tf.io.RaggedFeature(tf.int64),
      "sentence_lengths": tf.io.RaggedFeature(tf.int64),
  }
  for shard in records.split_shards(meta, out, "train"):
    ours = list(records.read_documents(shard["path"]))
    theirs = [
        tf.io.parse_single_example(x, spec)  # checks the CRCs too
        for x in tf.data.TFRecordDataset(shard["path"])
    ]
    assert len(ours) == len(theirs) == shard["documents"]
    for doc, ex in zip(ours, theirs):
      assert [len(s) for s in doc] == list(ex["sentence_lengths"].numpy())
      assert list(np.concatenate(doc)) == list(ex["token_ids"].numpy())


def test_record_reader_skips_and_detects_truncation(tmp_path):
  docs = [[[i, i + 1], [7]] for i in range(5, 30)]
  path = tmp_path / "x.tfrecord"
  path.write_bytes(b"".join(records.frame_record(records.encode_document(d)) for d in docs))
  got = [[list(s) for s in d] for d in records.read_documents(str(path), start=20)]
  assert got == docs[20:]
  path.write_bytes(path.read_bytes()[:-3])
  with pytest.raises(ValueError, match="truncated record 24"):
    list(records.read_documents(str(path)))


def _doc_numbers(out: pathlib.Path) -> list[list[int]]:
  """Per train shard, the numbers of its "Document N ..." documents in shard order."""
  tok = tok_lib.SentencePieceTokenizer(out / "tokenizer.model")
  meta = records.load_metadata(out)
  return [
      [int(tok.decode(doc[0]).split()[1]) for doc in records.read_documents(s["path"])]
      for s in records.split_shards(meta, out, "train")
  ]


@pytest.mark.slow
def test_documents_are_shuffled_over_the_corpus_and_seeded(tmp_path):
  docs = [[f"Document {i} opens here.", f"Document {i} closes there."] for i in range(300)]
  (tmp_path / "a.txt").write_text(_bert_format(docs[:150]))
  (tmp_path / "b.txt").write_text(_bert_format(docs[150:]))

  def run(name, **kw):
    prepare.prepare(
        prepare.PrepareConfig(
            **{
                "output": str(tmp_path / name),
                "tokenizer": TOKENIZER,
                "num_shards": 2,
                "inputs": (str(tmp_path / "a.txt"), str(tmp_path / "b.txt")),
                "eval_fraction": 0,
                "processes": 1,
                "progress": False,
                **kw,
            }
        )
    )
    return _doc_numbers(tmp_path / name)

  shards = run("x")
  assert sorted(n for s in shards for n in s) == list(range(300))
  # Any run of consecutive documents (a stream block) is a random sample of the corpus,
  # both files included, not neighbouring documents: 25 uniform draws of 300 span ~270.
  for shard in shards:
    for start in range(0, len(shard) - 25, 25):
      block = shard[start : start + 25]
      assert max(block) - min(block) > 150 and min(block) < 150 <= max(block)
  assert run("same") == shards
  assert run("other", seed=1) != shards
  # The same order whatever the processes and chunks, and through oversized piles that are
  # scattered again (tiny shuffle_bytes); nothing temporary is left behind.
  assert run("p2", processes=2, chunk_bytes=1 << 10) == shards
  assert sorted(n for s in run("tiny", shuffle_bytes=64) for n in s) == list(range(300))
  assert not list((tmp_path / "tiny").glob(".*"))


def test_reprepare_needs_overwrite_and_replaces_the_old_shards(tmp_path, capsys):
  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS * 4))
  args = [
      "--input",
      str(tmp_path / "a.txt"),
      "--tokenizer",
      TOKENIZER,
      "--output",
      str(tmp_path / "o"),
      "--processes",
      "1",
      "--eval-fraction",
      "0",
      "--no-progress",
  ]
  assert prepare_cmd.main(args + ["--num-shards", "4"]) == 0
  capsys.readouterr()
  assert cli.main(["prepare", *args, "--num-shards", "2"]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (
      f"bertjax prepare: --output {tmp_path / 'o'} already holds prepared data "
      "(metadata.json) — pass --overwrite to replace it, or choose another --output"
  )
  assert len(records.load_metadata(tmp_path / "o")["shards"]) == 4  # left as it was
  assert prepare_cmd.main(args + ["--num-shards", "2", "--overwrite"]) == 0
  meta = records.load_metadata(tmp_path / "o")
  # Only the new shards remain, and nothing temporary.
  assert (
      sorted(p.name for p in (tmp_path / "o").glob("*.tfrecord"))
      == sorted(s["file"] for s in meta["shards"])
      and len(meta["shards"]) == 2
  )
  assert not list((tmp_path / "o").glob(".*"))


def test_interrupted_prepare_leaves_no_shards_and_keeps_old_data(tmp_path, monkeypatch):
  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS * 4))
  out = tmp_path / "o"

  def run(**kw):
    prepare.prepare(
        prepare.PrepareConfig(
            output=str(out),
            tokenizer=TOKENIZER,
            inputs=(str(tmp_path / "a.txt"),),
            num_shards=2,
            eval_fraction=0,
            processes=1,
            progress=False,
            **kw,
        )
    )

  calls = []
  real_encode = records.encode_document

  def encode_then_crash(doc):
    calls.append(1)
    if len(calls) == 5:
      raise RuntimeError("interrupted")
    return real_encode(doc)

  monkeypatch.setattr(records, "encode_document", encode_then_crash)
  with pytest.raises(RuntimeError):
    run()
  # Shards are written elsewhere and moved in at the end: an interrupted run leaves none.
  assert not list(out.glob("*.tfrecord")) and not (out / "metadata.json").exists()
  assert not list(out.glob(".*"))
  monkeypatch.setattr(records, "encode_document", real_encode)
  run()
  before = _decoded_docs(out)
  calls.clear()
  monkeypatch.setattr(records, "encode_document", encode_then_crash)
  with pytest.raises(RuntimeError):
    run(overwrite=True)
  assert _decoded_docs(out) == before  # the old data is untouched


@pytest.mark.parametrize("compress", ["gzip", "bz2", "lzma"])
def test_compressed_inputs_are_decompressed_by_content(tmp_path, compress):
  import importlib

  body = _bert_format(GOOD_DOCS).encode()
  (tmp_path / "plain.txt").write_bytes(body)
  (tmp_path / "packed.txt").write_bytes(importlib.import_module(compress).compress(body))
  for name in ("plain", "packed"):
    meta = prepare.prepare(
        prepare.PrepareConfig(
            output=str(tmp_path / name),
            tokenizer=TOKENIZER,
            inputs=(str(tmp_path / f"{name}.txt"),),
            num_shards=1,
            eval_fraction=0,
            processes=1,
            progress=False,
        )
    )
    assert meta["repaired"] == {} and meta["documents"] == 3
  assert _decoded_docs(tmp_path / "packed") == _decoded_docs(tmp_path / "plain")


def test_binary_file_is_skipped_and_counted(tmp_path, capsys):
  rng = np.random.default_rng(0)
  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS))
  (tmp_path / "b.bin").write_bytes(rng.integers(0, 256, 100_000, np.uint8).tobytes())
  meta = prepare.prepare(
      prepare.PrepareConfig(
          output=str(tmp_path / "o"),
          tokenizer=TOKENIZER,
          inputs=(str(tmp_path / "a.txt"), str(tmp_path / "b.bin")),
          num_shards=1,
          eval_fraction=0,
          processes=1,
          progress=False,
      )
  )
  assert meta["skipped"] == {text.BINARY_FILE: 1} and meta["repaired"] == {}
  assert meta["documents"] == 3
  assert capsys.readouterr().err.splitlines() == [
      f"prepare: {tmp_path / 'b.bin'}: {text.BINARY_FILE}"
  ]


def test_huge_documents_and_lines_are_cut_by_content_not_by_reads(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus, "MAX_DOC_BYTES", 1 << 16)
  words = " ".join(f"word{i}" for i in range(40_000))  # a ~390 KB line with spaces
  many = "\n".join(f"Line {i} of a long document." for i in range(6_000))  # ~170 KB, no blank
  body = (
      "\n\n".join(
          [
              "\n".join(GOOD_DOCS[0]),
              words + "\nShort tail.",
              many,
              "\u6f22" * 50_000,
              "\n".join(GOOD_DOCS[1]),
          ]
      )
      + "\n"
  )  # 150 KB, no space
  (tmp_path / "a.txt").write_text(body)

  def documents(chunk_bytes):
    cfg = prepare.PrepareConfig(
        output="",
        tokenizer="",
        inputs=(str(tmp_path / "a.txt"),),
        chunk_bytes=chunk_bytes,
        max_line_chars=1_000,
    )
    docs, problems = [], []
    for task in corpus.Tasks(cfg):
      assert len(task.data) <= chunk_bytes + (1 << 16)
      found = []
      docs += [
          [(task.first_line + n, s) for n, s in doc] for doc in encode.documents(task, cfg, found)
      ]
      problems += [(task.first_line + p.line, p.reason) for p in found]
    return docs, problems

  docs, problems = documents(4 << 20)
  assert all(sum(len(s.encode()) for _, s in d) <= 1 << 16 for d in docs)
  # Each long line is split and counted once, at its own line; nothing is lost or garbled.
  assert problems == [(4, text.LONG_LINE), (6008, text.LONG_LINE)]
  assert "".join(s for d in docs for _, s in d).replace(" ", "") == body.replace(" ", "").replace(
      "\n", ""
  )
  assert docs[-1] == [(6010, GOOD_DOCS[1][0]), (6011, GOOD_DOCS[1][1])]
  for chunk_bytes in (1 << 10, 3 << 14, 1 << 20):
    assert documents(chunk_bytes) == (docs, problems)


# Runs a command and prints the peak RSS (KB) of its process tree's largest process.
_PEAK_RSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


@pytest.mark.slow
def test_memory_is_flat_for_a_50_mb_line(tmp_path):
  sentence = b"It is a truth universally acknowledged, that a single man must want a wife. "
  (tmp_path / "small.txt").write_bytes(sentence * 100)
  (tmp_path / "huge.txt").write_bytes(sentence * ((50 << 20) // len(sentence)))

  def peak_mb(name):
    cmd = [
        sys.executable,
        "-m",
        "bertjax.cli",
        "prepare",
        "--input",
        str(tmp_path / f"{name}.txt"),
        "--tokenizer",
        TOKENIZER,
        "--output",
        str(tmp_path / name),
        "--processes",
        "1",
        "--no-progress",
    ]
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, *cmd], check=True, capture_output=True, text=True
    ).stdout
    return int(out.split()[-1]) / 1024

  growth = peak_mb("huge") - peak_mb("small")
  # Measured: ~35 MB; ~1.2 GB before prepare cut long documents and lines.
  assert growth < 100, f"peak RSS grew by {growth:.0f} MB on a 50 MB line"
  meta = records.load_metadata(tmp_path / "huge")
  assert meta["repaired"] == {text.LONG_LINE: 1} and meta["input_bytes"] > 50e6


def test_pretrain_refuses_shards_missing_or_not_their_recorded_size(tmp_path):
  """metadata.json records each shard's size; a shard truncated or deleted after prepare
  (an interrupted copy) stops pretraining with the file named, before any training."""
  from bertjax.training import config_checks
  from experiments import pretrain as pretrain_exp

  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS * 4))
  out = tmp_path / "o"
  assert (
      prepare_cmd.main(
          [
              "--input",
              str(tmp_path / "a.txt"),
              "--tokenizer",
              TOKENIZER,
              "--output",
              str(out),
              "--processes",
              "1",
              "--num-shards",
              "2",
              "--eval-fraction",
              "0",
              "--no-progress",
          ]
      )
      == 0
  )
  meta = records.load_metadata(out)
  assert all(s["bytes"] == (out / s["file"]).stat().st_size for s in meta["shards"])
  records.check_shards(meta, out)
  config = pretrain_exp.get_config("tiny")
  config.data.path = str(out)
  shard = out / meta["shards"][0]["file"]
  shard.write_bytes(shard.read_bytes()[:-3])
  with pytest.raises(
      errors.BadInputError, match=rf"{shard.name}: .* bytes, but metadata.json records"
  ):
    config_checks.preflight(config, str(tmp_path / "run"))
  shard.unlink()
  with pytest.raises(errors.InputNotFoundError, match=rf"{shard.name}: missing"):
    config_checks.preflight(config, str(tmp_path / "run"))


# ----------------------------------------------------------------------------- checks first


def _cfg(tmp_path, **kw) -> prepare.PrepareConfig:
  base = dict(
      output=str(tmp_path / "out" / "data"),
      tokenizer=TOKENIZER,
      inputs=(str(tmp_path / "a.txt"),),
      num_shards=1,
      processes=1,
      progress=False,
  )
  return prepare.PrepareConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("num_shards", 0, "PrepareConfig.num_shards=0 must be an integer >= 1"),
        ("eval_shards", -1, "PrepareConfig.eval_shards=-1"),
        ("processes", 0, "PrepareConfig.processes=0"),
        ("max_line_chars", 0, "PrepareConfig.max_line_chars=0"),
        ("eval_fraction", 1.0, "PrepareConfig.eval_fraction=1.0 must be >= 0 and < 1"),
        ("eval_fraction", -0.1, "PrepareConfig.eval_fraction=-0.1"),
        ("worker_index", 2, "PrepareConfig.worker_index=2 must be >= 0 and < PrepareConfig.num_"),
        ("tfds", "wikipedia", "PrepareConfig.inputs (text files) and PrepareConfig.tfds"),
    ],
)
def test_config_errors_name_the_field_and_write_nothing(tmp_path, field, value, needle):
  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS))
  with pytest.raises(errors.ConfigError) as e:
    prepare.prepare(_cfg(tmp_path, **{field: value}))
  assert needle in str(e.value) and "--" not in str(e.value)
  assert not (tmp_path / "out").exists()


def test_the_command_names_flags_for_config_fields(tmp_path):
  names = args_lib.flag_names(prepare_cmd._parser(), "PrepareConfig", {"input": "inputs"})
  e = args_lib.reword(
      errors.ConfigError(
          "PrepareConfig.worker_index=2 must be < PrepareConfig.num_workers=2; pass "
          "PrepareConfig.overwrite=True, PrepareConfig.inputs or PrepareConfig.tfds_data_dir"
      ),
      names,
  )
  assert str(e) == (
      "--worker-index 2 must be < --num-workers 2; pass --overwrite, --input or --tfds-data-dir"
  )
  assert isinstance(e, errors.ConfigError)


@pytest.mark.parametrize(
    "files, needle",
    [
        ({"a.txt": b""}, f"a.txt: {text.EMPTY_FILE}"),
        ({"a.txt": b"\n \n\t\n"}, f"a.txt: {text.BLANK_FILE}"),
        ({"a.txt": bytes(range(256)) * 64}, f"a.txt: {text.BINARY_FILE}"),
        ({"a.txt": b"", "b.txt": b"\n\n"}, f"a.txt: {text.EMPTY_FILE}; "),
    ],
)
def test_a_corpus_without_documents_is_an_error_and_writes_nothing(tmp_path, capsys, files, needle):
  for name, data in files.items():
    (tmp_path / name).write_bytes(data)
  args = ["prepare", "--input", *[str(tmp_path / n) for n in files], "--tokenizer", TOKENIZER]
  args += ["--output", str(tmp_path / "out" / "data"), "--processes", "1", "--no-progress"]
  assert cli.main(args) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("bertjax prepare: no document in the input (") and needle in err, err
  assert len(err.splitlines()) == 1
  assert not (tmp_path / "out").exists()  # the directories it made for the output are gone


def test_a_corpus_without_documents_leaves_an_existing_output_as_it_was(tmp_path):
  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS))
  prepare.prepare(_cfg(tmp_path))
  out = tmp_path / "out" / "data"
  before = sorted(p.name for p in out.iterdir())
  (tmp_path / "a.txt").write_text("\n\n")
  with pytest.raises(errors.BadInputError, match=text.BLANK_FILE):
    prepare.prepare(_cfg(tmp_path, overwrite=True))
  assert sorted(p.name for p in out.iterdir()) == before


def test_input_and_output_paths_are_checked_first(tmp_path):
  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS))
  (tmp_path / "dir").mkdir()
  with pytest.raises(errors.InputNotFoundError, match=r"dir: is a directory — name its files"):
    prepare.prepare(_cfg(tmp_path, inputs=(str(tmp_path / "dir"),)))
  with pytest.raises(errors.InputNotFoundError, match=r"nothing\*.txt: no file matches"):
    prepare.prepare(_cfg(tmp_path, inputs=(str(tmp_path / "nothing*.txt"),)))
  with pytest.raises(errors.ConfigError, match=r"a.txt is a file, not a directory"):
    prepare.prepare(_cfg(tmp_path, output=str(tmp_path / "a.txt" / "out")))
  assert not (tmp_path / "out").exists()


def test_a_corrupt_compressed_input_names_the_file(tmp_path):
  import gzip

  (tmp_path / "a.txt").write_bytes(gzip.compress(_bert_format(GOOD_DOCS * 50).encode())[:300])
  with pytest.raises(errors.BadInputError, match=r"a.txt.*unreadable input .* gzip -t"):
    prepare.prepare(_cfg(tmp_path))
  assert not (tmp_path / "out").exists()


def test_more_shards_than_open_files_allow_is_refused_before_writing(tmp_path):
  resource = pytest.importorskip("resource")
  _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if hard == resource.RLIM_INFINITY or hard > 1 << 24:
    pytest.skip("no finite limit on open files here")
  (tmp_path / "a.txt").write_text(_bert_format(GOOD_DOCS))
  with pytest.raises(errors.ConfigError, match=r"num_shards=.*ulimit -n"):
    prepare.prepare(_cfg(tmp_path, num_shards=hard))
  assert not (tmp_path / "out").exists()


def test_tfds_without_the_text_feature_is_refused_before_writing(tmp_path):
  import tensorflow as tf
  import tensorflow_datasets as tfds

  def as_dataset(self, split, *args, **kwargs):
    del self, split, args, kwargs
    return tf.data.Dataset.from_tensor_slices({"body": ["One document."], "title": ["t"]})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    with pytest.raises(errors.ConfigError, match=r"tfds_text_key=text: .* has body, title"):
      prepare.prepare(_cfg(tmp_path, inputs=(), tfds="wikipedia/20230601.en"))
  assert not (tmp_path / "out").exists()
