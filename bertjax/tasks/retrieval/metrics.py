"""Ranking measures as trec_eval computes them, under MTEB's names.

A run is {query id: {document id: score}}. As trec_eval, each query's documents are ranked by
score, ties by document id in reverse string order; a document is relevant when its qrels
judgement is >= 1; only queries in both the run and the qrels are scored, and the means are
over those. The measures (trec_eval's name in brackets):

  ndcg_at_10      nDCG over the top 10, gain = the judgement, discount log2(rank + 1), the
                  ideal from every judged document [ndcg_cut_10]
  mrr_at_10       1 / the rank of the first relevant document in the top 10, else 0
                  [recip_rank on the run cut at 10]
  recall_at_100   relevant documents in the top 100 / relevant documents [recall_100]
  map_at_100      mean over the relevant documents of the precision at each one's rank in
                  the top 100 (0 when not there) [map_cut_100]
"""

from __future__ import annotations

import math
from typing import Mapping

KEYS = ("ndcg_at_10", "mrr_at_10", "recall_at_100", "map_at_100")


def ranked(scores: Mapping[str, float]) -> list[str]:
  """Document ids best first, as trec_eval orders them (score, then id, both descending)."""
  return sorted(scores, key=lambda d: (scores[d], d), reverse=True)


def query_measures(ranking: list[str], judged: Mapping[str, int]) -> dict[str, float]:
  """The four measures of one query's ranking."""
  relevant = {d for d, rel in judged.items() if rel >= 1}
  dcg = sum(
      judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:10]) if d in relevant
  )
  ideal_gains = sorted((judged[d] for d in relevant), reverse=True)[:10]
  idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal_gains))
  rr = next((1.0 / (i + 1) for i, d in enumerate(ranking[:10]) if d in relevant), 0.0)
  hits, precisions = 0, 0.0
  for i, d in enumerate(ranking[:100]):
    if d in relevant:
      hits += 1
      precisions += hits / (i + 1)
  n = len(relevant)
  return {
      "ndcg_at_10": dcg / idcg if idcg > 0 else 0.0,
      "mrr_at_10": rr,
      "recall_at_100": hits / n if n else 0.0,
      "map_at_100": precisions / n if n else 0.0,
  }


def evaluate(
    run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]
) -> dict[str, float]:
  """The mean of each measure over the queries in both `run` and `qrels`."""
  queries = [q for q in qrels if q in run]
  if not queries:
    return {k: 0.0 for k in KEYS}
  per_query = [query_measures(ranked(run[q]), qrels[q]) for q in queries]
  return {k: sum(m[k] for m in per_query) / len(per_query) for k in KEYS}
