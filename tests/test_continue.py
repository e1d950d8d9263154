"""Continued pretraining from the checkpoints people have (`pretrain --init DIR`, the `continue`
recipe), proved on transformers' own code: transformers' randomly initialised
`BertForMaskedLM`, `RobertaForMaskedLM` and `ModernBertForMaskedLM` are saved with their
tokenizers, a corpus they never saw is prepared with `--tokenizer DIR`, and then

  - the run takes the network from the directory and says what it overrode;
  - its first step's MLM loss is the loss transformers computes on the same batch (float32,
    dropout off);
  - `convert --to hf` of the continued run loads in transformers with bertjax's logits;
  - a few steps lower the held-out loss below the checkpoint's (both measured by transformers);
  - `glue --init` takes the continued run.
"""

import json

import numpy as np
import pytest

from bertjax import cli, errors
from bertjax.data import pretraining
from conftest import REPO, built_once, google_variables, metrics_rows, write_google_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SEQ, PRED, BATCH, STEPS = 64, 10, 8, 4
SMALL = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64)


def _text() -> list[str]:
  """Chapters of the bundled novel: text none of these random models saw."""
  return (REPO / "data" / "austen.txt").read_text().split("\n\n")[:40]


def _bpe(special: list[str], prefix_space: bool):
  from tokenizers import decoders, models, pre_tokenizers, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=300,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      special_tokens=special if prefix_space else [],
  )
  tok.train_from_iterator(_text()[:10], trainer)
  if not prefix_space:  # ModernBERT's: BERT's special tokens after the BPE pieces
    tok.add_special_tokens(special)
  return tok


def _off_init(m):
  with torch.no_grad():  # every weight off its init value (LayerNorm 1/0, zero biases)
    for p in m.parameters():
      p.add_(torch.randn_like(p) * 0.02)
  return m.eval()


def _save_bert(d):
  from tokenizers import BertWordPieceTokenizer

  wp = BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(_text()[:10], vocab_size=300)
  d.mkdir()
  wp.save_model(str(d))  # vocab.txt
  (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  torch.manual_seed(0)
  cfg = transformers.BertConfig(
      vocab_size=wp.get_vocab_size(),
      num_hidden_layers=2,
      max_position_embeddings=SEQ,
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
      **SMALL,
  )
  _off_init(transformers.BertForMaskedLM(cfg)).save_pretrained(d)


def _save_roberta(d):
  special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  tok = _bpe(special, prefix_space=True)
  d.mkdir()
  tok.save(str(d / "tokenizer.json"))
  names = dict(bos_token="<s>", cls_token="<s>", eos_token="</s>", sep_token="</s>")
  names.update(pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
  (d / "tokenizer_config.json").write_text(json.dumps(names))
  torch.manual_seed(0)
  cfg = transformers.RobertaConfig(
      vocab_size=tok.get_vocab_size(),
      num_hidden_layers=2,
      max_position_embeddings=SEQ + 2,
      type_vocab_size=1,
      layer_norm_eps=1e-5,
      pad_token_id=tok.token_to_id("<pad>"),
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
      **SMALL,
  )
  _off_init(transformers.RobertaForMaskedLM(cfg)).save_pretrained(d)


def _save_modernbert(d):
  special = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
  tok = _bpe(special, prefix_space=False)
  d.mkdir()
  tok.save(str(d / "tokenizer.json"))
  torch.manual_seed(0)
  cfg = transformers.ModernBertConfig(
      vocab_size=tok.get_vocab_size(),
      num_hidden_layers=3,
      max_position_embeddings=SEQ,
      local_attention=16,
      global_attn_every_n_layers=3,
      pad_token_id=tok.token_to_id("[PAD]"),
      cls_token_id=tok.token_to_id("[CLS]"),
      sep_token_id=tok.token_to_id("[SEP]"),
      bos_token_id=None,
      eos_token_id=None,
      **SMALL,
  )
  _off_init(transformers.ModernBertForMaskedLM(cfg)).save_pretrained(d)


SAVE = {"bert": _save_bert, "roberta": _save_roberta, "modernbert": _save_modernbert}
MODEL = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "modernbert": "ModernBertForMaskedLM",
}


@pytest.fixture(scope="module", params=list(SAVE))
def family(request, tmp_path_factory):
  """(name, transformers directory, the corpus prepared with its tokenizer)."""
  from bertjax.data import prepare as prepare_lib

  name = request.param

  def build(out):
    SAVE[name](out / "hf")
    corpus = out / "corpus.txt"
    corpus.write_text("\n\n".join(_text()[10:]) + "\n")
    prepare_lib.prepare(
        prepare_lib.PrepareConfig(
            output=str(out / "data"),
            tokenizer=str(out / "hf"),  # the directory: its own tokenizer file is found
            inputs=(str(corpus),),
            processes=1,
            progress=False,
            eval_fraction=0.2,
        )
    )

  out = built_once(tmp_path_factory, f"continue_{name}", build)
  return name, out / "hf", out / "data"


def _config(hf_dir, data):
  from experiments import pretrain

  c = pretrain.get_config("continue")
  c.train.init_from = str(hf_dir)
  c.data.path = str(data)
  c.data.seq_len, c.data.max_predictions_per_seq = SEQ, PRED
  c.data.workers = 1
  c.model.dtype = "float32"
  c.train.batch_size, c.train.steps, c.train.warmup_steps = BATCH, STEPS, 1
  c.train.learning_rate = 2e-3
  c.eval.every_steps = 0  # the held-out loss is transformers' on the converted run, below
  c.checkpoint.every_steps = STEPS
  c.log_every_steps = 1
  c.tensorboard = False
  return c


def _hf_loss(model, batch, types: bool) -> float:
  """transformers' own MLM loss on a bertjax batch: labels at the weighted masked positions."""
  ids = torch.tensor(batch["input_ids"], dtype=torch.long)
  labels = np.full(batch["input_ids"].shape, -100)
  for b in range(len(labels)):
    for p, t, w in zip(
        batch["masked_positions"][b], batch["masked_ids"][b], batch["masked_weights"][b]
    ):
      if w:
        labels[b, p] = t
  kw = dict(attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long))
  if types:
    kw["token_type_ids"] = torch.tensor(batch["token_type_ids"], dtype=torch.long)
  with torch.no_grad():
    return float(model(ids, labels=torch.tensor(labels), **kw).loss)


