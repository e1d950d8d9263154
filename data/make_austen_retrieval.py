"""Regenerates `data/austen_retrieval/`, the bundled retrieval task, from `data/austen.txt`.

An inverse-cloze task in BEIR's layout (`bertjax retrieval --data data/austen_retrieval`): the
corpus is passages of 5 consecutive sentences of every third chapter of the bundled novels;
a query is one sentence taken out of a passage (the passage's longest, of 12 words or more),
and the passage it came from, without it, is the one relevant document. `train_pairs.jsonl`
holds training pairs made the same way from the other chapters (none of the corpus's text):
`query`, `positive` (its passage without it) and `negative` (the next passage of the same
chapter, a hard negative), for `bertjax prepare --kind pairs`. Which passages give
a query is decided by a hash of the passage's id, so the output is the same byte for byte on
every machine and Python. Needs only the standard library.

    python data/make_austen_retrieval.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
SENTENCES_PER_PASSAGE = 5
EVERY_NTH_CHAPTER = 3
QUERY_ONE_IN = 7  # about one passage in 7 gives a query
MIN_QUERY_WORDS = 12


def chapters(text: str) -> list[list[str]]:
  """The documents of austen.txt (sentences, a blank line between documents)."""
  return [[s for s in block.split("\n") if s.strip()] for block in text.split("\n\n")]


def build(text: str) -> tuple[list[dict], list[dict], list[tuple[str, str]]]:
  """(corpus records, query records, (query id, passage id) judgements)."""
  corpus, queries, qrels = [], [], []
  for c, sentences in enumerate(chapters(text)):
    if c % EVERY_NTH_CHAPTER or len(sentences) < 3:
      continue
    for k in range(0, len(sentences), SENTENCES_PER_PASSAGE):
      passage = sentences[k : k + SENTENCES_PER_PASSAGE]
      pid = f"c{c:03d}p{k // SENTENCES_PER_PASSAGE:03d}"
      longest = max(range(len(passage)), key=lambda i: len(passage[i].split()))
      digest = int(hashlib.sha256(pid.encode()).hexdigest(), 16)
      if (
          len(passage) > 1
          and digest % QUERY_ONE_IN == 0
          and len(passage[longest].split()) >= MIN_QUERY_WORDS
      ):
        queries.append({"_id": f"q{pid}", "text": passage[longest]})
        qrels.append((f"q{pid}", pid))
        passage = passage[:longest] + passage[longest + 1 :]
      corpus.append({"_id": pid, "title": "", "text": " ".join(passage)})
  return corpus, queries, qrels


def train_pairs(text: str) -> list[dict]:
  """Inverse-cloze pairs from the chapters the corpus leaves out: every passage with a
  sentence of MIN_QUERY_WORDS or more gives one, its hard negative the chapter's next passage
  (the previous one for the last)."""
  pairs = []
  for c, sentences in enumerate(chapters(text)):
    if c % EVERY_NTH_CHAPTER == 0 or len(sentences) < 2 * SENTENCES_PER_PASSAGE:
      continue
    passages = [
        sentences[k : k + SENTENCES_PER_PASSAGE]
        for k in range(0, len(sentences), SENTENCES_PER_PASSAGE)
    ]
    passages = [p for p in passages if len(p) > 1]
    for i, passage in enumerate(passages):
      longest = max(range(len(passage)), key=lambda j: len(passage[j].split()))
      if len(passage[longest].split()) < MIN_QUERY_WORDS:
        continue
      other = passages[i + 1] if i + 1 < len(passages) else passages[i - 1]
      pairs.append(
          {
              "query": passage[longest],
              "positive": " ".join(passage[:longest] + passage[longest + 1 :]),
              "negative": " ".join(other),
          }
      )
  return pairs


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--corpus", default=str(HERE / "austen.txt"))
  p.add_argument("--out", default=str(HERE / "austen_retrieval"))
  args = p.parse_args()
  text = pathlib.Path(args.corpus).read_text(encoding="utf-8")
  corpus, queries, qrels = build(text)
  pairs = train_pairs(text)
  out = pathlib.Path(args.out)
  (out / "qrels").mkdir(parents=True, exist_ok=True)
  for name, records in (
      ("corpus.jsonl", corpus),
      ("queries.jsonl", queries),
      ("train_pairs.jsonl", pairs),
  ):
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    (out / name).write_text(lines, encoding="utf-8")
  judged = "".join(f"{q}\t{d}\t1\n" for q, d in qrels)
  (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)
  print(f"{out}: {len(corpus)} passages, {len(queries)} queries, {len(pairs)} training pairs")


if __name__ == "__main__":
  main()
