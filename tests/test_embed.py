"""`bertjax embed` and sentence-transformers directories in: embeddings equal to
`SentenceTransformer(DIR).encode` for every pooling mode, with prompts, Dense, Normalize and
truncation at the declared length, on a tiny random BERT saved as such a directory here."""

import json
import pathlib
import shutil

import numpy as np
import pytest

from conftest import HF_CONFIG, write_vocab

MAX_LEN = 24  # the directory's max_seq_length: the long texts below are cut at it
TEXTS = [
    "the quick brown fox",
    "the lazy dog jumps over the quick brown fox , the lazy dog jumped over the quick brown "
    "fox ! the dog jumps over the fox again and again",
    "unaffable cafe",
    "dog",
    "我 爱 北 京 , the fox",
    "the quick brown fox jumped over the lazy dog . the quick brown fox jumped over the lazy "
    "dog . the quick brown fox",
    "over the lazy dog",
]


@pytest.fixture(scope="module")
def body(tmp_path_factory):
  """A Hugging Face BertModel directory (random weights moved off their init) + tokenizer."""
  import torch
  import transformers

  out = tmp_path_factory.mktemp("body")
  vocab = write_vocab(out / "vocab.txt", HF_CONFIG["vocab_size"])
  torch.manual_seed(0)
  m = transformers.BertModel(transformers.BertConfig(**HF_CONFIG)).eval()
  with torch.no_grad():
    for p in m.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  m.save_pretrained(out)
  transformers.BertTokenizerFast(str(vocab), do_lower_case=True).save_pretrained(out)
  return out


@pytest.fixture(scope="module")
def modern_body(tmp_path_factory):
  """A Hugging Face ModernBertModel directory (local and global attention layers) with the
  same WordPiece tokenizer: what a ModernBERT sentence-transformers model holds."""
  import torch
  import transformers

  out = tmp_path_factory.mktemp("modern_body")
  vocab = write_vocab(out / "vocab.txt", HF_CONFIG["vocab_size"])
  torch.manual_seed(0)
  cfg = transformers.ModernBertConfig(
      vocab_size=HF_CONFIG["vocab_size"],
      hidden_size=32,
      num_hidden_layers=3,
      num_attention_heads=4,
      intermediate_size=64,
      max_position_embeddings=64,
      global_attn_every_n_layers=2,
      local_attention=8,  # shorter than the texts: the window matters
      pad_token_id=0,
      cls_token_id=2,
      sep_token_id=3,
      bos_token_id=2,
      eos_token_id=3,
  )
  m = transformers.ModernBertModel(cfg).eval()
  with torch.no_grad():
    for p in m.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  m.save_pretrained(out)
  transformers.BertTokenizerFast(str(vocab), do_lower_case=True).save_pretrained(out)
  return out


def save_st(body, out, pooling, include_prompt=True, dense=False, normalize=False):
  """A SentenceTransformer over `body` saved at `out`; returns the model."""
  import torch
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling

  theirs = {"mean_sqrt_len": "mean_sqrt_len_tokens"}.get(pooling, pooling)
  modules = [
      Transformer(str(body), max_seq_length=MAX_LEN),
      Pooling(HF_CONFIG["hidden_size"], pooling_mode=theirs, include_prompt=include_prompt),
  ]
  if dense:
    torch.manual_seed(1)
    modules.append(Dense(HF_CONFIG["hidden_size"], 8))
  if normalize:
    modules.append(Normalize())
  model = SentenceTransformer(modules=modules, prompts={"query": "the query : "}, device="cpu")
  model.save(str(out))
  return model


