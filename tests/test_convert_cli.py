"""`bertjax convert` end to end: google -> bertjax -> hf and hf -> bertjax -> hf keep the logits."""

import json

import numpy as np
import pytest

from bertjax import cli
from bertjax.interop import convert

from conftest import (
    HF_CONFIG,
    google_variables,
    hf_batch,
    random_torch_model,
    torch_logits,
    write_google_checkpoint,
    write_vocab,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory):
  m = random_torch_model(seed=3)
  d = tmp_path_factory.mktemp("cli") / "uncased_L-2_H-32_A-4"
  write_google_checkpoint(d, google_variables(m.state_dict(), 2), HF_CONFIG)
  write_vocab(d / "vocab.txt", HF_CONFIG["vocab_size"])
  return m, d


def _run(*argv) -> int:
  return cli.main(["convert", *map(str, argv)])


def _assert_same_logits(m_ref, hf_dir, seed=0):
  m = transformers.BertForPreTraining.from_pretrained(hf_dir).eval()
  b = hf_batch(HF_CONFIG["vocab_size"], seed)
  for got, want in zip(torch_logits(m, *b), torch_logits(m_ref, *b)):
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.slow
def test_google_to_hf_with_tokenizer(google_dir, tmp_path, capsys):
  m, d = google_dir
  assert _run("--from", "google", d, "--to", "hf", tmp_path / "hf") == 0
  assert "wrote config.json, model.safetensors, vocab.txt" in capsys.readouterr().out
  _assert_same_logits(m, tmp_path / "hf")
  # The vocab is all lower case: recorded as an uncased tokenizer that transformers reads.
  assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["do_lower_case"]
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  from bertjax.data import wordpiece

  ours = wordpiece.WordPieceTokenizer(d / "vocab.txt")
  text = "The quick brown fox jumped over the LAZY dog! Unaffable café 我爱北京"
  assert hf_tok.encode(text, add_special_tokens=False) == ours.encode(text)
  assert ours.unk_id not in ours.encode(text)


def test_google_roundtrip_through_cli(google_dir, tmp_path):
  m, d = google_dir
  assert _run("--from", "google", d, "--to", "google", tmp_path / "g") == 0
  assert (tmp_path / "g" / "vocab.txt").read_text() == (d / "vocab.txt").read_text()
  assert (
      _run("--from", "google", tmp_path / "g" / "bert_model.ckpt", "--to", "hf", tmp_path / "hf")
      == 0
  )
  _assert_same_logits(m, tmp_path / "hf", seed=2)


def test_hf_to_hf(google_dir, tmp_path):
  m, _ = google_dir
  m.save_pretrained(tmp_path / "src")
  assert _run("--from", "hf", tmp_path / "src", "--to", "hf", tmp_path / "out") == 0
  _assert_same_logits(m, tmp_path / "out")


def test_through_bertjax_checkpoint(google_dir, tmp_path):
  pytest.importorskip("bertjax.training.checkpoint")
  m, d = google_dir
  # google -> bertjax -> hf
  assert _run("--from", "google", d, "--to", "bertjax", tmp_path / "bj") == 0
  assert _run("--from", "bertjax", tmp_path / "bj", "--to", "hf", tmp_path / "hf") == 0
  _assert_same_logits(m, tmp_path / "hf")
  assert (tmp_path / "hf" / "vocab.txt").read_text() == (d / "vocab.txt").read_text()
  # hf -> bertjax -> hf
  assert _run("--from", "hf", tmp_path / "hf", "--to", "bertjax", tmp_path / "bj2") == 0
  assert _run("--from", "bertjax", tmp_path / "bj2", "--to", "hf", tmp_path / "hf2") == 0
  _assert_same_logits(m, tmp_path / "hf2", seed=1)


