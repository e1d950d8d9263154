"""ModernBERT directories as the `--init` of glue, squad, ner and extract.

Two kinds of directory: one `bertjax convert --to hf` writes from a ModernBERT-shaped bertjax
checkpoint (it carries the SentencePiece tokenizer.model it was trained with), and one
transformers writes itself (`ModernBertForMaskedLM.save_pretrained`) with only a
`tokenizer.json`, a byte-level BPE with BERT's special tokens at ids above its vocabulary, as
ModernBERT ships. A resume or an init_from with another norm placement is refused in one line.
"""

import json
import os
import random

import numpy as np
import pytest

from bertjax import cli, errors
from bertjax.data import tokenizer as tokenizer_lib

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SENTENCEPIECE = os.path.join(REPO, "data", "tokenizer.model")
SQUAD = os.path.join(REPO, "tests", "fixtures", "squad", "train-v1.1.json")

_POS = "good great wonderful excellent".split()
_NEG = "bad awful terrible boring".split()
_FILLER = "the film movie story acting plot was is really quite a an and this it".split()
_SPECIAL = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]  # ModernBERT's, after its BPE pieces
SMALL = dict(hidden=32, layers=3, heads=2, ffn=48, positions=64, window=8, every=3)


def _bpe(words, special=_SPECIAL):
  """A byte-level BPE `tokenizers.Tokenizer` as ModernBERT's: no prefix space, the special
  tokens added after the learned pieces, a [CLS] A [SEP] (B [SEP]) template."""
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[]
  )
  tok.train_from_iterator([" ".join(words)] * 20, trainer)
  tok.add_special_tokens(special)
  cls, sep = special[1], special[2]
  tok.post_processor = processors.TemplateProcessing(
      single=f"{cls}:0 $A:0 {sep}:0",
      pair=f"{cls}:0 $A:0 {sep}:0 $B:0 {sep}:0",
      special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
  )
  return tok


@pytest.fixture(scope="module")
def transformers_dir(tmp_path_factory):
  """`ModernBertForMaskedLM(...).save_pretrained` (transformers' random init) + tokenizer.json."""
  d = tmp_path_factory.mktemp("modern") / "transformers"
  tok = _bpe(_POS + _NEG + _FILLER + ["University", "Notre", "Dame", "Indiana", "founded"])
  torch.manual_seed(0)
  cfg = transformers.ModernBertConfig(
      vocab_size=tok.get_vocab_size(),
      hidden_size=SMALL["hidden"],
      num_hidden_layers=SMALL["layers"],
      num_attention_heads=SMALL["heads"],
      intermediate_size=SMALL["ffn"],
      max_position_embeddings=SMALL["positions"],
      local_attention=SMALL["window"],
      global_attn_every_n_layers=SMALL["every"],
      pad_token_id=tok.token_to_id("[PAD]"),
      cls_token_id=tok.token_to_id("[CLS]"),
      sep_token_id=tok.token_to_id("[SEP]"),
      bos_token_id=None,
      eos_token_id=None,
  )
  transformers.ModernBertForMaskedLM(cfg).save_pretrained(d)
  tok.save(str(d / "tokenizer.json"))
  return d


@pytest.fixture(scope="module")
def converted_dir(tmp_path_factory):
  """`bertjax convert --from bertjax CKPT --to hf DIR` of a ModernBERT-shaped checkpoint."""
  import flax.linen as nn
  import jax

  from bertjax import model as model_lib
  from bertjax.training import pretrained

  root = tmp_path_factory.mktemp("modern")
  cfg = model_lib.BertConfig(
      vocab_size=8000,
      hidden_size=SMALL["hidden"],
      num_layers=SMALL["layers"],
      num_heads=SMALL["heads"],
      intermediate_size=SMALL["ffn"],
      max_position_embeddings=SMALL["positions"],
      type_vocab_size=0,
      layer_norm_eps=1e-5,
      norm_placement="pre",
      mlp_type="glu",
      position_embedding="rope",
      use_bias=False,
      local_attention=SMALL["window"],
      global_every=SMALL["every"],
  )
  d = model_lib.dummy_inputs()
  params = model_lib.BertForPreTraining(cfg).init(
      jax.random.key(0),
      d["input_ids"],
      d["token_type_ids"],
      d["attention_mask"],
      d["masked_positions"],
  )["params"]
  pretrained.save_pretrained(
      str(root / "ckpt"), cfg, nn.unbox(params), tokenizer_path=SENTENCEPIECE, step=1
  )
  out = root / "hf"
  assert cli.main(["convert", "--from", "bertjax", str(root / "ckpt"), "--to", "hf", str(out)]) == 0
  assert json.loads((out / "config.json").read_text())["model_type"] == "modernbert"
  return out


