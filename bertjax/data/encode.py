"""`prepare`'s work on one chunk of text, run in a pool of processes.

A task (corpus.Task: a chunk of a file cut at document boundaries, or a batch of TFDS records)
becomes documents of sentences (a line is a sentence in google-research/bert's format; a TFDS
record is one document, split into sentences by rule), each sentence is tokenized, and each
document is encoded and framed as a TFRecord here, so the parent only copies bytes. A document
goes to the held-out split by a hash of its tokens: the same split however the work is divided.
`run_tasks` keeps at most `2 * processes` tasks in flight and hands results over in input order.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import multiprocessing
from typing import Callable, Iterable

from bertjax.data import corpus, records, segment, text, tokenizer as tokenizer_lib, wordpiece
from bertjax.data.prepare_config import PrepareConfig


@dataclasses.dataclass
class Result:
  source: str
  first_line: int
  records: list[tuple[bytes, int, int, bool]]  # (framed record, sentences, tokens, eval)
  problems: list[tuple[int, str]]  # (absolute line, reason)
  sentences: int
  tokens: int
  nbytes: int


# Set once per process by `init_worker`: the pool's processes load the tokenizer once.
_TOKENIZER: "tokenizer_lib.Tokenizer | None" = None
_CONFIG: PrepareConfig | None = None
# With a word segmenter (segment.py): text -> (ids, tokens per word).
_ENCODE_WORDS: Callable[[str], tuple[list[int], list[int]]] | None = None


def init_worker(cfg: PrepareConfig) -> None:
  global _TOKENIZER, _CONFIG, _ENCODE_WORDS
  _TOKENIZER, _CONFIG = wordpiece.load_tokenizer(cfg.tokenizer), cfg
  _ENCODE_WORDS = None
  if cfg.word_segmenter:
    _ENCODE_WORDS = segment.encoder(_TOKENIZER, cfg.word_segmenter)


def is_eval(payload: bytes, fraction: float) -> bool:
  """Whether a document goes to the held-out split: a hash of its encoded tokens."""
  if fraction <= 0:
    return False
  digest = hashlib.blake2b(payload, digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2**64 < fraction


def documents(
    task: corpus.Task, cfg: PrepareConfig, problems: list[text.Problem]
) -> list[list[tuple[int, str]]]:
  """Groups a task's text into documents of (line, sentence)."""
  if isinstance(task.data, bytes):  # google-research/bert format: a line is a sentence
    lines, found = text.clean_lines(task.data, cfg.max_line_chars, task.first_chunk, task.continued)
    problems.extend(found)
    docs, current = [], []
    for lineno, line in lines:
      if line:
        current.append((lineno, line))
      elif current:
        docs.append(current)
        current = []
    return docs + ([current] if current else [])
  docs = []
  for i, raw in enumerate(task.data, start=1):  # TFDS: one record is one document
    lines, found = text.clean_lines(raw, cfg.max_line_chars, True)
    problems.extend(text.Problem(i, p.reason) for p in found)
    docs.append([(i, s) for _, para in lines if para for s in text.split_sentences(para)])
  return [d for d in docs if d]


def process(task: corpus.Task) -> Result:
  """One task, in a pool process (after `init_worker`): its encoded documents and problems."""
  cfg, tok = _CONFIG, _TOKENIZER
  problems: list[text.Problem] = []
  docs = documents(task, cfg, problems)
  flat = [s for doc in docs for _, s in doc]
  if _ENCODE_WORDS is None:
    ids = iter(tok.encode_batch(flat))
    words = None
  else:  # each sentence segmented once, here: (ids, tokens per word)
    ids, words = (iter(x) for x in zip(*map(_ENCODE_WORDS, flat))) if flat else (iter(()),) * 2
  out_docs, out_words = [], []
  for doc in docs:
    sentences, sentence_words = [], []
    for lineno, _ in doc:
      sentence_ids = next(ids)
      lengths = next(words) if words is not None else None
      if sentence_ids:
        sentences.append(sentence_ids)
        sentence_words.append(lengths)
      else:
        problems.append(text.Problem(lineno, text.NO_TOKENS))
    for start in range(0, len(sentences), cfg.max_doc_sentences):
      if start:
        problems.append(text.Problem(doc[0][0], text.LONG_DOCUMENT))
      out_docs.append(sentences[start : start + cfg.max_doc_sentences])
      out_words.append(sentence_words[start : start + cfg.max_doc_sentences])
  encoded = []
  for doc, doc_words in zip(out_docs, out_words):
    word_lengths = None if words is None else [n for w in doc_words for n in w]
    if word_lengths is None:
      payload = tokens_only = records.encode_document(doc)
    else:  # held out by the tokens alone: the same documents as without a segmenter
      tokens_only, payload = records.encode_document_with_words(doc, word_lengths)
    encoded.append(
        (
            records.frame_record(payload),
            len(doc),
            sum(len(s) for s in doc),
            is_eval(tokens_only, cfg.eval_fraction),
        )
    )
  return Result(
      source=task.source,
      first_line=task.first_line,
      records=encoded,
      problems=[(task.first_line + p.line, p.reason) for p in problems],
      sentences=sum(len(d) for d in out_docs),
      tokens=sum(len(s) for d in out_docs for s in d),
      nbytes=len(task.data) if isinstance(task.data, bytes) else sum(len(t) for t in task.data),
  )


def run_tasks(
    cfg: PrepareConfig, tasks: Iterable[corpus.Task], handle: Callable[[Result], None]
) -> None:
  """Runs `process` over the tasks, handing each result to `handle` in input order, with a
  bounded number in flight."""
  if cfg.processes <= 1:
    init_worker(cfg)
    for task in tasks:
      handle(process(task))
    return
  # spawn, not fork: the parent may have started TensorFlow's threads already.
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(cfg.processes, initializer=init_worker, initargs=(cfg,)) as pool:
    pending: collections.deque = collections.deque()
    for task in tasks:
      pending.append(pool.apply_async(process, (task,)))
      while len(pending) >= 2 * cfg.processes:
        handle(pending.popleft().get())
    while pending:
      handle(pending.popleft().get())