def _one_line(capsys) -> str:
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def test_help_and_errors(google_dir, tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    _run("--help")
  assert e.value.code == 0 and "--from" in capsys.readouterr().out
  assert _run("--from", "google", tmp_path, "--to", "hf", tmp_path / "x") == 2
  assert "no bert_model.ckpt.index" in _one_line(capsys)
  _, d = google_dir
  small = write_vocab(tmp_path / "big_vocab.txt", HF_CONFIG["vocab_size"] + 5)
  assert _run("--from", "google", d, "--to", "hf", tmp_path / "x", "--vocab", small) == 2
  assert "big_vocab.txt: 104 pieces but the model's vocab_size is 99" in _one_line(capsys)
  assert _run("--from", "hf", tmp_path, "--to", "hf", tmp_path / "x") == 2
  assert "config.json: not found" in _one_line(capsys)
  assert _run("--from", "hf", tmp_path / "none", "--to", "hf", tmp_path / "x") == 2
  assert "SRC " + str(tmp_path / "none") + ": no such file or directory" in _one_line(capsys)
  assert _run("--from", "tf", d, "--to", "hf", tmp_path / "x") == 2
  assert "argument --from: invalid choice: 'tf'" in _one_line(capsys)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["big_vocab.txt"]  # nothing written


def test_existing_output_is_refused_unless_overwrite(google_dir, tmp_path, capsys):
  m, d = google_dir
  out = tmp_path / "hf"
  out.mkdir()
  (out / "mine.txt").write_text("keep me")
  assert _run("--from", "google", d, "--to", "hf", out) == 2
  assert f"DST {out} already exists — pass --overwrite" in _one_line(capsys)
  assert [p.name for p in out.iterdir()] == ["mine.txt"]
  assert _run("--from", "google", d, "--to", "hf", out, "--overwrite") == 0
  assert not (out / "mine.txt").exists()  # replaced, not merged
  _assert_same_logits(m, out)
  capsys.readouterr()  # transformers' loading bars
  (tmp_path / "file").write_text("keep me")
  assert _run("--from", "google", d, "--to", "bertjax", tmp_path / "file") == 2
  assert "already exists" in _one_line(capsys)
  assert (tmp_path / "file").read_text() == "keep me"
  assert _run("--from", "google", d, "--to", "bertjax", d, "--overwrite") == 2
  assert "holds SRC" in _one_line(capsys)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "hf"]


def test_a_failure_midway_leaves_no_partial_output(google_dir, tmp_path, monkeypatch):
  from bertjax.commands import convert as convert_cmd

  _, d = google_dir
  real = convert_cmd.write_hf_tokenizer

  def fails(tok, dst, max_len):
    real(tok, dst, max_len)
    raise OSError("disk full")

  monkeypatch.setattr(convert_cmd, "write_hf_tokenizer", fails)
  with pytest.raises(OSError, match="disk full"):
    _run("--from", "google", d, "--to", "hf", tmp_path / "hf")
  (tmp_path / "old").mkdir()
  (tmp_path / "old" / "mine.txt").write_text("keep me")
  with pytest.raises(OSError, match="disk full"):
    _run("--from", "google", d, "--to", "hf", tmp_path / "old", "--overwrite")
  assert sorted(p.name for p in tmp_path.rglob("*")) == ["mine.txt", "old"]


def test_save_hf_then_load_hf_keeps_the_config(google_dir, tmp_path):
  _, d = google_dir
  assert _run("--from", "google", d, "--to", "hf", tmp_path / "hf") == 0
  cfg, _ = convert.load_hf(tmp_path / "hf")
  assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (2, 32, 64)


def test_sentencepiece_tokenizer_for_transformers(tmp_path):
  # A model pretrained here uses the bundled SentencePiece model (vocab 8000).
  import pathlib

  import sentencepiece as spm

  torch = pytest.importorskip("torch")
  root = pathlib.Path(__file__).parents[1]
  sp_path = root / "data" / "tokenizer.model"
  sp = spm.SentencePieceProcessor(model_file=str(sp_path))
  torch.manual_seed(0)
  hf_cfg = transformers.BertConfig(**{**HF_CONFIG, "vocab_size": sp.get_piece_size()})
  transformers.BertForPreTraining(hf_cfg).save_pretrained(tmp_path / "src")
  assert (
      _run("--from", "hf", tmp_path / "src", "--vocab", sp_path, "--to", "hf", tmp_path / "hf") == 0
  )
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  lines = [l for l in (root / "data" / "austen.txt").read_text().splitlines() if l.strip()][:300]
  lines += ["Numbers 1,234.50 and 1st; café naïve ﬁ  double  spaces", "中文 😀"]
  for line in lines:
    assert hf_tok.encode(line) == [2] + sp.encode(line) + [3], line
  pair = hf_tok("Elinor.", "Marianne.")
  assert pair["input_ids"] == [2] + sp.encode("Elinor.") + [3] + sp.encode("Marianne.") + [3]
  assert pair["token_type_ids"][-1] == 1
  assert hf_tok.mask_token_id == 4 and hf_tok.pad_token_id == 0