def legacy_layout(directory: pathlib.Path) -> None:
  """Rewrites a saved directory as sentence-transformers 2.x wrote it (what most published
  models still are): the Transformer in 0_Transformer with sentence_bert_config.json holding
  max_seq_length, the pooling config in boolean keys."""
  sub = directory / "0_Transformer"
  sub.mkdir()
  for f in directory.iterdir():
    if f.is_file() and f.name not in ("modules.json", "config_sentence_transformers.json"):
      shutil.move(str(f), sub / f.name)
  (sub / "sentence_bert_config.json").write_text(
      json.dumps({"max_seq_length": MAX_LEN, "do_lower_case": False})
  )
  modules = json.loads((directory / "modules.json").read_text())
  modules[0].update(path="0_Transformer", type="sentence_transformers.models.Transformer")
  modules[1]["type"] = "sentence_transformers.models.Pooling"
  (directory / "modules.json").write_text(json.dumps(modules))
  pool = json.loads((directory / "1_Pooling" / "config.json").read_text())
  mode = pool.pop("pooling_mode")
  legacy = {"word_embedding_dimension": pool.pop("embedding_dimension")}
  for key, m in (("cls_token", "cls"), ("max_tokens", "max"), ("mean_tokens", "mean")):
    legacy[f"pooling_mode_{key}"] = m == mode
  (directory / "1_Pooling" / "config.json").write_text(json.dumps(legacy))


