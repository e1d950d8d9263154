"""Released checkpoints round-trip honestly: a transformers directory with only a
tokenizer.json converts with its tokenizer; a head that never trained is never exported as
trained (transformers reports it missing); a fresh head is warmed alone before the encoder
moves; a length override takes its own prediction budget."""

import json

import jax
import numpy as np
import pytest

from bertjax import cli
from bertjax.commands import pretrain as pretrain_cmd
from bertjax.interop import convert, google_ckpt
from bertjax.training import sharding, train
from conftest import HF_CONFIG, synthetic_batch, tiny_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Pride and prejudice, sense and sensibility.",
]


def _headless_with_tokenizer_json(d):
  """A released sentence encoder's layout: `BertModel` weights and tokenizer.json only."""
  from tokenizers import BertWordPieceTokenizer

  wp = BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(TEXTS * 10, vocab_size=120)
  tok = transformers.BertTokenizerFast(tokenizer_object=wp._tokenizer)
  tok.save_pretrained(d)
  (d / "vocab.txt").unlink(missing_ok=True)
  assert sorted(p.name for p in d.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
  torch.manual_seed(0)
  cfg = transformers.BertConfig(**dict(HF_CONFIG, vocab_size=wp.get_vocab_size()))
  model = transformers.BertModel(cfg).eval()
  model.save_pretrained(d)
  return model, tok


def test_a_headless_encoder_with_tokenizer_json_converts_and_exports_what_it_has(tmp_path, capsys):
  src, ours, back = tmp_path / "released", tmp_path / "ours", tmp_path / "back"
  src.mkdir()
  model, tok = _headless_with_tokenizer_json(src)
  assert cli.main(["convert", "--from", "hf", str(src), "--to", "bertjax", str(ours)]) == 0
  out = capsys.readouterr()
  assert "no tokenizer found" not in out.err and "tokenizer.json" in out.out
  info = json.loads((ours / "pretrained.json").read_text())
  assert info["tokenizer"] == "tokenizer.json" and info["untrained_heads"] == ["mlm", "nsp"]

  assert cli.main(["convert", "--from", "bertjax", str(ours), "--to", "hf", str(back)]) == 0
  said = capsys.readouterr().out
  assert "never trained, so not exported: mlm, nsp" in said and "(BertModel)" in said
  assert json.loads((back / "config.json").read_text())["architectures"] == ["BertModel"]
  # the tokenizer, as transformers reads it, gives the source's ids
  theirs = transformers.AutoTokenizer.from_pretrained(back)
  for text in TEXTS + ["an unseen sentence, with [MASK] in it"]:
    assert theirs(text)["input_ids"] == tok(text)["input_ids"]
  # the encoder loads whole; a pretraining class reports the heads that were never there
  reloaded, info = transformers.BertModel.from_pretrained(back, output_loading_info=True)
  assert info["missing_keys"] == set() or not info["missing_keys"]
  ids = torch.tensor([tok(TEXTS[0])["input_ids"]])
  with torch.no_grad():
    np.testing.assert_allclose(
        reloaded(ids).last_hidden_state.numpy(), model(ids).last_hidden_state.numpy(), atol=1e-5
    )
  _, info = transformers.BertForPreTraining.from_pretrained(back, output_loading_info=True)
  assert {"cls.predictions.transform.dense.weight", "cls.seq_relationship.weight"} <= set(
      info["missing_keys"]
  )


def _params(cfg):
  from bertjax import model as model_lib

  d = model_lib.dummy_inputs()
  v = model_lib.BertForPreTraining(cfg).init(
      jax.random.key(0),
      d["input_ids"],
      d["token_type_ids"],
      d["attention_mask"],
      d["masked_positions"],
  )
  return jax.tree.map(np.asarray, __import__("flax").linen.unbox(v["params"]))


def test_an_mlm_only_run_exports_as_masked_lm_and_google_leaves_the_head_out(tmp_path):
  """An MLM run without a pair task never trains NSP or the pooler: `BertForMaskedLM`, which
  loads in transformers with nothing missing; Google's format leaves the variables out."""
  cfg = convert.config_from_hf(dict(HF_CONFIG, model_type="bert"))
  params = _params(cfg)
  assert convert.save_hf(params, cfg, tmp_path / "hf", ("nsp", "pooler")) == "BertForMaskedLM"
  _, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  _, info = transformers.BertForPreTraining.from_pretrained(
      tmp_path / "hf", output_loading_info=True
  )
  assert "cls.seq_relationship.weight" in info["missing_keys"]
  google_ckpt.save_google(params, cfg, tmp_path / "g", untrained=("nsp", "pooler"))
  fresh = []
  google_ckpt.load_google(tmp_path / "g", fresh=fresh)
  assert fresh == ["the pooler", "the NSP head"]


def test_a_fresh_head_trains_alone_first_then_the_whole_network():
  c = tiny_config(warmup_steps=0)
  c.data.pair_mode = "none"
  mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  s = train.setup(c, mesh, head_warmup=(2, ("mlm",)))
  state = s.init_state(0)
  get = lambda st: jax.device_get(st.params)
  before = get(state)
  for step in range(3):
    prev = get(state)
    state, _ = s.train_step(state, synthetic_batch(c, mesh, step))
    now = get(state)
    moved = lambda path: not np.array_equal(np.asarray(path(prev)), np.asarray(path(now)))
    emb = lambda p: p["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert moved(lambda p: p["mlm_transform"]["kernel"])
    assert moved(emb) == (step >= 2), step  # the encoder holds still for 2 steps
    if step < 2:  # held too, its weight decay included (afterwards only the decay moves it)
      assert not moved(lambda p: p["nsp"]["kernel"])
  assert not np.array_equal(emb(before), emb(get(state)))


def test_a_length_override_takes_the_budget_of_its_masking_rate(capsys):
  from experiments import pretrain

  c = pretrain.get_config("continue")
  c.data.seq_len = 64  # as the flag parser leaves it
  lines = pretrain_cmd.budget_follows_length(c, ["--config.data.seq_len=64"])
  assert c.data.max_predictions_per_seq == 10  # ceil(0.15 * 64), not the recipe's 77 (at 512)
  assert lines == [
      "config.data.max_predictions_per_seq 77 -> 10 (ceil(0.15 x config.data.seq_len=64); set "
      "it to choose another)"
  ]
  c = pretrain.get_config("continue")
  argv = ["--config.data.seq_len=64", "--config.data.max_predictions_per_seq=12"]
  assert pretrain_cmd.budget_follows_length(c, argv) == []  # the user's own budget stays
