"""The MLM/NSP stream: masking statistics, pairs, per-host coverage, determinism, exact resume."""

import itertools
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bertjax.data import inspect, masking, pretraining, records
from bertjax.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SentencePieceTokenizer, SEP_ID

REPO = pathlib.Path(__file__).resolve().parents[1]
NUM_SHARDS = 7  # uneven for 2 and 3 hosts


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, prepare_austen) -> str:
  # The first ~1.2 MB of the bundled corpus (whole chapters) keeps the tests fast.
  return prepare_austen(
      tmp_path_factory.mktemp("austen"),
      1_200_000,
      num_shards=NUM_SHARDS,
      eval_fraction=0.05,
      eval_shards=3,
  )


def _cfg(data_dir, **kw) -> pretraining.InputConfig:
  base = dict(
      source="prepared",
      path=data_dir,
      seq_len=128,
      max_predictions_per_seq=20,
      seed=3,
      shuffle_buffer=64,
  )
  return pretraining.InputConfig(**{**base, **kw})


def _stream(cfg, batch=64, index=0, count=1, state=None, split="train"):
  return pretraining.make_stream(
      cfg,
      global_batch_size=batch,
      process_index=index,
      process_count=count,
      state=state,
      split=split,
  )


@pytest.mark.parametrize("pair_mode", ["nsp", "sop", "none"])
def test_features_shapes_and_segments(data_dir, pair_mode):
  b = next(_stream(_cfg(data_dir, pair_mode=pair_mode), batch=32))
  assert set(b) == set(pretraining.FEATURES)
  for name in ("input_ids", "attention_mask", "token_type_ids"):
    assert b[name].shape == (32, 128) and b[name].dtype == np.int32
  for name in ("masked_positions", "masked_ids", "masked_weights"):
    assert b[name].shape == (32, 20) and b[name].dtype == np.int32
  assert b["nsp_labels"].shape == (32,) and b["nsp_labels"].dtype == np.int32
  for row in range(32):
    n = int(b["attention_mask"][row].sum())
    assert b["attention_mask"][row, :n].all() and not b["attention_mask"][row, n:].any()
    ids, types = b["input_ids"][row], b["token_type_ids"][row]
    assert ids[0] == CLS_ID and ids[n - 1] == SEP_ID and not ids[n:].any()
    seps = np.flatnonzero(ids == SEP_ID)
    if pair_mode == "none":
      assert list(seps) == [n - 1] and not types.any() and b["nsp_labels"][row] == 0
    else:
      assert len(seps) == 2 and seps[0] >= 2 and seps[1] > seps[0] + 1
      assert not types[: seps[0] + 1].any() and types[seps[0] + 1 : n].all()
      assert not types[n:].any()


def test_masking_statistics_over_10k_examples(data_dir):
  s = inspect.stats(_cfg(data_dir), n=10_240)
  assert s["examples"] == 10_240
  assert abs(s["masked_fraction"] - 0.15) < 0.01
  assert abs(s["mask_token_fraction"] - 0.8) < 0.02
  assert abs(s["random_token_fraction"] - 0.1) < 0.02
  assert abs(s["unchanged_fraction"] - 0.1) < 0.02
  assert abs(s["nsp_positive_fraction"] - 0.5) < 0.02  # NSP balance
  assert 100 < s["mean_real_length"] <= 128


def test_sop_balance_and_no_nsp_labels(data_dir):
  assert (
      abs(inspect.stats(_cfg(data_dir, pair_mode="sop"), n=4096)["nsp_positive_fraction"] - 0.5)
      < 0.03
  )
  assert inspect.stats(_cfg(data_dir, pair_mode="none"), n=512)["nsp_positive_fraction"] == 1


