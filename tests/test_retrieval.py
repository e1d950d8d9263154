"""`bertjax retrieval`: measures equal to trec_eval's (pytrec_eval) on the same run, exact
blockwise search equal to a full sort, and the command on a small BEIR-format task with
malformed lines, a cached rerun and a BM25 row."""

import json
import pathlib

import numpy as np
import pytest

from test_embed import body, save_st  # noqa: F401  (the tiny sentence-transformers model)


def trec_eval(run, qrels):
  """MTEB's four measures from pytrec_eval: MRR@10 is recip_rank on the run cut at 10 in
  trec_eval's order."""
  import pytrec_eval

  from bertjax.tasks.retrieval import metrics

  measures = {"ndcg_cut.10", "recall.100", "map_cut.100"}
  full = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
  top10 = {q: {d: run[q][d] for d in metrics.ranked(run[q])[:10]} for q in run}
  rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
  mean = lambda key, res: float(np.mean([v[key] for v in res.values()]))
  return {
      "ndcg_at_10": mean("ndcg_cut_10", full),
      "mrr_at_10": mean("recip_rank", rr),
      "recall_at_100": mean("recall_100", full),
      "map_at_100": mean("map_cut_100", full),
  }


@pytest.mark.parametrize("seed", range(4))
def test_measures_equal_trec_eval(seed):
  """Graded judgements, judged-irrelevant and unjudged documents, queries with no relevant
  document, tied scores (trec_eval breaks ties by document id), runs of 5 to 150."""
  from bertjax.tasks.retrieval import metrics

  rng = np.random.default_rng(seed)
  docs = [f"d{i}" for i in range(300)]
  qrels, run = {}, {}
  for q in range(30):
    judged = rng.choice(docs, size=rng.integers(1, 12), replace=False)
    qrels[f"q{q}"] = {d: int(rng.choice([0, 1, 1, 2, 3])) for d in judged}
    n = int(rng.integers(5, 150))
    others = [d for d in rng.choice(docs, size=n, replace=False) if d not in judged]
    retrieved = list(rng.choice(judged, size=len(judged) // 2 + 1, replace=False)) + others
    n = len(retrieved)
    scores = np.round(rng.normal(size=n), 1)  # many ties
    run[f"q{q}"] = {d: float(s) for d, s in zip(retrieved, scores)}
  qrels["q0"] = {d: 0 for d in qrels["q0"]}
  got, want = metrics.evaluate(run, qrels), trec_eval(run, qrels)
  for k in metrics.KEYS:
    assert abs(got[k] - want[k]) <= 1e-6, (k, got[k], want[k])
  assert 0 < got["ndcg_at_10"] < 1


def test_blockwise_search_equals_full_sort():
  from bertjax.tasks.retrieval import search
  from bertjax.training import sharding

  rng = np.random.default_rng(0)
  q, d = rng.normal(size=(37, 16)).astype(np.float32), rng.normal(size=(203, 16))
  d = d.astype(np.float32)
  blocks = (d[i : i + 24] for i in range(0, len(d), 24))
  scores, idx = search.top_k(q, blocks, 10, mesh=sharding.make_mesh(data=-1), block=24)
  full = q @ d.T
  want = np.argsort(-full, axis=1)[:, :10]
  np.testing.assert_array_equal(idx, want)
  np.testing.assert_allclose(scores, np.take_along_axis(full, want, 1), atol=1e-5)


WORDS = "the quick brown fox jump over lazy dog unaffable cafe".split()


def write_task(root: pathlib.Path, seed: int = 0) -> None:
  """40 documents and 6 queries of the tiny vocabulary, each query judged against 1-3
  documents; one malformed line in each file."""
  rng = np.random.default_rng(seed)
  (root / "qrels").mkdir(parents=True)
  docs = [
      {"_id": f"d{i}", "title": "the " + WORDS[i % 10], "text": " ".join(rng.choice(WORDS, 12))}
      for i in range(40)
  ]
  lines = [json.dumps(d) for d in docs]
  lines.insert(5, "{not json")
  (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
  queries = [json.dumps({"_id": f"q{i}", "text": " ".join(rng.choice(WORDS, 4))}) for i in range(6)]
  (root / "queries.jsonl").write_text("\n".join(queries + ['{"_id": "q9"}']) + "\n")
  qrels = ["query-id\tcorpus-id\tscore"]
  for i in range(6):
    for d in rng.choice(40, size=int(rng.integers(1, 4)), replace=False):
      qrels.append(f"q{i}\td{d}\t{int(rng.integers(1, 3))}")
  qrels.append("q1\td2")
  (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")


@pytest.mark.slow  # the command end to end, twice, with BM25
def test_retrieval_command(body, tmp_path, monkeypatch, capsys):  # noqa: F811
  from bertjax import cli

  from bertjax.tasks.retrieval import metrics

  save_st(body, tmp_path / "model", "mean", normalize=True)
  write_task(tmp_path / "task")
  monkeypatch.chdir(tmp_path)
  argv = ["retrieval", "--init", "model", "--data", "task", "--split", "test", "--workdir", "out"]
  assert cli.main(argv + ["--bm25"]) == 0
  err = capsys.readouterr().err
  assert "task/corpus.jsonl:6: not a JSON object: skipped" in err
  assert "skipped 1 in corpus.jsonl, 1 in queries.jsonl, 1 in qrels/test.tsv" in err
  results = json.loads(pathlib.Path("out/results.json").read_text())
  run = json.loads(pathlib.Path("out/run.json").read_text())
  qrels = {}
  for line in pathlib.Path("task/qrels/test.tsv").read_text().splitlines()[1:-1]:
    q, d, s = line.split("\t")
    qrels.setdefault(q, {})[d] = int(s)
  assert sorted(run) == sorted(qrels) and all(len(r) == 40 for r in run.values())
  want = trec_eval(run, qrels)
  for k in metrics.KEYS:
    assert abs(results[k] - want[k]) <= 1e-6
  assert results["recall_at_100"] == 1.0  # 40 documents: every one is in the top 100
  assert (results["queries"], results["documents"]) == (6, 40)
  bm25 = json.loads(pathlib.Path("out/run_bm25.json").read_text())
  assert results["bm25"] == pytest.approx(trec_eval(bm25, qrels), abs=1e-6)
  assert "| BM25 |" in pathlib.Path("out/results.md").read_text()

  # A rerun reuses the corpus embeddings and gives the same scores.
  assert cli.main(argv) == 0
  assert "reusing out/corpus_embeddings.npy" in capsys.readouterr().err
  again = json.loads(pathlib.Path("out/results.json").read_text())
  assert again["ndcg_at_10"] == results["ndcg_at_10"]

  # A judged document the corpus lacks stops it, naming the qrels line.
  with open("task/qrels/test.tsv", "a") as f:
    f.write("q2\tnowhere\t1\n")
  assert cli.main(argv) == 2
  assert "task/qrels/test.tsv:" in capsys.readouterr().err


def test_bundled_task_reads_whole_and_rebuilds_byte_for_byte(tmp_path):
  import importlib.util

  from bertjax.tasks.retrieval import beir
  from conftest import REPO

  task = beir.load(str(REPO / "data" / "austen_retrieval"), "test")
  assert (len(task.corpus_ids), len(task.queries)) == (2141, 280)
  assert not task.skipped.counts
  spec = importlib.util.spec_from_file_location("make", REPO / "data" / "make_austen_retrieval.py")
  make = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(make)
  corpus, queries, _ = make.build((REPO / "data" / "austen.txt").read_text(encoding="utf-8"))
  lines = (REPO / "data" / "austen_retrieval" / "corpus.jsonl").read_text().splitlines()
  assert [json.loads(l) for l in lines] == corpus
  passages = {c["_id"]: c["text"] for c in corpus}
  for q, d in ((q["_id"], q["_id"][1:]) for q in queries):
    assert task.qrels[q] == {d: 1}
    assert task.queries[q] not in passages[d]  # the query's sentence was taken out
  # The training pairs: rebuilt the same, and none of their sentences is a test query or in
  # a test passage (they come from the chapters the corpus leaves out).
  text = (REPO / "data" / "austen.txt").read_text(encoding="utf-8")
  pairs_file = REPO / "data" / "austen_retrieval" / "train_pairs.jsonl"
  pairs = [json.loads(l) for l in pairs_file.read_text(encoding="utf-8").splitlines()]
  assert pairs == make.train_pairs(text) and len(pairs) == 4134
  test_text = set(task.queries.values()) | set(passages.values())
  assert all(r["query"] not in t for r in pairs[::50] for t in test_text)
  assert all(r["query"] not in r["positive"] and r["positive"] != r["negative"] for r in pairs)
