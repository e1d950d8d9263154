"""Google BERT TF checkpoints: names, layouts and logits against transformers' BertForPreTraining.

The checkpoint is written the way google-research/bert wrote its own (tf.compat.v1 variables
and a Saver), from a randomly initialised torch model, with the Google names spelled out here
independently of `google_ckpt`'s mapping.
"""

import json

import jax
import numpy as np
import pytest

from bertjax.interop import convert
from bertjax.interop import google_ckpt
from bertjax import model as model_lib

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, L, P = 3, 12, 4
HF_CONFIG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64, hidden_act="gelu",
                 type_vocab_size=2)


def google_variables(sd: dict, num_layers: int) -> dict[str, np.ndarray]:
  """Google's variable names and layouts ([in, out] kernels) for a torch state dict."""
  t = lambda name: sd[name].numpy().T  # torch Linear [out, in] -> TF dense kernel [in, out]
  v = lambda name: sd[name].numpy()
  out = {
      "bert/embeddings/word_embeddings": v("bert.embeddings.word_embeddings.weight"),
      "bert/embeddings/position_embeddings": v("bert.embeddings.position_embeddings.weight"),
      "bert/embeddings/token_type_embeddings": v("bert.embeddings.token_type_embeddings.weight"),
      "bert/embeddings/LayerNorm/gamma": v("bert.embeddings.LayerNorm.weight"),
      "bert/embeddings/LayerNorm/beta": v("bert.embeddings.LayerNorm.bias"),
      "bert/pooler/dense/kernel": t("bert.pooler.dense.weight"),
      "bert/pooler/dense/bias": v("bert.pooler.dense.bias"),
      "cls/predictions/transform/dense/kernel": t("cls.predictions.transform.dense.weight"),
      "cls/predictions/transform/dense/bias": v("cls.predictions.transform.dense.bias"),
      "cls/predictions/transform/LayerNorm/gamma": v("cls.predictions.transform.LayerNorm.weight"),
      "cls/predictions/transform/LayerNorm/beta": v("cls.predictions.transform.LayerNorm.bias"),
      "cls/predictions/output_bias": v("cls.predictions.bias"),
      "cls/seq_relationship/output_weights": v("cls.seq_relationship.weight"),  # [2, H]
      "cls/seq_relationship/output_bias": v("cls.seq_relationship.bias"),
  }
  for i in range(num_layers):
    g, h = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
    for m in ("query", "key", "value"):
      out[f"{g}/attention/self/{m}/kernel"] = t(f"{h}.attention.self.{m}.weight")
      out[f"{g}/attention/self/{m}/bias"] = v(f"{h}.attention.self.{m}.bias")
    for gm, hm in (("attention/output/dense", "attention.output.dense"),
                   ("intermediate/dense", "intermediate.dense"), ("output/dense", "output.dense")):
      out[f"{g}/{gm}/kernel"] = t(f"{h}.{hm}.weight")
      out[f"{g}/{gm}/bias"] = v(f"{h}.{hm}.bias")
    for gm, hm in (("attention/output/LayerNorm", "attention.output.LayerNorm"),
                   ("output/LayerNorm", "output.LayerNorm")):
      out[f"{g}/{gm}/gamma"] = v(f"{h}.{hm}.weight")
      out[f"{g}/{gm}/beta"] = v(f"{h}.{hm}.bias")
  return out


def write_google_checkpoint(directory, variables: dict[str, np.ndarray], hf_config: dict,
                            extra: dict[str, np.ndarray] | None = None) -> str:
  """A checkpoint as google-research/bert's Estimator wrote it: tf.compat.v1 Saver."""
  directory.mkdir(parents=True, exist_ok=True)
  prefix = str(directory / "bert_model.ckpt")
  with tf.Graph().as_default():
    tf_vars = [tf.compat.v1.get_variable(name, initializer=tf.constant(value))
               for name, value in {**variables, **(extra or {})}.items()]
    saver = tf.compat.v1.train.Saver(tf_vars)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, prefix, write_meta_graph=False)
  bert_config = {k: hf_config[k] for k in (
      "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
      "intermediate_size", "max_position_embeddings", "hidden_act", "type_vocab_size")}
  bert_config.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                     initializer_range=0.02)
  (directory / "bert_config.json").write_text(json.dumps(bert_config))
  return prefix


def random_torch_model(seed: int = 0):
  torch.manual_seed(seed)
  m = transformers.BertForPreTraining(transformers.BertConfig(**HF_CONFIG)).eval()
  with torch.no_grad():  # move every weight off its init value (LayerNorm 1/0, zero biases)
    for p in m.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  return m


def batch(vocab: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[1, 8:] = 0
  ids[mask == 0] = 0
  types = np.zeros((B, L), np.int32)
  types[:, 5:] = 1
  types[mask == 0] = 0
  pos = np.stack([rng.choice(int(m.sum()), size=P, replace=False) for m in mask]).astype(np.int32)
  return ids, types, mask, pos


def torch_logits(m, ids, types, mask, pos):
  with torch.no_grad():
    out = m(input_ids=torch.tensor(ids, dtype=torch.long),
            token_type_ids=torch.tensor(types, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long))
  mlm = np.take_along_axis(out.prediction_logits.numpy(), pos[:, :, None], axis=1)
  return mlm, out.seq_relationship_logits.numpy()


def jax_logits(cfg, params, ids, types, mask, pos):
  out = model_lib.BertForPreTraining(cfg).apply({"params": params}, ids, types, mask, pos,
                                                deterministic=True)
  return np.asarray(out.mlm_logits), np.asarray(out.nsp_logits)


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory):
  m = random_torch_model()
  d = tmp_path_factory.mktemp("google") / "uncased_L-2_H-32_A-4"
  variables = google_variables(m.state_dict(), HF_CONFIG["num_hidden_layers"])
  # A fine-tuning checkpoint also holds Adam slots and the step: they must be skipped.
  extra = {"global_step": np.int64(7),
           "bert/pooler/dense/kernel/adam_m": np.zeros((32, 32), np.float32)}
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


def test_google_logits_match_transformers(google_dir):
  m, d = google_dir
  cfg, params = google_ckpt.load_google(d)
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.vocab_size) == (2, 32, 4, 99)
  b = batch(cfg.vocab_size)
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
  b = batch(cfg.vocab_size, seed=1)
  for got, want in zip(torch_logits(m2, *b), torch_logits(m, *b)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_save_google_roundtrip_is_exact(google_dir, tmp_path):
  _, d = google_dir
  cfg, params = google_ckpt.load_google(d)
  prefix = google_ckpt.save_google(params, cfg, tmp_path / "out")
  written = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
  original = tf.train.load_checkpoint(str(d / "bert_model.ckpt")).get_variable_to_shape_map()
  assert written == {k: v for k, v in original.items() if k not in ("global_step",) and
                     not k.endswith("adam_m")}
  cfg2, params2 = google_ckpt.load_google(tmp_path / "out")
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params, params2)


def test_names_map_both_ways():
  cfg = model_lib.BertConfig(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2,
                             intermediate_size=16)
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
  with pytest.raises(convert.ConversionError,
                     match="'bert/encoder/layer_1/attention/self/key/kernel' is missing"):
    google_ckpt.load_google(tmp_path / "broken")
  with pytest.raises(convert.ConversionError, match=r"nope.json: not found \(pass --bert-config\)"):
    google_ckpt.load_google(d, tmp_path / "nope.json")
