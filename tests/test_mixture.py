"""Weighted mixtures of prepared datasets (bertjax.data.mixture, `config.data.sources`): the
realised token shares follow the weights, the stream resumes bit for bit and on another host
count, a source that runs out repeats and says so, and the loop records `tokens_by_source`."""

import dataclasses
import logging

import numpy as np
import pytest

from bertjax import errors
from bertjax.data import hosts, inspect, mixture, pretraining, records
from conftest import loop_config, metrics_rows, run_until


def _cfg(spec: str, phase: int = 0, **kw) -> pretraining.InputConfig:
  kw.setdefault("seq_len", 128)
  kw.setdefault("max_predictions_per_seq", 20)
  return pretraining.InputConfig(
      sources=mixture.phase_weights(mixture.parse_sources(spec), phase), reader="python", **kw
  )


def _stream(cfg, batch=32, host=0, hosts_=1, state=None):
  return pretraining.make_stream(
      cfg, global_batch_size=batch, process_index=host, process_count=hosts_, state=state
  )


def _draw(stream, batches: int):
  """Per row: its source and its real tokens, over `batches` batches."""
  source, real = [], []
  for _ in range(batches):
    b = next(stream)
    source.append(b[mixture.SOURCE_FEATURE].argmax(1))
    real.append(b["attention_mask"].sum(1))
  return np.concatenate(source), np.concatenate(real).astype(float)


def _share_and_noise(source, real, i):
  """Source i's share of the real tokens and its standard error over independent row draws
  (the binomial noise of the draws, in tokens: the ratio estimator's delta method)."""
  x, x_i = real, real * (source == i)
  share = x_i.sum() / x.sum()
  se = np.sqrt(np.var(x_i - share * x) / len(x)) / x.mean()
  return share, se


def test_sources_parse_with_object_store_paths_and_phase_weights():
  got = mixture.parse_sources("web=gs://b/web:0.7:0.5, books=runs/books:0.3")
  assert got == (
      mixture.Source("web", "gs://b/web", (0.7, 0.5)),
      mixture.Source("books", "runs/books", (0.3,)),
  )
  # Normalised per phase; a phase past the weights given keeps the last.
  names, _, weights = zip(*mixture.phase_weights(got, 1))
  assert names == ("web", "books") and weights == pytest.approx((0.625, 0.375))
  assert mixture.parse_sources("") == ()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("web=runs/web", "has no weight"),
        ("runs/web:0.5", "is not NAME=PATH:WEIGHT"),
        ("a=x:1,a=y:1", "given twice"),
        ("a=x:0,b=y:0", "phase 1 are all 0"),
        ("a=x:-1,b=y:2", "weights are >= 0"),
        ("a=:1", "has no path"),
    ],
)
def test_a_malformed_source_list_is_one_line_naming_the_field(spec, message):
  with pytest.raises(errors.ConfigError, match=message) as e:
    mixture.parse_sources(spec)
  assert str(e.value).startswith("config.data.sources: ") and "\n" not in str(e.value)


def test_sources_prepared_with_another_tokenizer_are_refused(austen_shards):
  meta = records.load_metadata(austen_shards)
  other = {**meta, "tokenizer": {**meta["tokenizer"], "sha256": "0" * 64}}
  sources = mixture.parse_sources("a=x:1,b=y:1")
  mixture.check_tokenizers(sources, [meta, meta])
  with pytest.raises(errors.ConfigError, match="b .y. was prepared with another tokenizer"):
    mixture.check_tokenizers(sources, [meta, other])


def test_realised_token_shares_follow_the_weights_not_the_rows(austen_shards, snippet_shards):
  # Rows of very different lengths: novel chapters fill 128-token rows, review snippets ~45.
  cfg = _cfg(f"novels={austen_shards}:0.25,snippets={snippet_shards}:0.75", shuffle_buffer=64)
  source, real = _draw(_stream(cfg), 120)
  share, se = _share_and_noise(source, real, 0)
  assert abs(share - 0.25) < 4 * se, (share, se)
  assert se < 0.02  # enough rows for the check to mean something
  # The weight is of tokens: the novels' rows are longer, so they get fewer of them.
  assert (source == 0).mean() < 0.2