@pytest.mark.long
@pytest.mark.slow
def test_continued_pretraining_from_transformers_directories(family, tmp_path, capsys):
  from bertjax.interop import convert
  from bertjax.training import loop

  name, hf_dir, data = family
  c = _config(hf_dir, data)
  c.model.hidden_size = 128  # the recipe's preset says so too: the checkpoint overrides it
  assert loop.train_and_evaluate(c, str(tmp_path / "run")) == 0
  said = capsys.readouterr().out
  assert f"init: the network of {hf_dir} (transformers {MODEL[name]})" in said, said
  assert "hidden_size 128 -> 32" in said
  assert "the optimizer and the step start fresh" in said
  saved = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
  assert saved["hidden_size"] == 32 and saved["num_layers"] == (3 if name == "modernbert" else 2)

  hf = getattr(transformers, MODEL[name]).from_pretrained(hf_dir).eval()
  # Step 1's loss is on the checkpoint's weights and the stream's first batch.
  cfg = pretraining.InputConfig(
      path=str(data),
      seq_len=SEQ,
      max_predictions_per_seq=PRED,
      pair_mode="none",
      mask_prob=0.15,
      seed=c.seed,
      vocab_size=hf.config.vocab_size,
  )
  first = next(
      pretraining.make_stream(cfg, global_batch_size=BATCH, process_index=0, process_count=1)
  )
  train, _ = metrics_rows(tmp_path / "run")
  want = _hf_loss(hf, first, types=name == "bert")
  assert train[1]["mlm_loss"] == pytest.approx(want, rel=1e-4)

  # Back to transformers: the continued run loads there.
  out = tmp_path / "hf_back"
  assert (
      cli.main(["convert", "--from", "bertjax", str(tmp_path / "run"), "--to", "hf", str(out)]) == 0
  )
  back = getattr(transformers, MODEL[name]).from_pretrained(out).eval()
  # The held-out loss, the checkpoint's and the continued run's, on the same held-out batches.
  held = pretraining.make_stream(
      cfg, global_batch_size=BATCH, process_index=0, process_count=1, split="eval"
  )
  batches = [next(held) for _ in range(2)]
  before = np.mean([_hf_loss(hf, b, types=name == "bert") for b in batches])
  after = np.mean([_hf_loss(back, b, types=name == "bert") for b in batches])
  assert after < before - 0.02, (after, before)  # the same batches: no sampling noise

  # ... and its logits there are bertjax's.
  ours_cfg, ours = convert.load_hf(out)
  from bertjax import model as model_lib

  ids, mask = first["input_ids"], first["attention_mask"]
  pos = first["masked_positions"]
  logits = (
      model_lib.BertForPreTraining(ours_cfg)
      .apply({"params": ours}, ids, first["token_type_ids"], mask, pos, deterministic=True)
      .mlm_logits
  )
  kw = dict(attention_mask=torch.tensor(mask, dtype=torch.long))
  with torch.no_grad():
    theirs = back(torch.tensor(ids, dtype=torch.long), **kw).logits.numpy()
  np.testing.assert_allclose(
      np.asarray(logits), np.take_along_axis(theirs, pos[:, :, None], axis=1), atol=1e-4, rtol=1e-4
  )
  if name == "roberta":  # fine-tuning takes the continued run (one token type, positions + 2)
    _glue(tmp_path / "run", tmp_path)