@pytest.fixture(params=["converted", "transformers"])
def modern_dir(request):
  return request.getfixturevalue(f"{request.param}_dir"), request.param


def _sentiment_tsv(root) -> tuple[str, str]:
  r = random.Random(0)
  paths = []
  for split, n in (("train", 32), ("dev", 16)):
    path = os.path.join(root, f"{split}.tsv")
    with open(path, "w") as f:
      f.write("review\tlabel\n")
      for _ in range(n):
        label = r.random() < 0.5
        words = [r.choice(_FILLER) for _ in range(4)] + [r.choice(_POS if label else _NEG)]
        f.write(f"{' '.join(words)}\t{int(label)}\n")
    paths.append(path)
  return paths[0], paths[1]


# ------------------------------------------------------------------------- tokenizer.json


def test_tokenizer_json_gives_the_files_own_ids(transformers_dir):
  path = transformers_dir / "tokenizer.json"
  ours = tokenizer_lib.HFTokenizer(path)
  theirs = tokenizers.Tokenizer.from_file(str(path))
  assert isinstance(ours, tokenizer_lib.Tokenizer)
  assert [ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id] == [
      theirs.token_to_id(p) for p in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
  ]
  assert ours.cls_id > 255  # above the byte alphabet, as ModernBERT's: not BERT's ids
  text = "the film was really great"
  assert [ours.cls_id] + ours.encode(text) + [ours.sep_id] == theirs.encode(text).ids
  assert ours.encode_batch([text, "bad"]) == [ours.encode(text), ours.encode("bad")]
  assert ours.decode([ours.cls_id] + ours.encode(text)) == text
  assert ours.vocab_size == theirs.get_vocab_size()
  starts = [ours.id_to_piece(i) for i in ours.encode(text) if ours.is_word_start(i)]
  assert starts and all(p.startswith("\u0120") for p in starts)  # "Ġ": after a space
  assert not ours.is_word_start(ours.cls_id)


def test_tokenizer_config_names_other_special_tokens(tmp_path):
  special = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"]
  _bpe(_FILLER, special).save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(tokenizer_lib.TokenizerError, match=r"no special tokens \['\[PAD\]'"):
    tokenizer_lib.HFTokenizer(tmp_path / "tokenizer.json")
  names = dict(pad_token="<pad>", unk_token="<unk>", cls_token={"content": "<s>"})
  names.update(sep_token="</s>", mask_token="<mask>")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(names))
  tok = tokenizer_lib.HFTokenizer(tmp_path / "tokenizer.json")
  assert tok.id_to_piece(tok.cls_id) == "<s>" and tok.id_to_piece(tok.pad_id) == "<pad>"


def test_a_broken_tokenizer_json_is_one_line(tmp_path):
  (tmp_path / "tokenizer.json").write_text('{"model": ')
  with pytest.raises(tokenizer_lib.TokenizerError, match="not a Hugging Face tokenizer.json"):
    tokenizer_lib.HFTokenizer(tmp_path / "tokenizer.json")


# ------------------------------------------------------------------------------- the tasks