def test_packed_mixture_rows_share_one_shape_and_the_weights(austen_shards, snippet_shards):
  cfg = _cfg(
      f"novels={austen_shards}:0.5,snippets={snippet_shards}:0.5", packing=True, shuffle_buffer=64
  )
  each = [pretraining.examples_per_row(c) for c in mixture.source_configs(cfg)]
  stream = _stream(cfg, batch=16)
  assert stream.cfg.max_examples_per_row == pretraining.examples_per_row(cfg) == max(each)
  source, real = _draw(stream, 60)
  share, se = _share_and_noise(source, real, 0)
  assert abs(share - 0.5) < 4 * se, (share, se)
  stats = inspect.stats(cfg, 400, batch_size=16)
  assert stats["real_token_fraction"] > 0.9
  assert set(stats["mixture"]) == {"novels", "snippets"}
  assert stats["mixture"]["novels"]["requested"] == 0.5


def test_an_interrupted_mixture_resumes_to_the_same_batches_bit_for_bit(
    austen_shards, snippet_shards
):
  cfg = _cfg(f"novels={austen_shards}:0.4,snippets={snippet_shards}:0.6", shuffle_buffer=32)
  stream = _stream(cfg)
  for _ in range(9):
    next(stream)
  state = stream.get_state()
  want = [next(stream) for _ in range(5)]
  resumed = _stream(cfg, state=state)
  for a, b in zip(want, [next(resumed) for _ in range(5)]):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # A weight may change on resume (a new phase of the recipe); a source's name may not.
  _stream(
      dataclasses.replace(cfg, sources=((*cfg.sources[0][:2], 0.9), cfg.sources[1])), state=state
  )
  renamed = _cfg(f"books={austen_shards}:0.4,snippets={snippet_shards}:0.6", shuffle_buffer=32)
  with pytest.raises(errors.ConfigError, match="not its name"):
    _stream(renamed, state=state)


def test_a_mixture_carries_over_to_another_host_count(austen_shards, snippet_shards):
  cfg = _cfg(f"novels={austen_shards}:0.4,snippets={snippet_shards}:0.6", shuffle_buffer=32)
  two = [_stream(cfg, batch=24, host=h, hosts_=2) for h in range(2)]
  for _ in range(4):
    for s in two:
      next(s)
  saved = [s.get_state() for s in two]
  three, _ = pretraining.resume_states(saved, 3)
  for name in ("novels", "snippets"):  # each source as its own stream would carry over
    alone, _ = hosts.resume_states([s["sources"][name] for s in saved], 3)
    assert [t["sources"][name] for t in three] == alone
  total = np.sum([s["mixture"]["tokens"] for s in saved], 0)
  np.testing.assert_allclose(np.sum([t["mixture"]["tokens"] for t in three], 0), total)
  for h, state in enumerate(three):  # and the new hosts go on from there
    batch = next(_stream(cfg, batch=24, host=h, hosts_=3, state=state))
    assert batch["input_ids"].shape == (8, 128)


def test_a_source_that_runs_out_repeats_and_says_so(austen_shards, snippet_shards, caplog):
  cfg = _cfg(f"novels={austen_shards}:0.5,snippets={snippet_shards}:0.5", shuffle_buffer=16)
  stream = _stream(cfg)
  with caplog.at_level(logging.WARNING):
    for _ in range(30):
      next(stream)
  assert stream.get_state()["sources"]["novels"]["epoch"] >= 1
  said = [r.getMessage() for r in caplog.records if "repeats" in r.getMessage()]
  assert len([m for m in said if "'novels'" in m]) == 1, said  # once, not every epoch
  assert not [m for m in said if "'snippets'" in m]


def test_pretraining_on_a_mixture_records_tokens_by_source_and_resumes_exactly(
    tmp_path, austen_shards, snippet_shards
):
  spec = f"novels={austen_shards}:0.3,snippets={snippet_shards}:0.7"
  c = loop_config(
      6,
      **{
          "data.source": "prepared",
          "data.sources": spec,
          "model.vocab_size": None,
          "eval.every_steps": 0,
          "data.workers": 1,
      },
  )
  run_until(c, tmp_path, 3)
  from bertjax.training import loop

  assert loop.train_and_evaluate(c, str(tmp_path)) == 0
  train, _ = metrics_rows(tmp_path)
  assert sorted(train) == list(range(1, 7))
  # The loop's counts are the stream's: the same six batches drawn without a break.
  stream = _stream(_cfg(spec, seq_len=32, max_predictions_per_seq=5), batch=16)
  source, real = _draw(stream, 6)
  want = {name: int(real[source == i].sum()) for i, name in enumerate(("novels", "snippets"))}
  assert train[6]["tokens_by_source"] == want
  assert train[3]["tokens_by_source"]["novels"] < want["novels"]
