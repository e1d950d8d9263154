"""Packed rows: the plan, the layout, masks equal to the unpacked ones, exact resume."""

import dataclasses
import itertools
import json

import numpy as np
import pytest

from bertjax import errors
from bertjax.data import inspect, masking, packing, pretraining, synthetic
from bertjax.data.tokenizer import CLS_ID, PAD_ID, SEP_ID

L, P, E = 128, 20, 8


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, prepare_austen) -> str:
  return prepare_austen(tmp_path_factory.mktemp("austen_packing"), 400_000, num_shards=3)


def _cfg(data_dir, **kw) -> pretraining.InputConfig:
  # The Python reader: the same documents as tf.data's (test_data_tf_reader.py), without
  # loading TensorFlow.
  base = dict(
      path=data_dir,
      seq_len=L,
      max_predictions_per_seq=P,
      seed=5,
      shuffle_buffer=16,
      reader="python",
  )
  return pretraining.InputConfig(**{**base, "packing": True, **kw})


def _stream(cfg, batch=32, state=None, index=0, count=1):
  return pretraining.make_stream(
      cfg, global_batch_size=batch, process_index=index, process_count=count, state=state
  )


def _identity(item) -> tuple:
  epoch, shard, record, inst = item
  return epoch, shard, record, inst.index


def check_layout(b: dict, seq_len: int, max_examples: int) -> int:
  """Asserts every invariant of a packed batch; returns how many examples it holds."""
  B = len(b["input_ids"])
  assert set(b) == set(pretraining.PACKED_FEATURES)
  assert all(v.dtype == np.int32 and len(v) == B for v in b.values())
  for name in ("input_ids", "token_type_ids", "attention_mask", "segment_ids", "position_ids"):
    assert b[name].shape == (B, seq_len)
  for name in ("cls_positions", "nsp_labels", "nsp_weights"):
    assert b[name].shape == (B, max_examples)
  total = 0
  for r in range(B):
    seg, ids = b["segment_ids"][r], b["input_ids"][r]
    k = int(seg.max())
    n = int((seg > 0).sum())
    total += k
    assert k >= 1 and (seg[:n] > 0).all() and not seg[n:].any()  # real tokens first
    assert (np.diff(seg[:n]) >= 0).all() and set(seg[:n]) == set(range(1, k + 1))
    assert (b["attention_mask"][r] == (seg > 0)).all() and not ids[n:].any()
    assert list(b["nsp_weights"][r]) == [1] * k + [0] * (max_examples - k)
    assert not b["cls_positions"][r, k:].any() and not b["nsp_labels"][r, k:].any()
    for s in range(k):
      at = np.flatnonzero(seg == s + 1)
      start, end = at[0], at[-1] + 1
      assert b["cls_positions"][r, s] == start and ids[start] == CLS_ID and ids[end - 1] == SEP_ID
      assert (b["position_ids"][r, start:end] == np.arange(end - start)).all()
      seps = np.flatnonzero(ids[start:end] == SEP_ID)
      types = b["token_type_ids"][r, start:end]
      assert not types[: seps[0] + 1].any() and types[seps[0] + 1 :].all()
    assert not b["position_ids"][r, n:].any() and not b["token_type_ids"][r, n:].any()
    w = b["masked_weights"][r].astype(bool)
    pos = b["masked_positions"][r][w]
    assert list(w) == sorted(w, reverse=True) and (np.diff(pos) > 0).all()
    assert (pos < n).all() and not np.isin(ids[pos], [CLS_ID, SEP_ID, PAD_ID]).any()
    assert not b["masked_positions"][r][~w].any() and not b["masked_ids"][r][~w].any()
  return total


# ------------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("seed", range(4))
def test_plan_places_every_example_once_within_the_limits(seed):
  rng = np.random.default_rng(seed)
  lengths = list(rng.integers(3, L + 1, size=300)) + list(rng.integers(3, 30, size=200))
  for max_examples in (1, 3, 1000):
    rows = packing.plan_rows(lengths, L, max_examples)
    flat = [i for row in rows for i in row]
    assert sorted(flat) == list(range(len(lengths)))  # no loss, no duplicate
    assert all(sum(lengths[i] for i in row) <= L for row in rows)
    assert all(1 <= len(row) <= max_examples for row in rows)
    assert rows == packing.plan_rows(lengths, L, max_examples)  # deterministic
  # Without a cap on examples best-fit decreasing is within 11/9 of the optimum (Johnson 1973).
  assert len(rows) <= 11 / 9 * np.ceil(sum(lengths) / L) + 1
  assert len(packing.plan_rows(lengths, L, 1)) == len(lengths)


def test_plan_refuses_an_example_longer_than_a_row():
  with pytest.raises(ValueError, match="130 tokens does not fit seq_len 128"):
    packing.plan_rows([5, 130], L, E)


