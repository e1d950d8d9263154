"""`bertjax bench encode`: documents/s of `bertjax embed`'s encoding path beside
sentence-transformers' own `encode`, on the same model, the same tokenizer and the same texts.

The texts are the bundled retrieval corpus (`data/austen_retrieval/corpus.jsonl`, passages of
mixed length). The model is random (seed 0) in a named shape, written once as a
sentence-transformers directory (mean pooling, `max_seq_length` 256, a WordPiece
tokenizer.json trained on the texts with `tokenizers`), which both sides load: bertjax packs
texts several to a row (`bertjax.tasks.embed`), sentence-transformers sorts them by length and
pads each batch to its longest. Both run float32 on the CPU, in the same process, one after
the other; each is timed after a warm-up call (bertjax's compile, torch's first batch), and
the largest difference between the two sides' embeddings is reported beside the speeds.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

import numpy as np

from bertjax import errors, locations

# name -> (layers, hidden, heads, intermediate)
SHAPES = {
    "bert-mini": (4, 256, 4, 1024),
    "minilm-l6-h384": (6, 384, 12, 1536),
}
MAX_SEQ_LEN = 256  # what all-MiniLM-L6-v2 declares
VOCAB = 8000


def corpus_texts(limit: int | None = None) -> list[str]:
  path = locations.DATA_DIR / "austen_retrieval" / "corpus.jsonl"
  if not path.is_file():
    raise errors.InputNotFoundError(f"{path}: not found — run from a clone of bertjax")
  docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
  texts = [f"{d['title']} {d['text']}".strip() for d in docs]
  return texts[:limit] if limit else texts


def _st_directory(shape: str, texts: list[str], out: pathlib.Path) -> None:
  """A random BertModel of `shape` with a WordPiece tokenizer trained on `texts`, saved as a
  sentence-transformers directory at `out`."""
  import torch
  import transformers
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling
  from tokenizers import BertWordPieceTokenizer

  layers, hidden, heads, inter = SHAPES[shape]
  wp = BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(texts, vocab_size=VOCAB, show_progress=False)
  body = out / "body"
  body.mkdir(parents=True)
  wp.save_model(str(body))
  tok = transformers.BertTokenizerFast(str(body / "vocab.txt"), do_lower_case=True)
  torch.manual_seed(0)
  cfg = transformers.BertConfig(
      vocab_size=tok.vocab_size,
      hidden_size=hidden,
      num_hidden_layers=layers,
      num_attention_heads=heads,
      intermediate_size=inter,
      max_position_embeddings=512,
  )
  transformers.BertModel(cfg).save_pretrained(body)
  tok.save_pretrained(body)
  modules = [Transformer(str(body), max_seq_length=MAX_SEQ_LEN), Pooling(hidden, "mean")]
  SentenceTransformer(modules=modules, device="cpu").save(str(out / "st"))


def _timed(fn) -> tuple[np.ndarray, float]:
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def run_encode(shape: str, compare: tuple[str, ...], limit: int | None, batch_rows: int) -> dict:
  """One shape's figures: documents, tokens cut, bertjax's documents/s and, with
  "sentence-transformers" in `compare`, its documents/s, the ratio and the largest
  difference between the embeddings."""
  from bertjax.tasks import embed as embed_lib
  from bertjax.tasks import encoder as encoder_lib
  from bertjax.training import sharding

  texts = corpus_texts(limit)
  with tempfile.TemporaryDirectory(prefix="bertjax-bench-encode-") as tmp:
    _st_directory(shape, texts, pathlib.Path(tmp))
    st_dir = str(pathlib.Path(tmp) / "st")
    enc = encoder_lib.load_encoder(st_dir)
    spec = embed_lib.spec_for(enc)
    mesh = sharding.make_mesh(data=-1)
    counts = embed_lib.Counts()
    embed = lambda xs, c=None: embed_lib.embed(
        enc, xs, spec, batch_rows=batch_rows, mesh=mesh, counts=c
    )
    embed(texts[:64])  # compiles the one packed shape
    ours, ours_s = _timed(lambda: embed(texts, counts))
    result = {
        "shape": shape,
        "documents": len(texts),
        "max_seq_len": spec.max_seq_len,
        "cut": counts.cut,
        "batch_rows": batch_rows,
        "bertjax_docs_per_s": round(len(texts) / ours_s, 1),
    }
    if "sentence-transformers" in compare:
      from sentence_transformers import SentenceTransformer

      model = SentenceTransformer(st_dir, device="cpu")
      model.encode(texts[:64], batch_size=32)  # warm-up
      theirs, theirs_s = _timed(lambda: model.encode(texts, batch_size=32, convert_to_numpy=True))
      result["sentence-transformers_docs_per_s"] = round(len(texts) / theirs_s, 1)
      result["speedup_sentence-transformers"] = round(theirs_s / ours_s, 2)
      result["max_abs_diff"] = float(np.abs(ours - theirs).max())
  return result


def format_report(rows: list[dict]) -> str:
  lines = []
  for r in rows:
    line = f"{r['shape']}: {r['documents']} documents ({r['cut']} cut at {r['max_seq_len']})"
    line += f", bertjax {r['bertjax_docs_per_s']} docs/s"
    if "speedup_sentence-transformers" in r:
      line += (
          f", sentence-transformers {r['sentence-transformers_docs_per_s']} docs/s, "
          f"speedup {r['speedup_sentence-transformers']}x (max |diff| {r['max_abs_diff']:.1e})"
      )
    lines.append(line)
  return "\n".join(lines)
