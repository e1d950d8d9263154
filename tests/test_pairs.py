"""Pair data (bertjax.data.pairs): `bertjax prepare --kind pairs`, its stream, and
`pretrain --config contrastive` on it, end to end."""

import json

import numpy as np
import pytest
from conftest import WORDS, metrics_rows, write_vocab

from bertjax import cli, errors
from bertjax.data import pairs, records
from bertjax.training import config_checks
from experiments import pretrain

_PLAIN = [w for w in WORDS if w.isalpha() and w.isascii()]  # whole words of the test vocab


def _text(rng, n=4) -> str:
  return " ".join(rng.choice(_PLAIN, size=n))


def _rows(n, seed=0, negatives=True):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    row = {"query": f"{_text(rng)} {i}", "positive": f"{_text(rng)} {i}"}
    if negatives:
      row["negative"] = _text(rng, 6)  # short random texts: some repeat across rows
    out.append(row)
  return out


def _jsonl(path, rows, extra_lines=()):
  lines = [json.dumps(r) for r in rows] + list(extra_lines)
  path.write_text("\n".join(lines) + "\n")
  return path


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt", 120)


def _prepare(vocab, out, *inputs, extra=()):
  argv = ["prepare", "--kind", "pairs", "--input", *map(str, inputs)]
  argv += ["--tokenizer", str(vocab), "--output", str(out), *extra]
  assert cli.main(argv) == 0
  return records.load_metadata(out)


def test_prepare_counts_bad_rows_by_file_and_line(vocab, tmp_path, capsys):
  """JSON lines and Parquet; a bad row is skipped and named by file and line; the negatives'
  count is the first good row's; about 2% of the rows are held out, by query."""
  pq = pytest.importorskip("pyarrow.parquet")
  import pyarrow as pa

  good = _rows(300)
  bad = [
      "{not json",
      json.dumps({"query": "a", "negative": "b"}),  # no positive
      json.dumps({"query": "a", "positive": "b", "negative": ["c", "d"]}),  # 2 negatives
      json.dumps({"query": " ", "positive": "b", "negative": "c"}),  # blank query
  ]
  f1 = _jsonl(tmp_path / "a.jsonl", good, bad)
  f2 = tmp_path / "b.parquet"
  pq.write_table(pa.Table.from_pylist(_rows(20, seed=1)), f2)
  meta = _prepare(vocab, tmp_path / "p", f1, f2)
  out = capsys.readouterr()
  summary = json.loads(out.out.strip().splitlines()[-1])
  assert f"prepare: skipped {f1}:302: field 'positive' missing" in out.err
  assert summary["rows"] == 320 and summary["negatives"] == 1
  assert summary["skipped"] == {str(f1): 4}
  assert meta["skipped"][str(f1)] == {
      "2 negatives, not 1 as the first row": 1,
      "field 'positive' missing": 1,
      "field 'query' not a non-blank string": 1,
      "unparseable JSON line": 1,
  }
  assert f"{f1}:301: unparseable JSON line" in meta["examples_of_problems"]
  split = {s["split"]: s["documents"] for s in meta["shards"]}
  assert split["train"] + split["eval"] == 320 and 1 <= split["eval"] <= 16
  eval_queries = {r[0].tobytes() for r in pairs.load_rows(str(tmp_path / "p"), "eval")}
  train_queries = {r[0].tobytes() for r in pairs.load_rows(str(tmp_path / "p"), "train")}
  assert not eval_queries & train_queries

  with pytest.raises(errors.ConfigError, match="pair data .* trains config.objective=contrastive"):
    config_checks.check_data(pretrain.get_config("tiny"), meta, "config.data.path=p")
  # Prompts: prepended before tokenizing, recorded.
  meta = _prepare(vocab, tmp_path / "q", f1, extra=["--query-prompt", "fox: "])
  plain = pairs.load_rows(str(tmp_path / "p"), "train")[0]
  prompted = pairs.load_rows(str(tmp_path / "q"), "train")[0]
  assert len(prompted[0]) == len(plain[0]) + 2  # "fox", ":" (an [UNK])
  np.testing.assert_array_equal(prompted[1], plain[1])  # no document prompt
  assert meta["prompts"] == {"query": "fox: ", "document": ""}
  with pytest.raises(errors.ConfigError, match="--config.contrastive.hard_negatives=1"):
    c = pretrain.get_config("contrastive")
    c.contrastive.hard_negatives = 2
    config_checks.check_data(c, meta, "config.data.path=q")
  corpus = dict(meta, kind=None)
  with pytest.raises(errors.ConfigError, match="trains on pair data"):
    config_checks.check_data(pretrain.get_config("contrastive"), corpus, "config.data.path=c")