def test_random_init_takes_a_checkpoints_architecture_not_its_weights(modern_dir):
  """`--init random --preset CHECKPOINT`: the checkpoint's whole config (a modern one here,
  which no preset gives) and its tokenizer, with no weights read into the encoder."""
  from bertjax.tasks import encoder as encoder_lib

  d, _ = modern_dir
  pre = encoder_lib.load_encoder(str(d))
  enc = encoder_lib.load_encoder("random", None, str(d))
  assert enc.bert_params is None and enc.source == f"random:{d}"
  assert enc.config == pre.config and enc.config.norm_placement == "pre"
  assert enc.tokenizer.path == pre.tokenizer.path
  with pytest.raises(errors.ConfigError, match=r"^--preset '.*nope' is neither a model preset"):
    encoder_lib.load_encoder("random", None, str(d / "nope"), names={"preset": "--preset"})


def test_encoder_reads_each_modern_dir_with_its_tokenizer(modern_dir):
  from bertjax.tasks import encoder as encoder_lib

  d, kind = modern_dir
  enc = encoder_lib.load_encoder(str(d))
  assert enc.source == f"hf:{d}"
  assert enc.config.type_vocab_size == 0 and enc.config.norm_placement == "pre"
  want = "tokenizer.model" if kind == "converted" else "tokenizer.json"
  assert enc.tokenizer.path.name == want  # a converted dir: the .model it was trained with
  assert "final_layer_norm" in enc.bert_params
  if kind == "converted":  # its tokenizer.json, made from the .model, gives the .model's ids
    by_json = encoder_lib.load_encoder(str(d), tokenizer=str(d / "tokenizer.json")).tokenizer
    assert isinstance(by_json, tokenizer_lib.HFTokenizer)
    text = "It is a truth universally acknowledged."
    assert by_json.encode(text) == enc.tokenizer.encode(text)
    assert (by_json.cls_id, by_json.sep_id, by_json.pad_id) == (2, 3, 0)


def test_squad_and_ner_tokenize_each_word_on_its_own(transformers_dir):
  from bertjax.tasks.squad import features

  tok = tokenizer_lib.HFTokenizer(transformers_dir / "tokenizer.json")
  _, ids, _ = features.tokenize_context(tok, "the film")
  assert ids == tok.encode("the") + tok.encode("film") != tok.encode("the film")  # no "Ġfilm"


@pytest.mark.slow  # a fine-tuning run end to end
def test_glue_custom_task_on_each_modern_dir(modern_dir, tmp_path):
  d, _ = modern_dir
  train, dev = _sentiment_tsv(tmp_path)
  out = tmp_path / "out"
  argv = ["glue", "--task", "custom", "--name", "reviews", "--train", train, "--dev", dev]
  argv += ["--text-columns", "review", "--label-column", "label", "--init", str(d)]
  argv += ["--workdir", str(out), "--max-seq-len", "24", "--epochs", "1", "--batch-size", "16"]
  assert cli.main(argv + ["--no-progress"]) == 0
  accuracy = json.loads((out / "results.json").read_text())["reviews"]["accuracy"]
  assert 0.0 <= accuracy <= 1.0
  best = json.loads((out / "reviews" / "best.json").read_text())
  assert best["init"] == f"hf:{d}"


def test_extract_on_a_transformers_dir_gives_transformers_states(transformers_dir, tmp_path):
  lines = ["the film was great", "this movie is bad ||| so bad"]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  out = tmp_path / "f.npy"
  argv = ["extract", "--init", str(transformers_dir), "--input", str(tmp_path / "in.txt")]
  assert cli.main(argv + ["--layers", "-1", "--max-seq-len", "16", "--output", str(out)]) == 0
  feats = np.load(out)  # [N, L, 1, H]
  tok = tokenizers.Tokenizer.from_file(str(transformers_dir / "tokenizer.json"))
  m = transformers.ModernBertModel.from_pretrained(str(transformers_dir)).eval()
  for i, line in enumerate(lines):
    a, _, b = line.partition(" ||| ")
    ids = tok.encode(a, b).ids if b else tok.encode(a).ids  # the file's own template
    with torch.no_grad():
      x = torch.tensor([ids])
      want = m(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0].numpy()
    np.testing.assert_allclose(feats[i, : len(ids), 0], want, atol=1e-4)
    assert not feats[i, len(ids) :].any()