@pytest.mark.parametrize("mask_prob, seq_len", [(0.15, 128), (0.29, 100), (0.5, 64), (0.0, 64)])
def test_prediction_budget_holds_for_any_row(mask_prob, seq_len):
  """Rows of many short examples are the worst case: each gets at least one prediction."""
  rng = np.random.default_rng(0)
  budget = packing.prediction_budget(seq_len, 40, mask_prob, 12)
  spec = masking.MaskSpec(vocab_size=1000, max_predictions=40, mask_prob=mask_prob)
  worst = 0
  for _ in range(50):
    cuts = np.sort(rng.choice(np.arange(3, seq_len - 2), size=rng.integers(0, 11), replace=False))
    lengths = np.diff(np.concatenate([[0], cuts, [seq_len]]))
    lengths = lengths[lengths >= 3]
    ids = np.full((len(lengths), seq_len), PAD_ID, np.int32)
    for i, n in enumerate(lengths):
      ids[i, :n] = rng.integers(5, 1000, n)
      ids[i, 0], ids[i, n - 1] = CLS_ID, SEP_ID
    masked = masking.mask_batch(ids, masking.key(7, np.arange(len(ids))), spec)
    worst = max(worst, int(masked["masked_weights"].sum()))
  assert worst <= budget < 40 * 12
  assert packing.prediction_budget(128, 20, 0.15, 8) == 27  # 19 + 8, not 8 * 20


def test_real_token_fraction():
  mask = np.zeros((4, 10), np.int32)
  mask[:, :3] = 1
  mask[0] = 1
  assert packing.real_token_fraction(mask) == pytest.approx(19 / 40)


# ----------------------------------------------------------------------------- the layout


def _synthetic_examples(n: int, seq_len: int, short_seq_prob: float = 0.7) -> dict:
  spec = masking.MaskSpec(vocab_size=500, max_predictions=P)
  return synthetic.synthetic_batch(
      seed=1,
      step=0,
      rows=np.arange(n),
      seq_len=seq_len,
      pair_mode="nsp",
      short_seq_prob=short_seq_prob,
      spec=spec,
  )


def test_pack_then_unpack_gives_the_examples_back():
  ex = _synthetic_examples(64, L)
  rows = packing.plan_rows(list(ex["attention_mask"].sum(1)), L, E)
  budget = packing.prediction_budget(L, P, 0.15, E)
  b = packing.pack(ex, rows, max_examples=E, max_predictions=budget, pad_id=PAD_ID)
  assert check_layout(b, L, E) == 64 and len(rows) < 50
  assert b["masked_positions"].shape == (len(rows), budget)
  assert packing.real_token_fraction(b["attention_mask"]) > packing.real_token_fraction(
      ex["attention_mask"]
  )
  back = packing.unpack(b, P, PAD_ID)
  for row, examples in zip(rows, back):
    assert [e["offset"] for e in examples] == list(
        np.cumsum([0] + [int(ex["attention_mask"][i].sum()) for i in row])[:-1]
    )
    for i, e in zip(row, examples):
      for k in pretraining.FEATURES:
        np.testing.assert_array_equal(e[k], ex[k][i], err_msg=k)


def test_pack_refuses_a_row_that_overflows():
  ex = _synthetic_examples(4, 32, short_seq_prob=0.0)  # every example fills a row
  with pytest.raises(ValueError, match="needs 64 tokens; seq_len is 32"):
    packing.pack(ex, [[0, 1], [2], [3]], max_examples=E, max_predictions=30, pad_id=PAD_ID)
  assert (ex["masked_weights"].sum(1) == 5).all()  # round(32 * 0.15)
  with pytest.raises(ValueError, match="more than 4 predictions"):
    packing.pack(ex, [[0], [1]], max_examples=E, max_predictions=4, pad_id=PAD_ID)


# -------------------------------------------------------------------- the prepared stream


def test_a_blocks_instances_are_each_in_exactly_one_row(data_dir):
  packed, plain = _stream(_cfg(data_dir)), _stream(_cfg(data_dir, packing=False))
  for t in range(2):  # two blocks
    rows = packed.builder.rows(t)
    flat = [_identity(x) for row in rows for x in row]
    assert sorted(flat) == sorted(_identity(row[0]) for row in plain.builder.rows(t))
    assert len(flat) == len(set(flat))
    assert all(sum(x[3].length for x in row) <= L and len(row) <= E for row in rows)
    assert len(rows) < len(flat)  # some rows hold several examples


@pytest.mark.parametrize("pair_mode", ["nsp", "sop", "none"])
def test_packed_batches_keep_the_layout(data_dir, pair_mode):
  stream = _stream(_cfg(data_dir, pair_mode=pair_mode, short_seq_prob=0.3), batch=64)
  total = 0
  for b in itertools.islice(stream, 3):
    total += check_layout(b, L, E)
    assert b["masked_positions"].shape == (64, packing.prediction_budget(L, P, 0.15, E))
    if pair_mode == "none":
      assert not b["nsp_labels"].any() and not b["token_type_ids"].any()
  assert total > 3 * 64 * 1.05  # short_seq_prob 0.3 leaves room for more examples


