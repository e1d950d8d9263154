"""Packed rows stay full on short documents: the cap on examples per row is measured on the
corpus at the run's sequence length (pretraining.examples_per_row), not a fixed 8."""

import dataclasses

import numpy as np

from bertjax.data import inspect, pretraining


def _cfg(path, seq_len, e=pretraining.AUTO):
  return pretraining.InputConfig(
      path=path,
      seq_len=seq_len,
      max_predictions_per_seq=seq_len * 3 // 20,
      packing=True,
      max_examples_per_row=e,
      reader="python",
  )


def test_short_documents_fill_packed_rows_at_seq_512(snippet_shards):
  fixed = inspect.stats(_cfg(snippet_shards, 512, 8), 600)
  measured = inspect.stats(_cfg(snippet_shards, 512), 600)
  # A fixed 8 binds long before a row is full (what the rows were before E was measured).
  assert fixed["real_token_fraction"] < 0.8, fixed
  assert measured["real_token_fraction"] >= 0.97, measured
  e = measured["max_examples_per_row"]
  assert e % 8 == 0 and 8 < e <= pretraining.auto_examples_cap(512), e
  assert measured["examples_per_row"] > fixed["examples_per_row"] + 2


def test_the_measured_cap_follows_the_length_and_the_corpus(snippet_shards, austen_shards):
  short = [pretraining.examples_per_row(_cfg(snippet_shards, n)) for n in (128, 512)]
  assert short[0] < short[1], short  # longer rows take more short documents
  assert short[0] <= pretraining.auto_examples_cap(128) == 16
  # The bundled novels' chapters fill a row with one or two examples: the old 8 stays.
  assert pretraining.examples_per_row(_cfg(str(austen_shards), 512)) == 8
  # A set value is kept; synthetic rows, with no corpus to measure, take 8.
  assert pretraining.examples_per_row(_cfg(snippet_shards, 512, 5)) == 5
  synthetic = dataclasses.replace(_cfg("", 512), source="synthetic", vocab_size=1000)
  assert pretraining.examples_per_row(synthetic) == 8


def test_every_host_and_every_resume_measure_the_same_cap(snippet_shards):
  cfg = _cfg(snippet_shards, 512)
  streams = [
      pretraining.make_stream(cfg, global_batch_size=4, process_index=h, process_count=2)
      for h in range(2)
  ]
  e = {s.cfg.max_examples_per_row for s in streams}
  assert len(e) == 1 and e != {pretraining.AUTO}
  next(streams[0])
  again = pretraining.make_stream(
      cfg, global_batch_size=4, process_index=0, process_count=2, state=streams[0].get_state()
  )
  assert again.get_state() == streams[0].get_state()
  want, got = next(streams[0]), next(again)
  assert want.keys() == got.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