def test_extract_on_a_converted_dir_writes_features(converted_dir, tmp_path):
  (tmp_path / "in.txt").write_text("the film was great\n")
  out = tmp_path / "f.jsonl"
  argv = ["extract", "--init", str(converted_dir), "--input", str(tmp_path / "in.txt")]
  assert cli.main(argv + ["--layers", "-1,-2", "--output", str(out)]) == 0
  (row,) = [json.loads(l) for l in out.read_text().splitlines()]
  assert row["features"][0]["token"] == "[CLS]"
  assert [l["index"] for l in row["features"][0]["layers"]] == [-1, -2]
  assert len(row["features"][0]["layers"][0]["values"]) == SMALL["hidden"]


@pytest.mark.slow  # a fine-tuning run end to end
def test_ner_on_a_transformers_dir(transformers_dir, tmp_path):
  r = random.Random(0)
  path = tmp_path / "train.txt"
  with open(path, "w") as f:
    for _ in range(16):
      words = [(r.choice(_FILLER), "O") for _ in range(4)] + [("Dame", "B-PER")]
      r.shuffle(words)
      f.write("".join(f"{w} {t}\n" for w, t in words) + "\n")
  out = tmp_path / "out"
  argv = ["ner", "--init", str(transformers_dir), "--train", str(path), "--dev", str(path)]
  argv += ["--workdir", str(out), "--max-seq-len", "32", "--epochs", "1", "--batch-size", "16"]
  assert cli.main(argv + ["--no-progress"]) == 0
  results = json.loads((out / "results.json").read_text())
  assert 0.0 <= results["dev"]["f1"] <= 1.0
  assert json.loads((out / "best.json").read_text())["init"] == f"hf:{transformers_dir}"


@pytest.mark.slow  # a fine-tuning run end to end
def test_squad_on_a_transformers_dir(transformers_dir, tmp_path):
  out = tmp_path / "out"
  argv = ["squad", "--init", str(transformers_dir), "--train", SQUAD, "--dev", SQUAD]
  argv += ["--version", "1.1", "--workdir", str(out), "--max-seq-len", "48"]
  argv += ["--max-query-length", "16", "--doc-stride", "16", "--epochs", "1", "--batch-size", "8"]
  assert cli.main(argv + ["--no-progress"]) == 0
  results = json.loads((out / "results.json").read_text())
  assert results["dev"]["total"] > 0
  predictions = json.loads((out / "predictions.json").read_text())
  assert predictions and all(isinstance(v, str) for v in predictions.values())


# ------------------------------------------------------------------------- a changed block


def test_an_older_checkpoint_without_the_new_fields_is_bert():
  from bertjax import model as model_lib
  from bertjax.training import checkpoint

  bert = model_lib.from_preset("tiny")
  old = {k: v for k, v in bert.to_dict().items() if k not in ("norm_placement", "use_bias")}
  checkpoint.check_compatible(old, bert, "ckpt/7")  # written before the switches: BERT's
  with pytest.raises(checkpoint.CheckpointMismatchError, match="config.model.use_bias=True"):
    checkpoint.check_compatible(old, bert.replace(use_bias=False), "ckpt/7")
  # The RoPE base may change between phases (context extension): not a mismatch.
  rope = bert.replace(position_embedding="rope")
  checkpoint.check_compatible(rope.to_dict(), rope.replace(rope_theta=160000.0), "ckpt/7")


@pytest.mark.slow  # two pretraining runs, about 20 s
def test_resume_with_another_norm_placement_is_one_line(tmp_path, capsys):
  from conftest import pretrain_cmd

  argv = pretrain_cmd(tmp_path / "run", steps=2)[3:]  # without `python -m bertjax.cli`
  argv += ["--config.checkpoint.every_steps=2"]
  assert cli.main(argv) == 0
  capsys.readouterr()
  assert cli.main(argv + ["--config.model.norm_placement=pre", "--config.train.steps=4"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith("bertjax pretrain: ") and "config.model.norm_placement='post'" in err[0]
  assert "'pre'" in err[0]