CASES = {
    "cls": dict(pooling="cls"),
    "mean": dict(pooling="mean"),
    "max-legacy-layout": dict(pooling="max", legacy=True),
    "mean_sqrt_len": dict(pooling="mean_sqrt_len"),
    "weightedmean": dict(pooling="weightedmean"),
    "lasttoken": dict(pooling="lasttoken"),
    "mean-prompt-excluded-dense-normalize": dict(
        pooling="mean", include_prompt=False, dense=True, normalize=True, prompt="query"
    ),
    "cls-prompt-excluded": dict(pooling="cls", include_prompt=False, prompt="query"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_embeddings_equal_sentence_transformers(body, tmp_path, case):
  from bertjax.tasks import embed as embed_lib
  from bertjax.tasks import encoder as encoder_lib
  from bertjax.training import sharding

  kw = dict(CASES[case])
  legacy, prompt = kw.pop("legacy", False), kw.pop("prompt", None)
  model = save_st(body, tmp_path / "st", **kw)
  if legacy:
    legacy_layout(tmp_path / "st")
  want = model.encode(TEXTS, prompt_name=prompt, batch_size=3, convert_to_numpy=True)

  enc = encoder_lib.load_encoder(str(tmp_path / "st"))
  spec = embed_lib.spec_for(enc, prompt=prompt)
  assert spec.max_seq_len == MAX_LEN
  counts = embed_lib.Counts()
  got = embed_lib.embed(
      enc, TEXTS, spec, batch_rows=8, mesh=sharding.make_mesh(data=-1), counts=counts
  )
  assert counts.cut == 2  # the two long texts
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_modernbert_body_equals_sentence_transformers(modern_body, tmp_path):
  """A bare ModernBertModel (no "model." prefix, no MLM head) read through modules.json."""
  from bertjax.tasks import embed as embed_lib
  from bertjax.tasks import encoder as encoder_lib

  model = save_st(modern_body, tmp_path / "st", "mean", normalize=True)
  want = model.encode(TEXTS, convert_to_numpy=True)
  enc = encoder_lib.load_encoder(str(tmp_path / "st"))
  got = embed_lib.embed(enc, TEXTS, embed_lib.spec_for(enc), batch_rows=8)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.slow  # the command end to end
def test_embed_command(body, tmp_path, monkeypatch, capsys):
  """The README's command with relative paths: default flags take the directory's
  declarations; an empty line stops it naming the file and line, --skip-bad-lines writes a NaN
  row in its place and counts it."""
  from bertjax import cli

  model = save_st(body, tmp_path / "model", "mean", normalize=True)
  want = model.encode(TEXTS, convert_to_numpy=True)
  monkeypatch.chdir(tmp_path)
  pathlib.Path("texts.txt").write_text("\n".join(TEXTS[:3] + [""] + TEXTS[3:]) + "\n")
  argv = ["embed", "--init", "model", "--input", "texts.txt", "--output", "out/texts.npy"]
  assert cli.main(argv) == 2
  assert "texts.txt:4: empty line — fix the line, or pass --skip-bad-lines" in (
      capsys.readouterr().err
  )
  assert not pathlib.Path("out/texts.npy").exists()

  assert cli.main(argv + ["--skip-bad-lines"]) == 0
  err = capsys.readouterr().err
  assert "texts.txt:4: empty line: skipped" in err
  assert "2 of 7 texts cut at 24 tokens, 1 lines without text" in err
  got = np.load("out/texts.npy")
  assert got.shape == (8, HF_CONFIG["hidden_size"]) and np.isnan(got[3]).all()
  np.testing.assert_allclose(np.delete(got, 3, axis=0), want, atol=1e-4, rtol=0)
  assert cli.main(argv + ["--skip-bad-lines"]) == 2  # refuses to overwrite
  assert "--overwrite" in capsys.readouterr().err


def test_load_hf_reads_the_transformer_of_a_legacy_directory(body, tmp_path):
  from bertjax.interop import convert

  save_st(body, tmp_path / "st", "mean")
  legacy_layout(tmp_path / "st")
  cfg, params = convert.load_hf(tmp_path / "st")
  assert cfg.hidden_size == HF_CONFIG["hidden_size"]
  want = convert.load_hf(body)[1]["bert"]["embeddings"]["word_embeddings"]["embedding"]
  np.testing.assert_array_equal(params["bert"]["embeddings"]["word_embeddings"]["embedding"], want)


@pytest.mark.slow  # the command end to end
def test_extract_pools_as_embed_does(body, tmp_path, capsys):
  """`extract --pooling` takes the directory's length and Normalize by default and pools with
  embed's code: its last layer equals sentence-transformers' embeddings; the cut lines are
  counted."""
  from bertjax import cli

  model = save_st(body, tmp_path / "st", "max", normalize=True)
  want = model.encode(TEXTS, convert_to_numpy=True)
  (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
  out = tmp_path / "f.npy"
  argv = ["extract", "--init", str(tmp_path / "st"), "--input", str(tmp_path / "texts.txt")]
  assert cli.main(argv + ["--layers", "-1", "--pooling", "max", "--output", str(out)]) == 0
  assert "2 cut at 24 tokens" in capsys.readouterr().err
  got = np.load(out)
  assert got.shape == (len(TEXTS), 1, HF_CONFIG["hidden_size"])
  np.testing.assert_allclose(got[:, 0], want, atol=1e-4, rtol=0)


def test_random_init_embeds_with_seeded_fresh_weights(body, tmp_path):
  """`--init random --preset DIR`: DIR's architecture, fresh weights (seed 0), the same on
  every load: the no-pretraining row of a retrieval table."""
  from bertjax.tasks import embed as embed_lib
  from bertjax.tasks import encoder as encoder_lib

  save_st(body, tmp_path / "st", "mean")
  load = lambda: embed_lib.with_weights(
      encoder_lib.load_encoder("random", str(body / "vocab.txt"), str(tmp_path / "st"))
  )
  enc = load()
  trained = encoder_lib.load_encoder(str(tmp_path / "st")).bert_params
  table = ("embeddings", "word_embeddings", "embedding")
  fresh = enc.bert_params
  for key in table:
    fresh, trained = fresh[key], trained[key]
  assert fresh.shape == trained.shape and not np.allclose(fresh, trained)
  got = embed_lib.embed(enc, TEXTS[:3], embed_lib.spec_for(enc), batch_rows=8)
  again = embed_lib.embed(load(), TEXTS[:3], embed_lib.spec_for(enc), batch_rows=8)
  assert np.isfinite(got).all() and got.std() > 0
  np.testing.assert_array_equal(got, again)
