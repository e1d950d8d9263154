"""`bertjax data stats` / `data preview`, packed or not: real_token_fraction, example boundaries."""

import json
import re

import pytest

from bertjax import cli


def _run(capsys, *argv) -> str:
  assert cli.main(["data", *map(str, argv)]) == 0
  return capsys.readouterr().out


def test_stats_report_real_token_fraction_packed_or_not(capsys, austen_shards):
  common = ("stats", "--data", austen_shards, "--reader", "python", "--short-seq-prob", "0.5")
  plain = json.loads(_run(capsys, *common, "-n", 64))
  packed = json.loads(_run(capsys, *common, "-n", 64, "--packing", "--max-examples-per-row", 3))
  assert plain["packing"] is False and "max_examples_per_row" not in plain
  assert plain["rows"] == plain["examples"] == 64 and plain["examples_per_row"] == 1
  assert plain["real_token_fraction"] == pytest.approx(plain["mean_real_length"] / 128)
  assert packed["packing"] is True and packed["max_examples_per_row"] == 3
  assert 64 <= packed["examples"] < 64 + 3 and packed["rows"] < packed["examples"]
  assert packed["examples_per_row"] <= 3
  assert packed["real_token_fraction"] == pytest.approx(
      packed["mean_real_length"] * packed["examples"] / (128 * packed["rows"])
  )
  assert packed["real_token_fraction"] > plain["real_token_fraction"] + 0.05


def test_preview_shows_where_each_example_sits_in_a_packed_row(capsys, austen_shards):
  out = _run(
      capsys,
      *("preview", "--data", austen_shards, "--reader", "python", "-n", 6),
      *("--short-seq-prob", "0.5", "--packing", "--max-examples-per-row", 4),
  )
  rows = out.strip().split("\n\n")
  assert len(rows) == 6
  several = 0
  for r, text in enumerate(rows):
    head = re.fullmatch(r"row (\d+): (\d+) examples, (\d+)/128 real tokens", text.split("\n")[0])
    assert head and int(head[1]) == r and 1 <= int(head[2]) <= 4
    spans = [
        (int(a), int(b))
        for a, b in re.findall(rf"^example {r}\.\d+: positions (\d+)\.\.(\d+)$", text, re.M)
    ]
    assert len(spans) == int(head[2])
    assert spans[0][0] == 0 and spans[-1][1] + 1 == int(head[3])  # back to back from 0
    assert all(b + 1 == c for (_, b), (c, _) in zip(spans, spans[1:]))
    # Each example's masked positions are row positions inside its own span.
    masked = [m for m in text.split("\n") if m.strip().startswith("masked (")]
    for (start, end), line in zip(spans, masked):
      assert all(start < int(p) < end for p in re.findall(r" (\d+):", line))
    assert text.count("segment A:") == text.count("label:") == len(spans)
    several += len(spans) > 1
  assert several >= 1


def test_unpacked_preview_keeps_its_format(capsys, austen_shards):
  out = _run(capsys, "preview", "--data", austen_shards, "--reader", "python", "-n", 2)
  examples = out.strip().split("\n\n")
  assert [e.split("\n")[0] for e in examples] == ["example 0", "example 1"]
  assert examples[0].split("\n")[1].startswith("segment A: ") and "positions" not in out


def test_max_examples_per_row_is_range_checked(capsys, austen_shards):
  argv = ["data", "stats", "--data", str(austen_shards), "--packing", "--max-examples-per-row"]
  assert cli.main([*argv, "-1"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("bertjax data: ")
  assert "--max-examples-per-row" in err[0] and "'-1' must be >= 0" in err[0]
  # 0 is the default: E measured on the corpus, reported (the novels' chapters: 8).
  assert cli.main([*argv, "0", "-n", "50"]) == 0
  assert json.loads(capsys.readouterr().out.splitlines()[-1])["max_examples_per_row"] == 8
