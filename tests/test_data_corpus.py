"""corpus.py: inputs expanded with one-line errors, compression by content, chunks that cut only
at document boundaries, and a corpus without a single document refused before any work."""

import bz2
import gzip
import lzma
import os

import pytest

from bertjax import errors
from bertjax.data import corpus, prepare, text


def test_expand_inputs_sorts_globs_and_names_what_is_wrong(tmp_path):
  for name in ("b.txt", "a.txt", "c.md"):
    (tmp_path / name).write_text("x\n")
  (tmp_path / "sub").mkdir()
  assert corpus.expand_inputs([str(tmp_path / "*.txt"), str(tmp_path / "c.md")]) == [
      str(tmp_path / "a.txt"),
      str(tmp_path / "b.txt"),
      str(tmp_path / "c.md"),
  ]
  with pytest.raises(errors.InputNotFoundError, match=r"none\.txt: no such file$"):
    corpus.expand_inputs([str(tmp_path / "none.txt")])
  with pytest.raises(errors.InputNotFoundError, match=r"\*\.json: no file matches this pattern"):
    corpus.expand_inputs([str(tmp_path / "*.json")])
  with pytest.raises(errors.InputNotFoundError, match=r"sub: is a directory — name its files"):
    corpus.expand_inputs([str(tmp_path / "sub")])


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_input_is_named(tmp_path):
  path = tmp_path / "secret.txt"
  path.write_text("x\n")
  path.chmod(0)
  with pytest.raises(errors.InputNotFoundError, match="secret.txt: not readable"):
    corpus.expand_inputs([str(path)])


def test_compression_is_recognised_by_content_not_name(tmp_path):
  body = b"One sentence.\nAnother one.\n\nA second document.\n"
  for kind, pack in (("gzip", gzip.compress), ("bzip2", bz2.compress), ("xz", lzma.compress)):
    path = tmp_path / f"{kind}.txt"  # a misleading name on purpose
    path.write_bytes(pack(body))
    assert corpus.compression(str(path)) == kind
    with corpus.open_input(str(path)) as f:
      assert f.read() == body
  (tmp_path / "plain.gz").write_bytes(body)
  assert corpus.compression(str(tmp_path / "plain.gz")) is None


def test_a_truncated_compressed_file_is_a_one_line_error(tmp_path):
  path = tmp_path / "a.txt"
  path.write_bytes(gzip.compress(b"Some text here.\n" * 10_000)[:200])
  with pytest.raises(errors.BadInputError, match=r"a\.txt: unreadable input .*gzip -t"):
    list(corpus.file_chunks(str(path), 1 << 20, 1 << 20))


def test_binary_detection(tmp_path):
  (tmp_path / "bin").write_bytes(bytes(range(256)) * 16)
  (tmp_path / "text").write_text("Plain text with a few odd bytes \x01 here.\n" * 50)
  assert corpus.is_binary(str(tmp_path / "bin"))
  assert not corpus.is_binary(str(tmp_path / "text"))


def test_chunks_cut_after_blank_lines_and_add_up_to_the_file(tmp_path):
  docs = [f"Document {i} line one.\nDocument {i} line two.\n" for i in range(200)]
  body = "\n".join(docs).encode()
  (tmp_path / "a.txt").write_bytes(body)
  for chunk_bytes in (64, 1000, 1 << 20):
    chunks = list(corpus.file_chunks(str(tmp_path / "a.txt"), chunk_bytes, 1 << 20))
    assert b"".join(data for _, data, _ in chunks) == body
    for first_line, data, inside in chunks[1:]:
      # A cut is right before a blank line: no document is split between two chunks.
      assert not inside and data.startswith(b"\n") and body.split(b"\n")[first_line] == b""
    assert len(chunks) > 1 or chunk_bytes == 1 << 20


def test_spans_of_a_file_give_its_documents_once_each(tmp_path):
  """The spans `prepare --runner beam` reads a file in meet at document boundaries: together
  they hold the file's bytes once, cut where the whole file's chunks are cut (blank lines, CRLF
  ones too), and a last document without a blank line after it stays whole."""
  docs = [f"Document {i} line one.\nDocument {i} line two.\n" for i in range(60)]
  bodies = {
      "lf": "\n".join(docs).encode(),
      "crlf": "\n".join(docs).replace("\n", "\r\n").encode(),
      "single": "".join(docs[:20]).encode(),  # one document, under max_doc
      "long": ("\n".join(docs[:5]) + "\n" + "".join(docs) * 4).encode(),  # over max_doc
  }
  for name, body in bodies.items():
    path = tmp_path / f"{name}.txt"
    path.write_bytes(body)
    whole = [data for _, data, _ in corpus.file_chunks(str(path), 1 << 20, 2000)]
    for split in (7, 97, 500, 4096):
      spans = [(s, min(len(body), s + split)) for s in range(0, len(body), split)]
      pieces = [
          [data for _, data, _ in corpus.file_chunks(str(path), 64, 2000, span=span)]
          for span in spans
      ]
      assert b"".join(b"".join(p) for p in pieces) == body, (name, split)
      docs_of = lambda chunks: sorted(
          d.strip() for c in chunks for d in c.replace(b"\r", b"").split(b"\n\n") if d.strip()
      )
      if name != "long":  # a document over max_doc is cut, at other places in a span
        assert docs_of(b"".join(p) for p in pieces) == docs_of(whole), (name, split)


def _cfg(tmp_path, *names) -> prepare.PrepareConfig:
  return prepare.PrepareConfig(
      output=str(tmp_path / "out"), tokenizer="", inputs=tuple(str(tmp_path / n) for n in names)
  )


def test_tasks_skip_empty_and_binary_files_but_refuse_a_corpus_of_only_those(tmp_path):
  (tmp_path / "empty.txt").write_bytes(b"")
  (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 16)
  (tmp_path / "good.txt").write_text("One sentence.\n\nAnother document.\n")
  with pytest.raises(errors.BadInputError) as e:
    corpus.Tasks(_cfg(tmp_path, "empty.txt", "data.bin"))
  message = str(e.value)
  assert message.startswith("no document in the input (")
  assert f"empty.txt: {text.EMPTY_FILE}" in message and f"data.bin: {text.BINARY_FILE}" in message
  tasks = corpus.Tasks(_cfg(tmp_path, "empty.txt", "data.bin", "good.txt"))
  assert tasks.empty_files == [str(tmp_path / "empty.txt")]
  assert tasks.binary_files == [str(tmp_path / "data.bin")]
  assert {t.source for t in tasks} == {str(tmp_path / "good.txt")}


def test_workers_share_the_chunks_of_one_file_round_robin(tmp_path):
  body = "".join(f"Document {i}.\n\n" for i in range(100))
  (tmp_path / "a.txt").write_text(body)

  def firsts(worker, workers):
    cfg = prepare.PrepareConfig(
        output="",
        tokenizer="",
        inputs=(str(tmp_path / "a.txt"),),
        chunk_bytes=100,
        worker_index=worker,
        num_workers=workers,
    )
    return [t.first_line for t in corpus.Tasks(cfg)]

  shares = [firsts(w, 3) for w in range(3)]
  assert all(shares)  # each worker gets some
  assert sorted(sum(shares, [])) == firsts(0, 1)  # and together, each chunk exactly once


def test_no_documents_names_three_sources_and_counts_the_rest():
  e = corpus.no_documents([(f"f{i}.txt", "empty file") for i in range(5)])
  assert isinstance(e, errors.BadInputError)
  assert "(f0.txt: empty file; f1.txt: empty file; f2.txt: empty file; and 2 more)" in str(e)
