"""`bertjax.bench.input`: the input benchmark's spec checks and a small run on prepared shards.

No timing thresholds (the machine is shared): only the shape of the results and the relations
that hold at any speed.
"""

import pathlib

import pytest

from bertjax import errors
from bertjax.bench import input as input_bench


@pytest.mark.parametrize(
    "fields, kind, needle",
    [
        (dict(copies=0), errors.ConfigError, "InputBenchSpec.copies=0 must be >= 1"),
        (dict(steps=-3), errors.ConfigError, "InputBenchSpec.steps=-3"),
        (dict(readers=("arrow",)), errors.ConfigError, "unknown reader 'arrow' — valid: tf.data"),
        (dict(readers=()), errors.ConfigError, "none given"),
    ],
)
def test_spec_rejects_bad_values(fields, kind, needle):
  with pytest.raises(kind, match=needle):
    input_bench.InputBenchSpec(**fields)


def test_missing_inputs_are_named_before_any_work(tmp_path):
  work = tmp_path / "work"
  spec = input_bench.InputBenchSpec(corpus=str(tmp_path / "nope.txt"), workdir=str(work))
  with pytest.raises(errors.InputNotFoundError, match="InputBenchSpec.corpus=.*nope.txt"):
    input_bench.run(spec)
  assert not work.exists()  # nothing created
  with pytest.raises(errors.InputNotFoundError, match="InputBenchSpec.data=.*no metadata.json"):
    input_bench.run(input_bench.InputBenchSpec(data=str(tmp_path)))
  spec = input_bench.InputBenchSpec(google_bert_dir=str(tmp_path))
  with pytest.raises(errors.InputNotFoundError, match="create_pretraining_data.py"):
    input_bench.run(spec)


@pytest.mark.slow
def test_read_and_stream_prepared_shards(austen_shards):
  spec = input_bench.InputBenchSpec(data=str(austen_shards), batch=4, steps=3, readers=("python",))
  r = input_bench.run(spec)
  assert set(r) == {"cpu_cores", "read", "stream"}
  (read,) = r["read"]
  assert read["reader"] == "python" and read["documents"] > 0 and read["tokens"] > 0
  assert [(s["seq_len"], s["batch"], s["steps"]) for s in r["stream"]] == [(128, 4, 3), (512, 4, 3)]
  assert all(s["examples_per_s"] > 0 for s in r["stream"])


def test_corpus_copies(tmp_path):
  src = tmp_path / "a.txt"
  src.write_bytes(b"one\n\ntwo\n")
  out = tmp_path / "b.txt"
  assert input_bench.make_corpus(src, 3, out) == 27
  assert out.read_bytes() == b"one\n\ntwo\n" * 3
  assert pathlib.Path(input_bench.InputBenchSpec().corpus).name == "austen.txt"


def test_host_needs_follow_the_bound_of_the_slice():
  from bertjax.commands import pretrain
  from bertjax.training import flops

  config = pretrain.load_config("base")
  p1, p2 = input_bench.host_needs(config, "v4-32")
  assert (p1["seq_len"], p2["seq_len"], p1["hosts"]) == (128, 512, 4)
  assert p1["bound_ms"] == pytest.approx(4.07, abs=0.01)  # docs/performance.md: 4.1 ms
  # 256 rows per bound step, shared by 4 hosts
  assert p1["rows_per_s_per_host_at_bound"] == pytest.approx(256 / 4.07e-3 / 4, rel=1e-2)
  v6e, _ = input_bench.host_needs(config, "v6e-16")  # 16 faster chips, 4 hosts
  ratio = flops.PEAK_FLOPS["TPU v6e"] / flops.PEAK_FLOPS["TPU v4"]
  assert v6e["rows_per_s_per_host_at_bound"] == pytest.approx(
      p1["rows_per_s_per_host_at_bound"] * ratio, rel=1e-3
  )
  with pytest.raises(errors.ConfigError, match="--accelerator 'v9-3'"):
    input_bench.host_needs(config, "v9-3")


def test_host_check_flags_go_together(capsys):
  from bertjax import cli

  code = cli.main(["bench", "input", "--config", "base"])
  assert code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
      "bertjax bench: --config and --accelerator go together — add --accelerator TYPE (e.g. v4-32)"
  ]


def test_the_same_documents_in_every_format_prepare_to_the_same_tokens(tmp_path):
  """`--formats`: text, JSON lines (plain and gzip) and Parquet hold the same documents, and
  prepare makes the same tokens of the records (within 1% of the text's, whose sentences are its
  lines); the profile's shares cover the whole time."""
  from etils import epath

  from bertjax.data import records

  chapters = (input_bench.REPO / "data" / "austen.txt").read_text().split("\n\n")[:12]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n\n".join(chapters) + "\n")
  paths = input_bench.write_formats(
      epath.Path(corpus), 2, epath.Path(tmp_path), input_bench.FORMATS
  )
  assert list(paths) == list(input_bench.FORMATS)
  tokens = {}
  for fmt, path in paths.items():
    shares = input_bench.profile_prepare(
        path, input_bench.InputBenchSpec().tokenizer, tmp_path / fmt
    )
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    assert shares["tokenize (sentencepiece)"] > 0.05, shares
    meta = records.load_metadata(tmp_path / fmt)
    assert meta["documents"] == 24, fmt
    tokens[fmt] = meta["tokens"]
  text = tokens.pop("text")
  assert len(set(tokens.values())) == 1, tokens  # the records: the same text, the same split
  # Text's sentences are its lines, the records' the segmenter's: pieces differ at a few
  # sentence boundaries (a sentence starts with a word-start piece).
  assert abs(text - tokens["jsonl"]) / text < 0.01, (text, tokens)
  with pytest.raises(errors.ConfigError, match="unknown format 'csv'"):
    input_bench.InputBenchSpec(formats=("csv",))
