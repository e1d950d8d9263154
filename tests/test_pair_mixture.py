"""Pair datasets mixed by weight (bertjax.data.pair_mixture, `config.data.sources` with the
contrastive objective): the realised token shares follow the weights, no batch holds a text
twice whichever sources it came from, the stream resumes exactly on another host count, the
sources must agree (tokenizer, hard negatives, prompts), the held-out stream says which sources it
covers, and the step counts each source's tokens."""

import json
import logging

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import WORDS, built_once, write_vocab

from bertjax import errors
from bertjax.data import mixture, pair_mixture, pairs
from bertjax.training import config_checks, loop, streams, train
from experiments import pretrain

_PLAIN = [w for w in WORDS if w.isalpha() and w.isascii()]
SPECIAL = {"pad": 0, "cls": 2, "sep": 3}


def _rows(n, seed, words, negatives=1, shared=()):
  """`n` rows of random texts of `words` words; the negatives drawn from `shared` when given
  (texts other sources hold too)."""
  rng = np.random.default_rng(seed)
  text = lambda k: " ".join(rng.choice(_PLAIN, size=k))
  out = []
  for _ in range(n):
    negs = [str(rng.choice(shared)) if shared else text(words) for _ in range(negatives)]
    out.append({"query": text(words), "positive": text(words), "negative": negs})
  return out


def _build(root):
  """Pair sets sharing one vocab: `short` (4-word texts), `long` (12-word texts); both draw
  their negatives from the same 60 texts. `two` holds 2 negatives per row, `noeval` no
  held-out rows, `othertok` another tokenizer, `prompted` a query prompt."""
  vocab = write_vocab(root / "vocab.txt", 120)
  other = write_vocab(root / "other.txt", 130)
  rng = np.random.default_rng(9)
  shared = [" ".join(rng.choice(_PLAIN, size=5)) for _ in range(60)]
  sets = {
      "short": (_rows(400, 0, 4, shared=shared), vocab, 0.05),
      "long": (_rows(300, 1, 12, shared=shared), vocab, 0.05),
      "two": (_rows(50, 2, 4, negatives=2), vocab, 0.05),
      "noeval": (_rows(50, 3, 4), vocab, 0.0),
      "othertok": (_rows(50, 4, 4), other, 0.05),
      "prompted": (_rows(50, 5, 4), vocab, 0.05),
  }
  for name, (rows, tok, held) in sets.items():
    (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs.prepare(
        pairs.PairsConfig(
            output=str(root / name),
            tokenizer=str(tok),
            inputs=(str(root / f"{name}.jsonl"),),
            negative_fields=("negative",),
            eval_fraction=held,
            query_prompt="fox: " if name == "prompted" else "",
        )
    )


@pytest.fixture(scope="module")
def pair_sets(tmp_path_factory):
  return built_once(tmp_path_factory, "pair_sets", _build)


def _sources(root, spec: str):
  """'short:0.7,long:0.3' -> (name, path, weight) of phase 1 (`mixture.phase_weights`)."""
  text = ",".join(
      f"{e.split(':')[0]}={root / e.split(':')[0]}:{e.split(':')[1]}" for e in spec.split(",")
  )
  return mixture.phase_weights(mixture.parse_sources(text), 0)


def _stream(root, spec, batch=16, host=0, hosts=1, state=None, split="train", seq_len=24):
  return pair_mixture.make(
      _sources(root, spec),
      seq_len=seq_len,
      global_batch_size=batch,
      process_index=host,
      process_count=hosts,
      seed=5,
      state=state,
      split=split,
  )


def _texts(batch, b):
  texts = [batch["query_ids"][b]] + list(batch["doc_ids"][b])
  masks = [batch["query_mask"][b]] + list(batch["doc_mask"][b])
  return [t[m > 0].tobytes() for t, m in zip(texts, masks)]


def test_token_shares_follow_the_weights_and_no_batch_repeats_a_text(pair_sets):
  """60 batches of 16 from `short` 0.7 and `long` 0.3 (rows ~2.4x as long): the real tokens
  split 70/30 (within 3 standard errors of the draws), the rows do not; no batch holds a text
  twice although the two sources share their negatives (rows held back, counted)."""
  s = _stream(pair_sets, "short:0.7,long:0.3")
  source, real = [], []
  for _ in range(60):
    b = next(s)
    texts = [t for r in range(16) for t in _texts(b, r)]
    assert len(texts) == len(set(texts))
    source.append(b[mixture.SOURCE_FEATURE].argmax(1))
    real.append(b["query_mask"].sum(1) + b["doc_mask"].sum((1, 2)))
  source, real = np.concatenate(source), np.concatenate(real).astype(float)
  x_short = real * (source == 0)
  share = x_short.sum() / real.sum()
  se = np.sqrt(np.var(x_short - share * real) / len(real)) / real.mean()
  assert abs(share - 0.7) < 3 * se, (share, se)
  assert (source == 0).mean() > 0.8  # the short rows: far more than 70% of the rows
  state = s.get_state()
  assert state["held_back"] > 0 and state["held_back"] == sum(
      v["held_back"] for v in state["sources"].values()
  )
  both = set()  # a negative text both sources hold: the rule really works across them
  for name in ("short", "long"):
    negs = {r[2].tobytes() for r in pairs.load_rows(str(pair_sets / name), "train")}
    both = negs if not both else both & negs
  assert both


def test_resumes_exactly_on_another_host_count(pair_sets):
  """The state after batch 3 of one host restarts batches 4-6 bit for bit on 1, 2 and 4 hosts
  (each host's rows the global batch's), as the loop hands it over (`loop._data_state`)."""
  one = _stream(pair_sets, "short:0.5,long:0.5")
  for _ in range(3):
    next(one)
  saved = one.get_state()
  want = [next(one) for _ in range(3)]

  class Log:
    lines = []

    def log(self, line):
      self.lines.append(line)

  for hosts in (1, 2, 4):
    # Saved by `hosts` processes (the same state on each), resumed by this one process.
    state = loop._data_state(None, [{"phase": 0, "stream": saved}] * hosts, Log())["stream"]
    parts = [
        _stream(pair_sets, "short:0.5,long:0.5", host=h, hosts=hosts, state=state)
        for h in range(hosts)
    ]
    for batch in want:
      got = [next(p) for p in parts]
      for k in batch:
        np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), batch[k], err_msg=k)
  assert "carries over to 1" in Log.lines[-1]
  # A single dataset's state (saved before it was marked, too) goes on the same way.
  single = pairs.PairStream(pairs.load_rows(str(pair_sets / "short"), "train"), SPECIAL, 16, 8)
  next(single)
  old = {k: v for k, v in single.get_state().items() if k != "kind"}
  assert loop._data_state(None, [{"phase": 0, "stream": old}] * 2, Log())["stream"] == old
  with pytest.raises(errors.ConfigError, match="a source can change its weight"):
    _stream(pair_sets, "short:0.5,noeval:0.5", state=saved)
  with pytest.raises(errors.ConfigError, match="saved by a run on one pair dataset"):
    _stream(pair_sets, "short:1", state=old)
  with pytest.raises(errors.ConfigError, match="saved by a run mixing config.data.sources"):
    pairs.PairStream(single.rows, SPECIAL, 16, 8, state=saved)


