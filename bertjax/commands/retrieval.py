"""`bertjax retrieval`: score a model on a BEIR-format retrieval task.

  bertjax retrieval --init all-MiniLM-L6-v2 --data scifact --split test --workdir out/scifact
  bertjax retrieval --init runs/base --data scifact --workdir out/base --bm25

Every query of the split's qrels is embedded, every document of corpus.jsonl too ("title
text"), and the corpus is searched exactly by the model's similarity (cosine unless the
directory declares dot), in blocks. Writes to --workdir:
  results.json   ndcg_at_10, mrr_at_10, recall_at_100, map_at_100 (trec_eval's measures, MTEB's
                 names), the counts, the skipped lines; with --bm25 a "bm25" entry alike
  results.md     the same as a table
  run.json       {query id: {document id: score}}, the top 100 per query (run_bm25.json)
  corpus_embeddings.npy (+ .json: what made them): reused by a rerun with the same model,
                 flags and corpus.jsonl
Queries take the directory's prompt named "query", documents "document" or "passage", if it
has them (else its default prompt); --query-prompt / --document-prompt set them. A line of
the task's files that cannot be read is skipped and counted; a qrels line naming an unknown
id stops the command. See docs/retrieval.md.
"""

from __future__ import annotations

import hashlib
import json
import sys

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.commands import embed as embed_cmd

TOP_K = 100  # documents kept per query: Recall@100 and MAP@100 need them


def _parser():
  p = args_lib.ArgumentParser(prog="bertjax retrieval", description=__doc__)
  embed_cmd.add_model_args(p)
  p.add_argument("--data", required=True, help="BEIR dataset directory (corpus.jsonl, ...)")
  p.add_argument("--split", default="test", help="qrels/SPLIT.tsv to score (default: test)")
  p.add_argument("--workdir", required=True, help="where results and embeddings go")
  p.add_argument(
      "--query-prompt",
      default=None,
      help="prompt NAME or TEXT for the queries (default: the directory's prompt named query, if any)",
  )
  p.add_argument(
      "--document-prompt",
      default=None,
      help="prompt NAME or TEXT for documents (default: its prompt named document or passage, if any)",
  )
  p.add_argument(
      "--bm25",
      action="store_true",
      help="add a BM25 row (bm25s, the `retrieval` extra) on the same queries",
  )
  return p


def _prompt(head, given: str | None, names: tuple[str, ...]) -> str | None:
  if given is not None:
    return given
  return next((n for n in names if head is not None and n in head.prompts), None)