def test_special_tokens_never_masked_and_originals_match(data_dir):
  stream = _stream(_cfg(data_dir, max_predictions_per_seq=40, mask_prob=0.3))
  for b in itertools.islice(stream, 8):
    w = b["masked_weights"].astype(bool)
    assert not np.isin(b["masked_ids"][w], [PAD_ID, CLS_ID, SEP_ID, MASK_ID]).any()
    assert (b["masked_ids"][~w] == 0).all() and (b["masked_positions"][~w] == 0).all()
    assert (w.sum(1) <= 40).all() and (w.sum(1) >= 1).all()
    at = np.take_along_axis(b["input_ids"], b["masked_positions"], 1)
    # Specials stay where they were: every [CLS]/[SEP] position is unmasked.
    for row in range(len(w)):
      pos = set(b["masked_positions"][row][w[row]])
      assert not pos & set(np.flatnonzero(np.isin(b["input_ids"][row], [CLS_ID, SEP_ID])))
      assert list(b["masked_positions"][row][w[row]]) == sorted(pos)  # increasing
    assert (at[w] != PAD_ID).all()


def test_cap_on_predictions(data_dir):
  b = next(_stream(_cfg(data_dir, max_predictions_per_seq=5, short_seq_prob=0.0)))
  n_masked = b["masked_weights"].sum(1)
  tokens = b["attention_mask"].sum(1)  # [CLS] and [SEP]s counted, as google-research/bert
  assert (n_masked == np.minimum(5, np.maximum(1, np.round(tokens * 0.15)))).all()
  assert (n_masked == 5).mean() > 0.9


def test_short_seq_prob_and_lengths(data_dir):
  full = inspect.stats(_cfg(data_dir, short_seq_prob=0.0), n=1024)["mean_real_length"]
  short = inspect.stats(_cfg(data_dir, short_seq_prob=0.5), n=1024)["mean_real_length"]
  assert full > 120 and short < full - 12  # chunks overshoot short targets by a sentence
  b = next(_stream(_cfg(data_dir, seq_len=512, max_predictions_per_seq=80), batch=8))
  assert b["input_ids"].shape == (8, 512) and b["attention_mask"].sum(1).max() <= 512


def test_whole_words_kept_whole(data_dir):
  tok = SentencePieceTokenizer(pathlib.Path(data_dir) / "tokenizer.model")
  starts = np.array(tok.word_start_table())
  stream = _stream(_cfg(data_dir, whole_word_mask=True, max_predictions_per_seq=30))
  checked = 0
  for b in itertools.islice(stream, 4):
    for row in range(len(b["input_ids"])):
      w = b["masked_weights"][row].astype(bool)
      masked = set(b["masked_positions"][row][w])
      orig = b["input_ids"][row].copy()
      orig[b["masked_positions"][row][w]] = b["masked_ids"][row][w]
      n = int(b["attention_mask"][row].sum())
      for p in range(1, n - 1):
        continues = (
            not starts[orig[p]]
            and orig[p - 1] not in (CLS_ID, SEP_ID)
            and orig[p] not in (CLS_ID, SEP_ID)
        )
        if continues:  # same word as p-1: both masked or neither
          assert (p in masked) == (p - 1 in masked), (row, p)
          checked += p in masked
  assert checked > 50  # multi-piece words were actually masked


def _host_documents(stream, epoch: int = 0) -> list:
  """(shard, record, sentences) of the blocks this host takes in `epoch`, in its order."""
  docs, i = [], 0
  while stream.plan(i)[1][0] <= epoch:
    _, (e, block, _) = stream.plan(i)
    if e == epoch:
      docs += stream.builder.documents(e * stream.builder.blocks_per_epoch + block)
    i += 1
  return docs


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [2, 3])
def test_hosts_cover_every_document_once(data_dir, hosts):
  cfg = _cfg(data_dir)
  meta = records.load_metadata(data_dir)
  seen = []
  for index in range(hosts):
    stream = _stream(cfg, batch=6, index=index, count=hosts)
    seen.append([(s, r) for s, r, _ in _host_documents(stream)])
    # The hosts take the epoch's blocks in turns: host h builds blocks h, h+H, ...
    blocks = range(index, stream.builder.blocks_per_epoch, hosts)
    assert [stream.plan(i)[1][1] for i in range(len(blocks))] == list(blocks)
  flat = [d for host in seen for d in host]
  assert len(flat) == len(set(flat))  # no overlap
  train_docs = sum(s["documents"] for s in meta["shards"] if s["split"] == "train")
  assert len(flat) == train_docs  # full coverage
  assert all(abs(len(h) - len(flat) / hosts) <= cfg.shuffle_buffer for h in seen)  # balanced


