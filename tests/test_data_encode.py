"""encode.py: a chunk of text becomes documents of sentences, tokenized and framed; the held-out
split is a hash of the document, so it does not depend on how the work is divided."""

import pathlib

from bertjax.data import corpus, encode, prepare, records, text

REPO = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER = str(REPO / "data" / "tokenizer.model")


def _cfg(**kw) -> prepare.PrepareConfig:
  return prepare.PrepareConfig(output="", tokenizer=TOKENIZER, processes=1, **kw)


def test_documents_are_separated_by_blank_lines_and_keep_their_line_numbers():
  task = corpus.Task("a.txt", 0, b"One.\nTwo.\n\n\nThree.\n")
  problems = []
  docs = encode.documents(task, _cfg(), problems)
  assert docs == [[(1, "One."), (2, "Two.")], [(5, "Three.")]] and problems == []


def test_a_tfds_record_is_one_document_split_into_sentences():
  task = corpus.Task("tfds x:train", 0, [b"Mr. Darcy danced. He did not smile!", b"  "])
  docs = encode.documents(task, _cfg(), [])
  assert docs == [[(1, "Mr. Darcy danced."), (1, "He did not smile!")]]


def test_process_encodes_documents_and_reports_problems_at_absolute_lines():
  encode.init_worker(_cfg(max_doc_sentences=2))
  result = encode.process(corpus.Task("a.txt", 10, b"One.\nTwo.\nThree.\n\nFour\x00.\n"))
  assert result.source == "a.txt" and result.sentences == 4
  assert [r[1] for r in result.records] == [2, 1, 1]  # 3 sentences cut at 2, then one
  assert (11, text.LONG_DOCUMENT) in result.problems and (15, text.NUL_BYTES) in result.problems
  docs = [records.decode_document(r[0][12:-4]) for r in result.records]
  assert sum(len(s) for d in docs for s in d) == result.tokens


def test_the_held_out_split_is_a_stable_hash():
  payloads = [records.encode_document([[i, i + 7]]) for i in range(2000)]
  held = [encode.is_eval(p, 0.1) for p in payloads]
  assert 120 < sum(held) < 280 and held == [encode.is_eval(p, 0.1) for p in payloads]
  assert not any(encode.is_eval(p, 0.0) for p in payloads)


def test_run_tasks_hands_results_over_in_input_order():
  tasks = [corpus.Task("a.txt", i * 3, f"Sentence {i}.\n".encode()) for i in range(5)]
  seen = []
  encode.run_tasks(_cfg(), tasks, lambda r: seen.append(r.first_line))
  assert seen == [0, 3, 6, 9, 12]