def _texts_of(batch, b):
  texts = [batch["query_ids"][b]] + list(batch["doc_ids"][b])
  masks = [batch["query_mask"][b]] + list(batch["doc_mask"][b])
  return [t[m > 0].tobytes() for t, m in zip(texts, masks)]


def test_stream_never_repeats_a_text_and_resumes_exactly():
  """Rows sharing a text are held back to a later batch (counted); the state after any batch
  restarts the same batches; two processes' halves are the one-process batch."""
  rng = np.random.default_rng(0)
  rows = [[rng.integers(5, 50, size=rng.integers(2, 7)) for _ in range(3)] for _ in range(40)]
  for i in range(0, 40, 4):
    rows[i + 1][2] = rows[i][2]  # the same hard negative as the row before
  special = {"pad": 0, "cls": 2, "sep": 3}
  make = lambda **kw: pairs.PairStream(rows, special, 8, 8, seed=3, **kw)
  s = make()
  batches = [next(s) for _ in range(12)]  # more than two epochs
  for batch in batches:
    texts = [t for b in range(8) for t in _texts_of(batch, b)]
    assert len(texts) == len(set(texts))
    assert batch["doc_ids"].shape == (8, 2, 8) and (batch["query_ids"][:, 0] == 2).all()
  state = s.get_state()
  assert state["held_back"] > 0 and state["epoch"] >= 2
  resumed = make()
  for _ in range(5):
    next(resumed)
  resumed = make(state=resumed.get_state())
  for want in batches[5:]:
    got = next(resumed)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])
  same = [[rows[i][0], rows[i][1], rows[0][2]] for i in range(40)]  # every row one negative
  with pytest.raises(errors.BadInputError, match="cannot fill a batch of 8 rows"):
    next(pairs.PairStream(same, special, 8, 8))
  halves = [make(process_index=i, process_count=2) for i in range(2)]
  for want in batches[:3]:
    got = [next(h) for h in halves]
    np.testing.assert_array_equal(np.concatenate([g["doc_ids"] for g in got]), want["doc_ids"])