def _glue(run, tmp_path):
  import random

  r = random.Random(0)
  words = "the film was good bad great awful story".split()
  for split, n in (("train", 32), ("dev", 16)):
    rows = ["text\tlabel"] + [
        " ".join(r.choice(words) for _ in range(5)) + f"\t{r.randint(0, 1)}" for _ in range(n)
    ]
    (tmp_path / f"{split}.tsv").write_text("\n".join(rows) + "\n")
  out = tmp_path / "ft"
  argv = ["glue", "--task", "custom", "--name", "toy", "--train", str(tmp_path / "train.tsv")]
  argv += ["--dev", str(tmp_path / "dev.tsv"), "--text-columns", "text", "--label-column", "label"]
  argv += ["--init", str(run), "--workdir", str(out), "--max-seq-len", "16", "--epochs", "1"]
  assert cli.main(argv + ["--batch-size", "16", "--no-progress"]) == 0
  accuracy = json.loads((out / "results.json").read_text())["toy"]["accuracy"]
  assert 0.0 <= accuracy <= 1.0


def test_a_google_bert_checkpoint_is_an_init(family, tmp_path):
  """A Google BERT TF checkpoint directory (bert_config.json, bert_model.ckpt.*, vocab.txt):
  its network adopted, its weights loaded as `convert` reads them."""
  from bertjax.interop import google_ckpt
  from bertjax.training import config_checks, init_from

  name, hf_dir, data = family
  if name != "bert":
    pytest.skip("Google's checkpoints are BERT's")
  hf = transformers.BertForMaskedLM.from_pretrained(hf_dir)
  full = transformers.BertForPreTraining(hf.config)
  full.load_state_dict(hf.state_dict(), strict=False)
  d = tmp_path / "google"
  write_google_checkpoint(d, google_variables(full.state_dict(), 2), hf.config.to_dict())
  (d / "vocab.txt").write_bytes((hf_dir / "vocab.txt").read_bytes())
  source = init_from.describe(str(d))
  assert (source.kind, source.tokenizer) == ("google", str(d / "vocab.txt"))
  plan = config_checks.preflight(_config(d, data), str(tmp_path / "w"))
  assert plan.config.model.hidden_size == 32 and plan.config.model.num_layers == 2
  params, fresh = init_from.load(source)
  assert fresh == []
  _, want = google_ckpt.load_google(str(d))
  np.testing.assert_array_equal(
      params["bert"]["embeddings"]["word_embeddings"]["embedding"],
      want["bert"]["embeddings"]["word_embeddings"]["embedding"],
  )


def test_an_override_that_contradicts_the_checkpoint_is_one_line(family, tmp_path):
  from bertjax.training import config_checks

  name, hf_dir, data = family
  c = _config(hf_dir, data)
  c.model.hidden_size = 128
  with pytest.raises(errors.ConfigError, match=r"--config.model.hidden_size=128 contradicts"):
    config_checks.preflight(c, str(tmp_path / "w"), explicit=frozenset({"hidden_size"}))
  c.model.hidden_size = 32  # the checkpoint's own value: fine
  plan = config_checks.preflight(c, str(tmp_path / "w"), explicit=frozenset({"hidden_size"}))
  assert plan.config.model.hidden_size == 32
  assert not (tmp_path / "w").exists()


def test_data_of_another_tokenizer_is_refused(family, austen_shards, tmp_path):
  from bertjax.training import config_checks

  _, hf_dir, _ = family
  c = _config(hf_dir, austen_shards)
  with pytest.raises(errors.ConfigError, match="prepare --tokenizer"):
    config_checks.preflight(c, str(tmp_path / "w"))