@pytest.mark.slow
def test_batches_only_use_the_hosts_documents(data_dir):
  cfg = _cfg(data_dir, pair_mode="none")
  blobs, rows = [], []
  for index in range(2):
    stream = _stream(cfg, batch=32, index=index, count=2)
    blobs.append(b"|".join(np.concatenate(d).tobytes() for _, _, d in _host_documents(stream)))
    b = next(stream)
    orig = b["input_ids"].copy()  # undo the masking to get the document's tokens back
    np.put_along_axis(orig, b["masked_positions"], b["masked_ids"], 1)
    long_rows = np.flatnonzero(b["attention_mask"].sum(1) >= 18)
    assert len(long_rows) >= 12  # of 16 rows per host
    rows.append([orig[r, 1:17].tobytes() for r in long_rows])
  for index in range(2):
    assert all(window in blobs[index] for window in rows[index])
    assert sum(window in blobs[1 - index] for window in rows[index]) <= 1


def test_fewer_files_than_hosts_serve_every_host(data_dir):
  """4 hosts on 3 held-out files: every host reads blocks of all of them, host h block h."""
  cfg = _cfg(data_dir)
  builder = _stream(cfg, split="eval").builder
  assert len(builder.shards) == 3
  for index in range(4):
    batch = next(_stream(cfg, batch=8, index=index, count=4, split="eval"))
    first = builder(index)  # block `index` of the held-out blocks, counted across epochs
    for k in batch:
      np.testing.assert_array_equal(batch[k], first[k][:2], err_msg=k)
  with pytest.raises(ValueError, match="not divisible"):
    _stream(_cfg(data_dir), batch=10, index=0, count=3)


def test_model_vocab_smaller_than_tokenizer_is_an_error(data_dir):
  with pytest.raises(ValueError, match="vocab_size=4000"):
    _stream(_cfg(data_dir, vocab_size=4000))
  next(_stream(_cfg(data_dir, vocab_size=8064)))  # padded model vocab: fine


def test_eval_split_is_separate(data_dir):
  ev = next(_stream(_cfg(data_dir), split="eval"))
  tr = next(_stream(_cfg(data_dir)))
  assert ev["input_ids"].shape == tr["input_ids"].shape
  assert not np.array_equal(ev["input_ids"], tr["input_ids"])


@pytest.mark.slow
def test_same_seed_same_stream_other_seed_differs(data_dir):
  a = list(itertools.islice(_stream(_cfg(data_dir)), 3))
  b = list(itertools.islice(_stream(_cfg(data_dir)), 3))
  c = next(_stream(_cfg(data_dir, seed=4)))
  for x, y in zip(a, b):
    for k in pretraining.FEATURES:
      np.testing.assert_array_equal(x[k], y[k])
  assert not np.array_equal(a[0]["input_ids"], c["input_ids"])


@pytest.mark.slow
@pytest.mark.parametrize("skip", [1, 7, 60])  # mid-block, later block, next epoch
def test_exact_resume(data_dir, skip):
  cfg = _cfg(data_dir, shuffle_buffer=16)
  stream = _stream(cfg, batch=48)
  for _ in range(skip):
    next(stream)
  state = json.loads(json.dumps(stream.get_state()))  # as a checkpoint stores it
  expected = [next(stream) for _ in range(4)]
  resumed = _stream(cfg, batch=48, state=state)
  for want in expected:
    got = next(resumed)
    for k in pretraining.FEATURES:
      np.testing.assert_array_equal(got[k], want[k])
  if skip == 60:
    assert state["epoch"] >= 1  # the stream went past an epoch boundary
  assert len(json.dumps(state)) < 400  # small, not a replay log