def _contrastive(spec):
  c = pretrain.get_config("contrastive")
  c.data.sources = spec
  return c


def test_sources_must_share_tokenizer_hard_negatives_and_prompts(pair_sets):
  """One line naming the source and the field: another count of negatives, another tokenizer,
  other prompts; two agreeing pair sources pass the run's checks."""
  p = lambda name: f"{name}={pair_sets / name}:1"
  cases = {
      f"{p('short')},{p('two')}": r"two \(.*\) holds 2 hard negative\(s\) per row .*`negatives`",
      f"{p('short')},{p('othertok')}": r"othertok \(.*\) was prepared with another tokenizer",
      f"{p('short')},{p('prompted')}": r"prompted \(.*\) was prepared with prompts query 'fox: ' "
      r"\(metadata.json `prompts`\), short \(.*\) with none; .* --query-prompt",
  }
  for spec, message in cases.items():
    with pytest.raises(errors.ConfigError, match=message) as e:
      config_checks.check_inputs(_contrastive(spec), str(pair_sets / "run"))
    assert str(e.value).startswith("config.data.sources: ") and "\n" not in str(e.value)
  with pytest.raises(errors.ConfigError, match="holds 2 hard negative"):  # the stream, too
    _stream(pair_sets, "short:1,two:1")
  with pytest.raises(errors.ConfigError, match="prepared with prompts"):
    _stream(pair_sets, "short:1,prompted:1")
  meta = config_checks.check_inputs(_contrastive(f"{p('short')},{p('long')}"), "run")
  assert meta["kind"] == "pairs"


def test_held_out_stream_covers_every_source_that_holds_held_out_pairs(pair_sets, caplog):
  """The held-out batches mix the sources' held-out rows by weight; a source without any is
  named in one warning; none at all is an error. The run's check counts all sources."""
  with caplog.at_level(logging.WARNING):
    s = _stream(pair_sets, "short:1,long:1,noeval:1", batch=8, split="eval")
  assert "leaves out source(s) noeval" in caplog.text
  assert s.names == ["short", "long"]
  drawn = np.concatenate([next(s)[mixture.SOURCE_FEATURE].argmax(1) for _ in range(6)])
  assert set(drawn) == {0, 1}
  with pytest.raises(errors.ConfigError, match="no source holds held-out pairs"):
    _stream(pair_sets, "noeval:1", batch=8, split="eval")
  c = _contrastive(f"short={pair_sets / 'short'}:1,long={pair_sets / 'long'}:1")
  held = sum(len(pairs.load_rows(str(pair_sets / n), "eval")) for n in ("short", "long"))
  c.eval.batch_size = held

  class Log:

    def log(self, line):
      raise AssertionError(line)

  assert streams.pairs_have_eval_data(c, None, Log())


def test_the_step_counts_each_sources_real_tokens(pair_sets):
  """`tokens_by_source` of a mixed pair batch: each row's query and documents, by source."""
  b = next(_stream(pair_sets, "short:0.5,long:0.5"))
  got = train.batch_shape_metrics({k: jnp.asarray(v) for k, v in b.items()})["tokens_by_source"]
  real = b["query_mask"].sum(1) + b["doc_mask"].sum((1, 2))
  want = [real[b[mixture.SOURCE_FEATURE][:, i] > 0].sum() for i in range(2)]
  np.testing.assert_allclose(np.asarray(got), want)
  assert min(want) > 0
