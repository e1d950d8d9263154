"""`bertjax extract`: features equal transformers' hidden states, in both output formats."""

import json

import numpy as np
import pytest

from bertjax import cli
from bertjax.tasks import encoder as encoder_lib, extract as features
from conftest import HF_CONFIG, random_torch_model, write_vocab

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LINES = [
    "The quick brown fox jumped over the lazy dog!",
    "un ##aff café",
    "我爱北京 ||| the dog jumps",  # a sentence pair: segment B gets token type 1
    "fox",
]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  m = random_torch_model(seed=5)
  d = tmp_path_factory.mktemp("extract") / "hf"
  m.save_pretrained(d)
  write_vocab(d / "vocab.txt", HF_CONFIG["vocab_size"])
  (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  return m, d


@pytest.fixture(scope="module")
def input_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("extract_in") / "input.txt"
  path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
  return path


def _reference(m, d, line):
  """Tokens and all hidden states [layers + 1, L, H] from transformers."""
  tok = transformers.BertTokenizer.from_pretrained(str(d))
  a, _, b = line.partition(" ||| ")
  enc = tok(a, b or None, return_tensors="pt")
  with torch.no_grad():
    out = m.bert(**enc, output_hidden_states=True)
  tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
  return tokens, np.stack([h[0].numpy() for h in out.hidden_states])


def _extract(*argv) -> int:
  return cli.main(["extract", *map(str, argv)])


# google's layer indexes (into the Transformer layers) -> transformers' hidden_states of the
# 2-layer model: [embeddings, layer 1, layer 2].
HIDDEN = {0: 1, 1: 2, -1: 2, -2: 1, "embeddings": 0}


@pytest.mark.slow
def test_jsonl_matches_transformers(hf_dir, input_file, tmp_path):
  m, d = hf_dir
  out = tmp_path / "f.jsonl"
  assert (
      _extract(
          "--init",
          d,
          "--input",
          input_file,
          "--layers",
          "-1,-2,0,1,embeddings",
          "--output",
          out,
          "--batch-size",
          3,
      )
      == 0
  )
  records = [json.loads(l) for l in out.read_text().splitlines()]
  assert [r["linex_index"] for r in records] == list(range(len(LINES)))
  for line, rec in zip(LINES, records):
    tokens, hidden = _reference(m, d, line)
    assert [f["token"] for f in rec["features"]] == tokens
    for j, f in enumerate(rec["features"]):
      assert [e["index"] for e in f["layers"]] == [-1, -2, 0, 1, "embeddings"]
      for e in f["layers"]:
        np.testing.assert_allclose(e["values"], hidden[HIDDEN[e["index"]], j], atol=2e-5)


@pytest.mark.slow
def test_npy_concat_and_pooling(hf_dir, input_file, tmp_path):
  m, d = hf_dir
  h = HF_CONFIG["hidden_size"]
  out = tmp_path / "mean.npy"
  assert (
      _extract(
          "--init",
          d,
          "--input",
          input_file,
          "--layers",
          "-1,-2,embeddings",
          "--concat",
          "--pooling",
          "mean",
          "--output",
          out,
      )
      == 0
  )
  got = np.load(out)
  assert got.shape == (len(LINES), 3 * h)  # 2 layers + embeddings
  cls_out = tmp_path / "cls.npy"
  assert (
      _extract(
          "--init",
          d,
          "--input",
          input_file,
          "--layers",
          "-1",
          "--pooling",
          "cls",
          "--output",
          cls_out,
      )
      == 0
  )
  per_tok = tmp_path / "tok.npy"
  assert (
      _extract(
          "--init",
          d,
          "--input",
          input_file,
          "--layers",
          "-1,-2",
          "--concat",
          "--output",
          per_tok,
          "--max-seq-len",
          24,
      )
      == 0
  )
  cls_feats, tok_feats = np.load(cls_out), np.load(per_tok)
  assert cls_feats.shape == (len(LINES), 1, h) and tok_feats.shape == (len(LINES), 24, 2 * h)
  listed = [json.loads(l) for l in per_tok.with_suffix(".tokens.jsonl").read_text().splitlines()]
  for i, line in enumerate(LINES):
    tokens, hidden = _reference(m, d, line)
    assert listed[i]["tokens"] == tokens
    three = np.concatenate([hidden[k] for k in (2, 1, 0)], axis=-1)  # [L, 3H]
    np.testing.assert_allclose(got[i], three.mean(0), atol=2e-5)
    np.testing.assert_allclose(cls_feats[i, 0], hidden[-1, 0], atol=2e-5)
    n = len(tokens)
    np.testing.assert_allclose(
        tok_feats[i, :n], np.concatenate([hidden[-1], hidden[-2]], -1), atol=2e-5
    )
    assert not tok_feats[i, n:].any()


@pytest.mark.slow
def test_default_layers_are_the_last_four_transformer_layers(hf_dir, input_file, tmp_path):
  m, d = hf_dir
  out = tmp_path / "default.jsonl"
  assert _extract("--init", d, "--input", input_file, "--output", out) == 0
  rec = json.loads(out.read_text().splitlines()[0])
  assert [e["index"] for e in rec["features"][0]["layers"]] == [-1, -2]  # a 2-layer model
  _, hidden = _reference(m, d, LINES[0])
  np.testing.assert_allclose(rec["features"][0]["layers"][1]["values"], hidden[1, 0], atol=2e-5)
  assert features.default_layers(12) == [-1, -2, -3, -4]
  assert features.parse_layers("0, -1,embeddings", 12) == [0, -1, "embeddings"]
  assert [features.hidden_state_index(i, 12) for i in (0, 11, -1, -12, "embeddings")] == [
      1,
      12,
      12,
      1,
      0,
  ]


@pytest.mark.slow
def test_features_do_not_depend_on_batching(hf_dir):
  _, d = hf_dir
  enc = encoder_lib.load_encoder(str(d))
  tok = enc.tokenizer
  examples = [features.make_example(i, l, tok, 32) for i, l in enumerate(LINES)]
  one = [x for _, x in features.extract(enc, examples, [-1], batch_size=1)]
  many = [x for _, x in features.extract(enc, examples, [-1], batch_size=8)]
  for a, b in zip(one, many):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_truncation_and_pairs(hf_dir):
  _, d = hf_dir
  from bertjax.data import wordpiece

  tok = wordpiece.load_tokenizer(d / "vocab.txt")
  e = features.make_example(0, "the quick brown fox ||| the lazy dog", tok, 8)
  # google's _truncate_seq_pair: pop from the longer side, segment B on ties.
  assert e.tokens == ["[CLS]", "the", "quick", "brown", "[SEP]", "the", "lazy", "[SEP]"]
  assert e.token_type_ids == [0] * 5 + [1] * 3
  single = features.make_example(1, "the quick brown fox jump", tok, 4)
  assert single.tokens == ["[CLS]", "the", "quick", "[SEP]"]


@pytest.mark.slow
def test_through_bertjax_checkpoint(hf_dir, input_file, tmp_path):
  pytest.importorskip("bertjax.training.checkpoint")
  m, d = hf_dir
  assert cli.main(["convert", "--from", "hf", str(d), "--to", "bertjax", str(tmp_path / "bj")]) == 0
  out = tmp_path / "bj.npy"
  assert (
      _extract(
          "--init",
          tmp_path / "bj",
          "--input",
          input_file,
          "--layers",
          "-1",
          "--pooling",
          "cls",
          "--output",
          out,
      )
      == 0
  )
  for i, line in enumerate(LINES):
    _, hidden = _reference(m, d, line)
    np.testing.assert_allclose(np.load(out)[i, 0], hidden[-1, 0], atol=2e-5)


def _one_line(capsys) -> str:
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def test_errors(hf_dir, input_file, tmp_path, capsys):
  _, d = hf_dir
  base = ("--init", d, "--input", input_file)
  assert _extract(*base, "--layers", "-1,5", "--output", tmp_path / "x.npy") == 2
  assert "--layers: 5 is out of range for a 2-layer model" in _one_line(capsys)
  for bad in ("2", "-3"):  # hidden_states indexes before; google's have L, not L + 1
    assert _extract(*base, "--layers", bad, "--output", tmp_path / "x.npy") == 2
    assert f"--layers: {bad} is out of range" in _one_line(capsys)
  assert _extract(*base, "--layers", "-1,embedding", "--output", tmp_path / "x.npy") == 2
  assert "'embedding' is not a layer index or 'embeddings'" in _one_line(capsys)
  assert _extract(*base, "--output", tmp_path / "x.txt") == 2
  assert "use a .jsonl or .npy" in _one_line(capsys)
  assert (
      _extract("--init", d, "--input", tmp_path / "none.txt", "--output", tmp_path / "x.npy") == 2
  )
  assert "none.txt: no such file" in _one_line(capsys)
  assert _extract(*base, "--output", tmp_path / "x.npy", "--max-seq-len", 1024) == 2
  assert "--max-seq-len 1024 exceeds the model's max_position_embeddings" in _one_line(capsys)
  assert _extract(*base, "--output", tmp_path / "x.npy", "--batch-size", -1) == 2
  assert "argument --batch-size: '-1' must be >= 1" in _one_line(capsys)
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no partial file
  with pytest.raises(SystemExit) as e:
    _extract("--help")
  assert e.value.code == 0 and "--layers" in capsys.readouterr().out


def test_existing_output_is_refused_unless_overwrite(hf_dir, input_file, tmp_path, capsys):
  _, d = hf_dir
  out = tmp_path / "f.npy"
  argv = ("--init", d, "--input", input_file, "--layers", "-1", "--output", out)
  out.write_text("keep me")
  assert _extract(*argv) == 2
  assert f"--output {out} already exists — pass --overwrite" in _one_line(capsys)
  assert out.read_text() == "keep me"
  out.unlink()
  out.with_suffix(".tokens.jsonl").write_text("keep me too")
  assert _extract(*argv) == 2
  assert "f.tokens.jsonl (the tokens beside --output) already exists" in _one_line(capsys)
  assert not out.exists()
  assert _extract(*argv, "--overwrite") == 0
  assert np.load(out).shape == (len(LINES), 64, 1, HF_CONFIG["hidden_size"])  # 64 positions
  assert len(out.with_suffix(".tokens.jsonl").read_text().splitlines()) == len(LINES)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["f.npy", "f.tokens.jsonl"]


def test_a_failure_midway_leaves_no_partial_output(hf_dir, input_file, tmp_path, monkeypatch):
  _, d = hf_dir
  real = features.extract

  def fails_after_one(*args, **kw):
    for k, item in enumerate(real(*args, **kw)):
      if k == 1:
        raise RuntimeError("interrupted")
      yield item

  monkeypatch.setattr(features, "extract", fails_after_one)
  for name in ("f.jsonl", "f.npy"):
    with pytest.raises(RuntimeError, match="interrupted"):
      _extract("--init", d, "--input", input_file, "--output", tmp_path / name)
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("pooling", ["none", "cls", "mean"])
def test_packed_features_equal_unpacked_in_input_order(hf_dir, pooling):
  """Lines packed several to a row give each line's own features (per token, or pooled over
  its own tokens), in the input's order, as one line a row."""
  _, d = hf_dir
  enc = encoder_lib.load_encoder(str(d))
  lines = LINES * 5 + ["the dog ||| a fox"] * 3
  examples = [features.make_example(i, l, enc.tokenizer, 32) for i, l in enumerate(lines)]
  args = (enc, examples, [-1, "embeddings"], pooling)
  want = list(features.extract(*args, batch_size=8, max_seq_len=32))
  got = list(features.extract(*args, batch_size=1, max_seq_len=32, packing=4))  # 2 groups
  assert [e.index for e, _ in got] == list(range(len(lines)))
  for (_, a), (_, b) in zip(want, got):
    assert a.shape == b.shape
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