def test_resume_rejects_other_settings(data_dir):
  state = _stream(_cfg(data_dir)).get_state()
  with pytest.raises(ValueError, match="different settings"):
    _stream(_cfg(data_dir, seq_len=256), state=state)
  with pytest.raises(ValueError, match="different settings"):
    _stream(_cfg(data_dir), batch=64, index=0, count=2, state=state)


def test_masking_is_a_function_of_key_only():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 1000, size=(16, 64)).astype(np.int32)
  ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
  spec = masking.MaskSpec(vocab_size=1000, max_predictions=10)
  keys = masking.key(1, np.arange(16))
  a, b = masking.mask_batch(ids, keys, spec), masking.mask_batch(ids, keys, spec)
  np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
  # Row order does not matter: the same key masks the same way in any batch position.
  perm = rng.permutation(16)
  c = masking.mask_batch(ids[perm], keys[perm], spec)
  np.testing.assert_array_equal(c["masked_positions"], a["masked_positions"][perm])
  # A new epoch (another key) gives new masks: dynamic masking.
  d = masking.mask_batch(ids, masking.key(2, np.arange(16)), spec)
  assert not np.array_equal(d["masked_positions"], a["masked_positions"])


def test_synthetic_global_batch_independent_of_host_count():
  cfg = pretraining.InputConfig(
      source="synthetic", vocab_size=500, seq_len=64, max_predictions_per_seq=10, seed=7
  )
  one = pretraining.make_stream(cfg, global_batch_size=12, process_index=0, process_count=1)
  for _ in range(2):
    next(one)
  ref = next(one)
  for hosts in (2, 3, 4):
    parts = []
    for i in range(hosts):
      s = pretraining.make_stream(
          cfg, global_batch_size=12, process_index=i, process_count=hosts, state={"step": 2}
      )
      parts.append(next(s))
    for k in pretraining.FEATURES:
      np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), ref[k])


@pytest.mark.slow
def test_synthetic_statistics():
  cfg = pretraining.InputConfig(
      source="synthetic", vocab_size=8000, seq_len=128, max_predictions_per_seq=20, seed=1
  )
  stream = pretraining.make_stream(cfg, global_batch_size=1024, process_index=0, process_count=1)
  b = {
      k: np.concatenate([x[k] for x in itertools.islice(stream, 10)]) for k in pretraining.FEATURES
  }
  real = (
      (b["input_ids"] != PAD_ID) & (b["input_ids"] != CLS_ID) & (b["input_ids"] != SEP_ID)
  ).sum()
  assert abs(b["masked_weights"].sum() / real - 0.15) < 0.01
  assert abs(b["nsp_labels"].mean() - 0.5) < 0.02


@pytest.mark.process
def test_synthetic_source_runs_without_tensorflow():
  code = (
      "import sys; sys.modules['tensorflow'] = None\n"
      "from bertjax.data import pretraining as p\n"
      "cfg = p.InputConfig(source='synthetic', vocab_size=100, seq_len=32,"
      " max_predictions_per_seq=5)\n"
      "b = next(p.make_stream(cfg, global_batch_size=4, process_index=0, process_count=1))\n"
      "assert b['input_ids'].shape == (4, 32)\n"
      "assert 'tensorflow' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
  )
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.slow
def test_prepared_source_runs_without_tensorflow(data_dir):
  code = (
      "import sys; sys.modules['tensorflow'] = None\n"
      "from bertjax.data import pretraining as p\n"
      f"cfg = p.InputConfig(path={data_dir!r}, whole_word_mask=True)\n"
      "b = next(p.make_stream(cfg, global_batch_size=8, process_index=0, process_count=1))\n"
      "assert b['input_ids'].shape == (8, 128)\n"
  )
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("seq_len", 4, "InputConfig.seq_len=4 is too short for pair_mode 'nsp': it must be >= 5"),
        ("max_predictions_per_seq", 0, "InputConfig.max_predictions_per_seq=0 must be >= 1"),
        ("mask_prob", 1.5, "InputConfig.mask_prob=1.5 must be in [0, 1]"),
        ("short_seq_prob", -0.1, "InputConfig.short_seq_prob=-0.1"),
        ("random_token_prob", 0.3, "mask_token_prob + random_token_prob = 1.1 must be <= 1"),
        ("shuffle_buffer", 0, "InputConfig.shuffle_buffer=0 must be >= 1"),
        ("pair_mode", "mlm", "InputConfig.pair_mode='mlm': valid options"),
    ],
)
def test_input_config_is_range_checked(data_dir, field, value, needle):
  from bertjax import errors

  with pytest.raises(errors.ConfigError) as e:
    _stream(_cfg(data_dir, **{field: value}))
  assert needle in str(e.value)


