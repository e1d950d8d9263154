"""`bertjax convert --to sentence-transformers`: the directory loads in SentenceTransformer with
no missing or unexpected weights, and its `encode` equals `bertjax embed` of the source."""

import pathlib

import numpy as np
import pytest

from conftest import REPO
from test_embed import TEXTS, body, save_st  # noqa: F401  (the tiny sentence-transformers model)


def load_quietly(path, capfd):
  """SentenceTransformer(path), checking transformers reported no weight it had to initialise
  or could not use (its load report lists MISSING and UNEXPECTED keys)."""
  from sentence_transformers import SentenceTransformer

  capfd.readouterr()
  model = SentenceTransformer(str(path), device="cpu")
  out, err = capfd.readouterr()
  for word in ("LOAD REPORT", "MISSING", "UNEXPECTED", "newly initialized"):
    assert word not in out + err, out + err
  return model


@pytest.mark.slow  # convert end to end, then both sides embed
def test_bertjax_run_with_sentencepiece_to_sentence_transformers(tmp_path, monkeypatch, capfd):
  """A bertjax checkpoint with the bundled SentencePiece tokenizer, converted with the
  defaults (mean pooling, the model's length), from another working directory."""
  import jax
  import flax.linen as nn

  from bertjax import cli
  from bertjax import model as model_lib
  from bertjax.tasks import embed as embed_lib
  from bertjax.tasks import encoder as encoder_lib
  from bertjax.training import pretrained

  tokenizer = REPO / "data" / "tokenizer.model"
  cfg = model_lib.from_preset("tiny", vocab_size=8000, max_position_embeddings=64)
  d = model_lib.dummy_inputs()
  params = jax.jit(model_lib.BertForPreTraining(cfg).init)(  # jitted: eager init is slow
      jax.random.key(0),
      d["input_ids"],
      d["token_type_ids"],
      d["attention_mask"],
      d["masked_positions"],
  )["params"]
  rng = np.random.default_rng(0)  # off the init values (LayerNorm 1/0, zero biases)
  params = jax.tree.map(
      lambda x: np.asarray(x) + rng.normal(size=np.shape(x)).astype(np.float32) * 0.05,
      nn.unbox(params),
  )
  pretrained.save_pretrained(str(tmp_path / "run"), cfg, params, tokenizer_path=str(tokenizer))
  monkeypatch.chdir(tmp_path)
  assert (
      cli.main(["convert", "--from", "bertjax", "run", "--to", "sentence-transformers", "st"]) == 0
  )
  model = load_quietly(tmp_path / "st", capfd)
  assert model.max_seq_length == 64
  texts = [t.replace(" ##", "") for t in TEXTS] + [(REPO / "README.md").read_text()[:2000]]
  want = model.encode(texts, convert_to_numpy=True)
  enc = encoder_lib.load_encoder("run")
  got = embed_lib.embed(enc, texts, embed_lib.spec_for(enc), batch_rows=8)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.slow  # convert end to end
def test_sentence_transformers_round_trip_keeps_its_head(body, tmp_path, capfd):  # noqa: F811
  """cls pooling without the prompt, a Dense layer, Normalize and prompts come back out."""
  from bertjax import cli

  src = save_st(body, tmp_path / "src", "cls", include_prompt=False, dense=True, normalize=True)
  want = src.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
  out = tmp_path / "out"
  assert (
      cli.main(
          [
              "convert",
              "--from",
              "hf",
              str(tmp_path / "src"),
              "--to",
              "sentence-transformers",
              str(out),
          ]
      )
      == 0
  )
  model = load_quietly(out, capfd)
  got = model.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  assert pathlib.Path(out / "2_Dense" / "model.safetensors").is_file()


def test_unread_modules_are_refused_naming_the_file(tmp_path):
  import json

  from bertjax import errors
  from bertjax.interop import sentence_transformers as st_lib

  modules = [
      {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
  ]
  (tmp_path / "1_Pooling").mkdir()
  (tmp_path / "modules.json").write_text(json.dumps(modules))
  (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["cls", "max"]}))
  with pytest.raises(errors.UserError, match=r"1_Pooling/config.json: pooling \['cls', 'max'\]"):
    st_lib.read_head(tmp_path)
  (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
  assert st_lib.read_head(tmp_path).pooling == "max"
  modules.append(
      {"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"}
  )
  (tmp_path / "modules.json").write_text(json.dumps(modules))
  with pytest.raises(errors.UserError, match="modules.json: module .*LSTM.* is not read"):
    st_lib.read_head(tmp_path)