def _fingerprint(enc, spec, corpus_file) -> str:
  """What the corpus embeddings depend on: the weights, the embedding spec and the corpus."""
  import jax
  import numpy as np

  h = hashlib.sha256(repr((spec.max_seq_len, spec.pooling, spec.include_prompt)).encode())
  h.update(repr((spec.normalize, spec.lower_case, spec.prompt)).encode())
  for d in spec.dense:
    h.update(np.ascontiguousarray(d.kernel).tobytes())
  for x in jax.tree.leaves(enc.bert_params):
    h.update(np.ascontiguousarray(np.asarray(x, np.float32)).tobytes())
  h.update(enc.tokenizer.__class__.__name__.encode())
  with corpus_file.open("rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _corpus_embeddings(task, enc, spec, mesh, args, out):
  """The corpus embeddings as a read-only memmap, from the cache in --workdir when it holds
  this model's, else computed (with a progress bar) and cached."""
  import numpy as np
  from tqdm import tqdm

  from bertjax.runtime import fs
  from bertjax.tasks import embed as embed_lib

  npy, meta = out / "corpus_embeddings.npy", out / "corpus_embeddings.json"
  key = _fingerprint(enc, spec, fs.path(task.root) / "corpus.jsonl")
  if npy.is_file() and meta.is_file():
    try:
      cached = json.loads(meta.read_text())
    except ValueError:
      cached = {}
    if cached.get("fingerprint") == key and cached.get("documents") == len(task.corpus_ids):
      print(f"retrieval: reusing {npy} (same model, flags and corpus)", file=sys.stderr)
      return np.load(npy, mmap_mode="r")
  dim = spec.dense[-1].kernel.shape[1] if spec.dense else enc.config.hidden_size
  partial = out / ".corpus_embeddings.npy.partial"
  array = np.lib.format.open_memmap(
      partial, mode="w+", dtype=np.float32, shape=(len(task.corpus_ids), dim)
  )
  counts, at = embed_lib.Counts(), 0
  with tqdm(total=len(task.corpus_ids), desc="corpus", unit="doc", file=sys.stderr) as bar:
    for y in embed_lib.embed_groups(
        enc,
        task.corpus_texts(),
        spec,
        batch_rows=args.batch_size,
        mesh=mesh,
        counts=counts,
        progress=bar.update,
    ):
      array[at : at + len(y)] = y
      at += len(y)
  array.flush()
  del array
  partial.replace(npy)
  meta.write_text(
      json.dumps({"fingerprint": key, "documents": at, "cut": counts.cut}, indent=2) + "\n"
  )
  print(
      f"retrieval: {counts.cut} of {at} documents cut at {spec.max_seq_len} tokens",
      file=sys.stderr,
  )
  return np.load(npy, mmap_mode="r")


def _dense_run(task, args, out) -> tuple[dict, str]:
  """({query id: {document id: score}} top TOP_K by the model, the model's description)."""
  import jax
  import numpy as np

  from bertjax.commands import finetune_args
  from bertjax.tasks import embed as embed_lib
  from bertjax.tasks.retrieval import search
  from bertjax.training import sharding

  enc = embed_lib.with_weights(finetune_args.load_encoder(args))
  head = enc.sentence
  flags = dict(pooling=args.pooling, normalize=args.normalize, max_seq_len=args.max_seq_len)
  q_spec = embed_lib.spec_for(enc, prompt=_prompt(head, args.query_prompt, ("query",)), **flags)
  d_prompt = _prompt(head, args.document_prompt, ("document", "passage"))
  d_spec = embed_lib.spec_for(enc, prompt=d_prompt, **flags)
  similarity = head.similarity if head else "cosine"
  mesh = sharding.make_mesh(data=-1) if jax.process_count() == 1 else None
  print(
      f"retrieval: {len(task.queries)} queries, {len(task.corpus_ids)} documents; "
      f"{embed_cmd.describe(enc, d_spec)}, {similarity} similarity",
      file=sys.stderr,
      flush=True,
  )
  docs = _corpus_embeddings(task, enc, d_spec, mesh, args, out)
  qids = list(task.queries)
  q = embed_lib.embed(
      enc, list(task.queries.values()), q_spec, batch_rows=args.batch_size, mesh=mesh
  )
  if similarity == "cosine":
    q = search.unit(q)
  blocks = (
      search.unit(np.asarray(docs[i : i + search.DOC_BLOCK]))
      if similarity == "cosine"
      else np.asarray(docs[i : i + search.DOC_BLOCK])
      for i in range(0, len(docs), search.DOC_BLOCK)
  )
  scores, idx = search.top_k(q, blocks, min(TOP_K, len(docs)), mesh)
  run = {
      qid: {task.corpus_ids[j]: float(s) for s, j in zip(scores[r], idx[r]) if j >= 0}
      for r, qid in enumerate(qids)
  }
  return run, f"{embed_cmd.describe(enc, d_spec)}, {similarity} similarity"


def _bm25_run(task) -> dict:
  """BM25 (bm25s defaults: k1 1.5, b 0.75, English stopwords, no stemming) top TOP_K."""
  try:
    import bm25s
  except ImportError:
    raise errors.ConfigError(
        "--bm25 needs the bm25s package — pip install 'bertjax[retrieval]'"
    ) from None
  corpus = bm25s.tokenize(list(task.corpus_texts()), stopwords="en", show_progress=False)
  retriever = bm25s.BM25()
  retriever.index(corpus, show_progress=False)
  qids = list(task.queries)
  tokens = bm25s.tokenize(list(task.queries.values()), stopwords="en", show_progress=False)
  k = min(TOP_K, len(task.corpus_ids))
  docs, scores = retriever.retrieve(tokens, k=k, show_progress=False)
  return {
      qid: {task.corpus_ids[int(j)]: float(s) for j, s in zip(docs[r], scores[r])}
      for r, qid in enumerate(qids)
  }


def _write_json(path, value) -> None:
  tmp = path.with_name(f".{path.name}.partial")
  tmp.write_text(json.dumps(value, indent=1) + "\n")
  tmp.replace(path)


def _markdown(results: dict) -> str:
  from bertjax.tasks.retrieval import metrics

  rows = [("model", results)] + ([("BM25", results["bm25"])] if "bm25" in results else [])
  lines = [
      f"# {results['task']} ({results['split']}): {results['queries']} queries, "
      f"{results['documents']} documents",
      "",
      f"model: {results['model']}",
      "",
      "| | " + " | ".join(metrics.KEYS) + " |",
      "|---|" + "---:|" * len(metrics.KEYS),
  ]
  lines += [f"| {n} | " + " | ".join(f"{r[k]:.4f}" for k in metrics.KEYS) + " |" for n, r in rows]
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  from etils import epath

  from bertjax.runtime import fs
  from bertjax.tasks.retrieval import beir, metrics

  task = beir.load(args.data, args.split)
  for line in task.skipped.first:
    print(f"retrieval: {args.data}/{line}: skipped", file=sys.stderr)
  if task.skipped.counts:
    counts = ", ".join(f"{n} in {f}" for f, n in task.skipped.counts.items())
    print(f"retrieval: skipped {counts}", file=sys.stderr)
  out = fs.path(args.workdir)
  if not fs.is_local(out):
    raise errors.ConfigError(f"--workdir {args.workdir}: use a local directory")
  out.mkdir(parents=True, exist_ok=True)
  run, model = _dense_run(task, args, out)
  results = {
      "task": epath.Path(args.data).name,
      "split": args.split,
      "model": model,
      "queries": len(task.queries),
      "documents": len(task.corpus_ids),
      **metrics.evaluate(run, task.qrels),
      "skipped_lines": dict(task.skipped.counts),
  }
  _write_json(out / "run.json", run)
  if args.bm25:
    bm25 = _bm25_run(task)
    results["bm25"] = metrics.evaluate(bm25, task.qrels)
    _write_json(out / "run_bm25.json", bm25)
  _write_json(out / "results.json", results)
  (out / "results.md").write_text(_markdown(results))
  if args.bm25:
    row = ", ".join(f"{k} {results['bm25'][k]:.4f}" for k in metrics.KEYS)
    print(f"retrieval: BM25 {row}", file=sys.stderr)
  print(
      "retrieval: "
      + ", ".join(f"{k} {results[k]:.4f}" for k in metrics.KEYS)
      + f" — wrote {epath.Path(args.workdir) / 'results.json'}",
      file=sys.stderr,
  )
  return 0