def test_a_split_without_shards_and_a_directory_without_data_are_named(data_dir, tmp_path):
  from bertjax import errors

  (tmp_path / "d").mkdir()
  meta = json.loads((pathlib.Path(data_dir) / "metadata.json").read_text())
  meta["shards"] = [s for s in meta["shards"] if s["split"] == "train"]
  for s in meta["shards"]:
    (tmp_path / "d" / s["file"]).symlink_to(pathlib.Path(data_dir) / s["file"])
  (tmp_path / "d" / "metadata.json").write_text(json.dumps(meta))
  with pytest.raises(errors.ConfigError, match=r"no eval shard — none of its documents is held"):
    _stream(_cfg(str(tmp_path / "d")), split="eval")
  with pytest.raises(errors.InputNotFoundError, match=r"no metadata.json in it, so not data"):
    records.load_metadata(tmp_path)
  with pytest.raises(errors.InputNotFoundError, match=r"nowhere: no such directory"):
    records.load_metadata(tmp_path / "nowhere")
  (tmp_path / "d" / "metadata.json").write_text('{"shards": [')
  with pytest.raises(errors.BadInputError, match=r"metadata.json:1: not valid JSON .*--overwrite"):
    records.load_metadata(tmp_path / "d")


# ----------------------------------------------------------------------- worker processes


@pytest.mark.long
@pytest.mark.slow  # starts 3 worker processes, each importing bertjax
def test_batches_do_not_depend_on_the_number_of_workers(data_dir):
  """1 (in-process) and 3 Grain worker processes give the same batches, batch by batch,
  across an epoch's end, and the 3 workers' state resumes in the process (1). Packed: a
  worker returns a block's rows whatever their number, the case that holds the unpacked one (a
  block's rows are its instances); the in-process stream is checked unpacked and packed
  against its own resumes in test_stream_hosts.py."""
  cfg = _cfg(data_dir, packing=True, shuffle_buffer=16)
  streams = {w: _stream(pretraining.dataclasses.replace(cfg, workers=w)) for w in (1, 3)}
  blocks = streams[1].builder.blocks_per_epoch
  try:
    for step in range(60):
      batches = {w: next(s) for w, s in streams.items()}
      for k, v in batches[1].items():
        np.testing.assert_array_equal(batches[3][k], v, err_msg=f"{k}, step {step}, 3 workers")
      assert len({json.dumps(s.get_state()) for s in streams.values()}) == 1
    state = streams[3].get_state()
    assert state["epoch"] >= 1 or state["block"] > 2 * 3  # several blocks per worker
    assert blocks > 3
    expected = [next(streams[1]) for _ in range(3)]
    resumed = _stream(pretraining.dataclasses.replace(cfg, workers=1), state=state)
    try:
      for want in expected:
        for k, v in next(resumed).items():
          np.testing.assert_array_equal(v, want[k], err_msg=k)
    finally:
      resumed.close()
  finally:
    for s in streams.values():
      s.close()
