"""Google BERT TF checkpoints: names, layouts and logits against transformers' BertForPreTraining.

The checkpoint is written the way google-research/bert wrote its own (tf.compat.v1 variables
and a Saver), from a randomly initialised torch model, with the Google names spelled out here
independently of `google_ckpt`'s mapping.
"""

import jax
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.interop import convert, google_ckpt
from conftest import (
    HF_CONFIG,
    google_variables,
    hf_batch,
    random_torch_model,
    torch_logits,
    write_google_checkpoint,
)

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def jax_logits(cfg, params, ids, types, mask, pos):
  out = model_lib.BertForPreTraining(cfg).apply(
      {"params": params}, ids, types, mask, pos, deterministic=True
  )
  return np.asarray(out.mlm_logits), np.asarray(out.nsp_logits)


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory):
  m = random_torch_model()
  d = tmp_path_factory.mktemp("google") / "uncased_L-2_H-32_A-4"
  variables = google_variables(m.state_dict(), HF_CONFIG["num_hidden_layers"])
  # A fine-tuning checkpoint also holds Adam slots and the step: they must be skipped.
  extra = {
      "global_step": np.int64(7),
      "bert/pooler/dense/kernel/adam_m": np.zeros((32, 32), np.float32),
  }
  write_google_checkpoint(d, variables, HF_CONFIG, extra)
  return m, d


def test_reader_sees_googles_names(google_dir):
  _, d = google_dir
  names = set(tf.train.load_checkpoint(str(d / "bert_model.ckpt")).get_variable_to_shape_map())
  assert "bert/encoder/layer_1/attention/self/query/kernel" in names
  assert "cls/seq_relationship/output_weights" in names
  state, origin, skipped = google_ckpt.read_state(str(d / "bert_model.ckpt"))
  assert sorted(skipped) == ["bert/pooler/dense/kernel/adam_m", "global_step"]
  assert origin["cls.predictions.bias"] == "cls/predictions/output_bias"


@pytest.mark.slow
def test_google_logits_match_transformers(google_dir):
  m, d = google_dir
  cfg, params = google_ckpt.load_google(d)
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.vocab_size) == (2, 32, 4, 99)
  b = hf_batch(cfg.vocab_size)
  mlm, nsp = jax_logits(cfg, params, *b)
  mlm_ref, nsp_ref = torch_logits(m, *b)
  np.testing.assert_allclose(mlm, mlm_ref, atol=1e-5)
  np.testing.assert_allclose(nsp, nsp_ref, atol=1e-5)
  assert np.abs(nsp_ref).max() > 1e-2  # the heads are not trivially zero


def test_google_to_hf_loads_in_transformers(google_dir, tmp_path):
  m, d = google_dir
  cfg, params = google_ckpt.load_google(d)
  convert.save_hf(params, cfg, tmp_path / "hf")
  m2 = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
  b = hf_batch(cfg.vocab_size, seed=1)
  for got, want in zip(torch_logits(m2, *b), torch_logits(m, *b)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_save_google_roundtrip_is_exact(google_dir, tmp_path):
  _, d = google_dir
  cfg, params = google_ckpt.load_google(d)
  prefix = google_ckpt.save_google(params, cfg, tmp_path / "out")
  written = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
  original = tf.train.load_checkpoint(str(d / "bert_model.ckpt")).get_variable_to_shape_map()
  assert written == {
      k: v for k, v in original.items() if k not in ("global_step",) and not k.endswith("adam_m")
  }
  cfg2, params2 = google_ckpt.load_google(tmp_path / "out")
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params, params2)


def test_names_map_both_ways():
  cfg = model_lib.BertConfig(
      vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16
  )
  names = convert.hf_tensor_names(cfg)
  assert len(names) == 5 + 16 * cfg.num_layers + 9  # embeddings, layers, pooler + heads
  for hf_name in names:
    g, transpose = google_ckpt.hf_to_google_name(hf_name)
    assert google_ckpt.google_to_hf_name(g) == (hf_name, transpose)


def test_errors_name_file_and_tensor(google_dir, tmp_path):
  m, d = google_dir
  with pytest.raises(convert.ConversionError, match="no bert_model.ckpt.index"):
    google_ckpt.load_google(tmp_path)
  variables = google_variables(m.state_dict(), 2)
  del variables["bert/encoder/layer_1/attention/self/key/kernel"]
  write_google_checkpoint(tmp_path / "broken", variables, HF_CONFIG)
  with pytest.raises(
      convert.ConversionError, match="'bert/encoder/layer_1/attention/self/key/kernel' is missing"
  ):
    google_ckpt.load_google(tmp_path / "broken")
  with pytest.raises(convert.ConversionError, match=r"nope.json: not found — a Google BERT"):
    google_ckpt.load_google(d, tmp_path / "nope.json")
  (tmp_path / "list.json").write_text("[1, 2]")
  with pytest.raises(
      convert.ConversionError, match="list.json: a JSON object expected, found list"
  ):
    google_ckpt.load_google(d, tmp_path / "list.json")
  (tmp_path / "partial.json").write_text('{"vocab_size": 99}')
  with pytest.raises(convert.ConversionError, match="partial.json: field 'hidden_size' is missing"):
    google_ckpt.load_google(d, tmp_path / "partial.json")
