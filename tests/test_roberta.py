"""The RoBERTa family (RoBERTa, XLM-R) through transformers' own code: `load_hf` reads
`RobertaForMaskedLM` / `XLMRobertaForMaskedLM` / `RobertaModel` directories (positions offset by
padding_idx + 1, one token type, the `lm_head`), their MLM logits equal transformers', and
`save_hf` writes a directory transformers loads back with every tensor equal."""

import jax
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.interop import convert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, L, P = 3, 12, 4


def _roberta(kind: str = "roberta"):
  torch.manual_seed(0)
  config_cls = (
      transformers.XLMRobertaConfig if kind == "xlm-roberta" else transformers.RobertaConfig
  )
  model_cls = (
      transformers.XLMRobertaForMaskedLM
      if kind == "xlm-roberta"
      else transformers.RobertaForMaskedLM
  )
  cfg = config_cls(
      vocab_size=120,
      hidden_size=32,
      num_hidden_layers=2,
      num_attention_heads=4,
      intermediate_size=64,
      max_position_embeddings=40,  # 38 tokens: positions start at row 2
      type_vocab_size=1,  # as roberta-base and xlm-roberta-base have it
      layer_norm_eps=1e-5,
  )
  m = model_cls(cfg).eval()
  with torch.no_grad():  # every weight off its init value (LayerNorm 1/0, zero biases)
    for p in m.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  return m


def _batch(vocab, pad_id=1, seed=0):
  """Right-padded rows, as bertjax's are; transformers numbers the real tokens 2, 3, ...."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[1, 8:] = 0
  mask[2, 3:] = 0
  ids[mask == 0] = pad_id
  pos = np.stack([rng.choice(int(m.sum()), size=P, replace=True) for m in mask])
  return ids, np.zeros_like(ids), mask, pos.astype(np.int32)


def _mlm_logits(cfg, params, batch):
  ids, types, mask, pos = batch
  out = model_lib.BertForPreTraining(cfg).apply(
      {"params": params}, ids, types, mask, pos, deterministic=True
  )
  return np.asarray(out.mlm_logits)


@pytest.mark.parametrize("kind", ["roberta", "xlm-roberta"])
def test_roberta_directories_load_with_equal_logits_and_save_back_exactly(kind, tmp_path):
  m = _roberta(kind)
  m.save_pretrained(tmp_path / "hf")
  fresh = []
  cfg, params = convert.load_hf(tmp_path / "hf", fresh=fresh)
  assert cfg.position_offset == 2 and cfg.type_vocab_size == 1 and cfg.max_seq_len == 38
  assert cfg.layer_norm_eps == 1e-5
  assert fresh == ["the pooler", "the NSP head"]  # RobertaForMaskedLM has neither
  batch = _batch(cfg.vocab_size)
  ids, _, mask, pos = batch
  with torch.no_grad():
    logits = m(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
    ).logits.numpy()
  want = np.take_along_axis(logits, pos[:, :, None], axis=1)
  np.testing.assert_allclose(_mlm_logits(cfg, params, batch), want, atol=1e-5, rtol=1e-4)

  convert.save_hf(params, cfg, tmp_path / "back")
  back, info = transformers.RobertaForMaskedLM.from_pretrained(
      tmp_path / "back", output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  theirs, ours = m.state_dict(), back.state_dict()
  for name, tensor in theirs.items():
    np.testing.assert_array_equal(ours[name].numpy(), tensor.numpy(), err_msg=name)


def test_a_bare_roberta_model_loads_with_its_pooler_and_fresh_heads(tmp_path):
  base = _roberta().roberta
  base = transformers.RobertaModel(base.config).eval()
  base.save_pretrained(tmp_path / "base")
  fresh = []
  cfg, params = convert.load_hf(tmp_path / "base", fresh=fresh)
  assert fresh == ["the NSP head", "the MLM head"]
  ids, types, mask, pos = batch = _batch(cfg.vocab_size)
  out = model_lib.BertForPreTraining(cfg).apply(
      {"params": params}, ids, types, mask, pos, deterministic=True
  )
  with torch.no_grad():
    want = base(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
    )
  real = mask.astype(bool)
  np.testing.assert_allclose(
      np.asarray(out.sequence_output)[real], want.last_hidden_state.numpy()[real], atol=1e-5
  )
  heads = convert._fresh_heads(cfg)
  jax.tree.map(np.testing.assert_array_equal, params["mlm_transform"], heads["mlm_transform"])


def test_roberta_pairs_are_framed_as_transformers_frames_them(tmp_path):
  """A RoBERTa checkpoint's tokenizer.json (RoBERTa's template: `<s> A </s></s> B </s>`):
  the ids bertjax feeds a GLUE pair task equal the transformers tokenizer's, through the
  encoder every fine-tuning command loads; a single sentence keeps one separator."""
  from tokenizers import ByteLevelBPETokenizer, processors

  from bertjax.tasks import encoder as encoder_lib
  from bertjax.tasks.glue import features

  texts = ["The quick brown fox jumps over the lazy dog.", "Two sentences make a pair."] * 20
  bpe = ByteLevelBPETokenizer()
  specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  bpe.train_from_iterator(texts, vocab_size=300, special_tokens=specials)
  bpe._tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
  theirs = transformers.RobertaTokenizerFast(
      tokenizer_object=bpe._tokenizer,
      **dict(zip(("bos_token", "pad_token", "eos_token", "unk_token", "mask_token"), specials)),
      cls_token="<s>",
      sep_token="</s>",
  )
  d = tmp_path / "roberta"
  theirs.save_pretrained(d)
  config = _roberta().config
  config.vocab_size = 300
  transformers.RobertaModel(config).save_pretrained(d)

  enc = encoder_lib.load_encoder(str(d))
  a, b = ["The lazy fox.", "A pair"], ["Quick brown dog jumps.", "of sentences"]
  ex = features.Examples(text_a=a, text_b=b, labels=None, index=["0", "1"])
  ours = features.encode(enc.tokenizer, ex, 32)
  want = theirs(a, b)["input_ids"]
  assert want[0][len(theirs(a[0])["input_ids"]) - 1 : len(theirs(a[0])["input_ids"]) + 1] == [2, 2]
  for row, mask, w in zip(ours.input_ids_NxL, ours.attention_mask_NxL, want):
    assert row[mask == 1].tolist() == w
  single = features.encode(enc.tokenizer, features.Examples(a, None, None, ["0", "1"]), 32)
  got = single.input_ids_NxL[0][single.attention_mask_NxL[0] == 1].tolist()
  assert got == theirs(a[0])["input_ids"]