@pytest.mark.slow
@pytest.mark.long  # ~40-80 s on the 2 busy cores: the 8-device step, eval step and checkpoints
def test_pretrain_contrastive_end_to_end(vocab, tmp_path):
  """`bertjax prepare --kind pairs --tokenizer DIR`, then `pretrain --config contrastive
  --init DIR` on it for 4 steps, DIR a transformers BertModel (no pooler, no MLM head), batch
  16: the loss, in-batch accuracy and mean rank logged, held-out metrics, the held-back rows
  counted, a checkpoint recording the objective and the data's prompts; exported, the
  directory declares them and embeds as `bertjax embed` does."""
  transformers = pytest.importorskip("transformers")
  hf = tmp_path / "hf"
  hf_cfg = transformers.BertConfig(
      vocab_size=120,
      hidden_size=32,
      num_hidden_layers=2,
      num_attention_heads=2,
      intermediate_size=64,
      max_position_embeddings=64,
  )
  transformers.BertModel(hf_cfg, add_pooling_layer=False).save_pretrained(hf)
  write_vocab(hf / "vocab.txt", 120)
  prompts = {"query": "fox: ", "document": "dog: "}
  extra = ["--query-prompt", prompts["query"], "--document-prompt", prompts["document"]]
  _prepare(hf, tmp_path / "p", _jsonl(tmp_path / "pairs.jsonl", _rows(400)), extra=extra)
  argv = ["pretrain", "--config", "contrastive", "--init", str(hf)]
  argv += ["--config.data.path", str(tmp_path / "p"), "--workdir", str(tmp_path / "run")]
  for k, v in {
      "train.batch_size": 16,
      "train.steps": 4,
      "train.warmup_steps": 1,
      "log_every_steps": 1,
      "eval.every_steps": 4,
      "eval.batch_size": 8,
      "eval.steps": 1,
      "tensorboard": False,
      "data.seq_len": 16,
  }.items():
    argv.append(f"--config.{k}={v}")
  assert cli.main(argv) == 0
  train, evals = metrics_rows(tmp_path / "run")
  assert sorted(train) == [1, 2, 3, 4]
  for row in train.values():
    assert np.isfinite(row["loss"]) and 1.0 <= row["contrastive_mean_rank"] <= 32
    assert 0.0 <= row["contrastive_accuracy"] <= 1.0
    assert row["rows_held_back"] >= 0 and row["rows_dropped"] >= 0
  assert np.isfinite(evals[-1]["eval_loss"]) and "eval_contrastive_accuracy" in evals[-1]
  meta = json.loads((tmp_path / "run" / "checkpoints" / "4" / "meta" / "metadata").read_text())
  assert meta["objective"] == "contrastive" and meta["contrastive"]["scale"] == 20.0
  assert meta["bert_config"]["hidden_size"] == 32  # the network of --init
  assert meta["prompts"] == prompts

  # Exported as a transformers BertModel, its mean-pooled embeddings are bertjax's.
  import torch

  from bertjax.training import objective_contrastive as oc, pretrained

  out = tmp_path / "hf_out"
  assert (
      cli.main(["convert", "--from", "bertjax", "--to", "hf", str(tmp_path / "run"), str(out)]) == 0
  )
  assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
  loaded = pretrained.load_pretrained(str(tmp_path / "run"))
  encoder = {k: v for k, v in loaded.params["bert"].items() if k != "pooler"}
  ids = np.array([[2, 10, 11, 12, 3, 0], [2, 13, 3, 0, 0, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  model = oc.ContrastiveModel(loaded.config, oc.Spec())
  ours = model.apply({"params": {"bert": encoder}}, ids, mask, method="embed")
  hf_model = transformers.BertModel.from_pretrained(out).eval()
  with torch.no_grad():
    h = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  m = torch.tensor(mask, dtype=torch.float32)[:, :, None]
  theirs = ((h * m).sum(1) / m.sum(1)).numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)

  # ... and as a sentence-transformers directory, with the pooling and normalisation it trained
  # with: SentenceTransformer's encode is the run's own embedding.
  from sentence_transformers import SentenceTransformer

  st_out = tmp_path / "st_out"
  argv = ["convert", "--from", "bertjax", "--to", "sentence-transformers"]
  assert cli.main(argv + [str(tmp_path / "run"), str(st_out)]) == 0
  modules = [m["type"] for m in json.loads((st_out / "modules.json").read_text())]
  assert modules[-1].endswith("Normalize")  # config.contrastive.normalize, the recipe's default
  st = SentenceTransformer(str(st_out), device="cpu")
  with torch.no_grad():
    feats = st.forward({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})
  np.testing.assert_allclose(
      feats["sentence_embedding"].numpy(),
      theirs / np.linalg.norm(theirs, axis=1, keepdims=True),
      atol=1e-5,
  )

  # The data's prompts, declared by the directory (no default), applied by name; `bertjax
  # embed --init RUN --prompt query` applies the same.
  st_cfg = json.loads((st_out / "config_sentence_transformers.json").read_text())
  assert st_cfg["prompts"] == prompts and st_cfg["default_prompt_name"] is None
  texts = [" ".join(r.values()) for r in _rows(5, seed=3, negatives=False)]
  (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
  argv = ["embed", "--init", str(tmp_path / "run"), "--input", str(tmp_path / "texts.txt")]
  assert cli.main(argv + ["--prompt", "query", "--output", str(tmp_path / "q.npy")]) == 0
  want = st.encode(texts, prompt_name="query", convert_to_numpy=True)
  assert not np.allclose(want, st.encode(texts, convert_to_numpy=True), atol=1e-3)
  np.testing.assert_allclose(np.load(tmp_path / "q.npy"), want, atol=1e-5)
  from bertjax.tasks import encoder as encoder_lib

  head = encoder_lib.load_encoder(str(tmp_path / "run")).sentence  # what retrieval reads
  assert (head.pooling, head.normalize, head.prompts) == ("mean", True, prompts)