def test_packed_masks_equal_the_unpacked_masks(data_dir):
  """Each example of a packed row is masked exactly as the unpacked stream masks it."""
  cfg = _cfg(data_dir, whole_word_mask=True, short_seq_prob=0.3)
  packed, plain = _stream(cfg, batch=48), _stream(dataclasses.replace(cfg, packing=False), 48)
  rows = packed.builder.rows(0)[:48]
  b = next(_stream(cfg, batch=48))  # the stream's own first batch is these rows
  for k, v in packed.builder._features(rows).items():
    np.testing.assert_array_equal(b[k], v, err_msg=k)
  flat = [x for row in rows for x in row]
  assert len(flat) > len(rows)
  want = plain.builder._features([[x] for x in flat])
  got = [e for examples in packing.unpack(b, P, PAD_ID) for e in examples]
  assert len(got) == len(flat)
  for i, e in enumerate(got):
    for k in pretraining.FEATURES:
      np.testing.assert_array_equal(e[k], want[k][i], err_msg=f"{k} of example {i}")


@pytest.mark.parametrize("skip", [2, 9])  # mid-block, a later block
def test_exact_resume_of_a_packed_stream(data_dir, skip):
  cfg = _cfg(data_dir)
  stream = _stream(cfg, batch=24)
  for _ in range(skip):
    next(stream)
  state = json.loads(json.dumps(stream.get_state()))
  assert state["packing"] is True and state["max_examples_per_row"] == E
  assert 0 < state["offset"] < len(stream._current["input_ids"])  # rows, not instances
  expected = [next(stream) for _ in range(3)]
  resumed = _stream(cfg, batch=24, state=state)
  for want in expected:
    got = next(resumed)
    for k in pretraining.PACKED_FEATURES:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_packing_is_deterministic_and_seeded(data_dir):
  a = list(itertools.islice(_stream(_cfg(data_dir)), 3))
  b = list(itertools.islice(_stream(_cfg(data_dir)), 3))
  for x, y in zip(a, b):
    for k in pretraining.PACKED_FEATURES:
      np.testing.assert_array_equal(x[k], y[k])
  c = next(_stream(_cfg(data_dir, seed=6)))
  assert not np.array_equal(a[0]["input_ids"], c["input_ids"])


def test_real_token_fraction_rises_with_packing(data_dir):
  plain = inspect.stats(_cfg(data_dir, packing=False), n=2048)
  packed = inspect.stats(_cfg(data_dir), n=2048)
  assert plain["examples_per_row"] == 1 and plain["rows"] == 2048
  assert 2048 <= packed["examples"] < 2048 + E and packed["rows"] < packed["examples"]
  assert packed["real_token_fraction"] > plain["real_token_fraction"] + 0.02
  assert packed["real_token_fraction"] > 0.98
  # The examples are the same kind: masking and labels do not change with packing.
  for k in ("masked_fraction", "nsp_positive_fraction", "mean_real_length"):
    assert packed[k] == pytest.approx(plain[k], rel=0.05), k


# ----------------------------------------------------------- synthetic source and config


def test_synthetic_packing_is_host_independent_and_matches_unpacked_at_one_example():
  def cfg(**kw):
    base = dict(source="synthetic", vocab_size=500, seq_len=64, max_predictions_per_seq=10)
    return pretraining.InputConfig(**{**base, "seed": 2, "packing": True, **kw})

  one = next(_stream(cfg(max_examples_per_row=1), batch=8))
  plain = next(_stream(cfg(packing=False), batch=8))
  for k in pretraining.FEATURES:
    np.testing.assert_array_equal(one[k].reshape(plain[k].shape), plain[k], err_msg=k)
  full = next(_stream(cfg(short_seq_prob=0.8), batch=12, state={"step": 3}))
  assert check_layout(full, 64, E) > 12 * 1.5
  parts = [next(_stream(cfg(short_seq_prob=0.8), 12, {"step": 3}, i, 3)) for i in range(3)]
  for k in pretraining.PACKED_FEATURES:
    np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), full[k], err_msg=k)


def test_config_and_state_checks(data_dir):
  with pytest.raises(errors.ConfigError, match=r"max_examples_per_row=-1 must be >= 1, or 0 to"):
    _stream(_cfg(data_dir, max_examples_per_row=-1))
  plain_state = _stream(_cfg(data_dir, packing=False)).get_state()
  with pytest.raises(errors.ConfigError, match="different settings.*packing"):
    _stream(_cfg(data_dir), state=plain_state)
  with pytest.raises(errors.ConfigError, match="different settings.*max_examples_per_row"):
    _stream(_cfg(data_dir, max_examples_per_row=3), state=_stream(_cfg(data_dir)).get_state())
  # A state saved before packing existed has no "packing": it was unpacked.
  legacy = {k: v for k, v in plain_state.items() if k != "packing"}
  _stream(_cfg(data_dir, packing=False), state=legacy)
  with pytest.raises(errors.ConfigError, match="different settings"):
    _stream(_cfg(data_dir), state=legacy)
