"""formats.py: JSON lines, Parquet and Arrow corpora give the same shards as the same documents
as text; bad records are skipped and counted by file and record; mistakes are refused first."""

import gzip
import hashlib
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertjax import cli, errors
from bertjax.data import corpus, formats, prepare, records, text, tokenizer as tok_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER = str(REPO / "data" / "tokenizer.model")
# One sentence per line, each a single sentence to the segmenter: split or not, the same.
DOCS = [
    [f"Sentence {j} of document {i} tells of {w}." for j, w in enumerate(words.split())]
    for i, words in enumerate(
        ["Emma Harriet", "Elinor Marianne Edward", "Anne", "Elizabeth Jane Lydia Kitty"] * 6
    )
]


def _prepare(tmp_path, inputs, name="out", **kw) -> dict:
  cfg = dict(
      output=str(tmp_path / name),
      tokenizer=TOKENIZER,
      inputs=tuple(str(i) for i in inputs),
      num_shards=2,
      eval_fraction=0.2,
      processes=1,
      progress=False,
      max_reports=50,
  )
  return prepare.prepare(prepare.PrepareConfig(**(cfg | kw)))


def _shards(out: pathlib.Path, meta: dict) -> dict[str, str]:
  return {
      s["file"]: hashlib.sha256((out / s["file"]).read_bytes()).hexdigest() for s in meta["shards"]
  }


def _decoded(out: pathlib.Path) -> list[list[str]]:
  tok = tok_lib.SentencePieceTokenizer(out / "tokenizer.model")
  meta = records.load_metadata(out)
  return [
      [tok.decode(s) for s in doc]
      for split in records.SPLITS
      for shard in records.split_shards(meta, out, split)
      for doc in records.read_documents(shard["path"])
  ]


def _write_jsonl(path: pathlib.Path, rows: list, compress=None) -> pathlib.Path:
  data = "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows).encode()
  path.write_bytes(compress(data) if compress else data)
  return path


def _write_saved_dataset(directory: pathlib.Path, table: pa.Table, files: int) -> pathlib.Path:
  """A `datasets` save_to_disk directory, as datasets writes it: Arrow IPC streams."""
  directory.mkdir()
  names, per = [], -(-table.num_rows // files)
  for i in range(files):
    names.append(f"data-{i:05d}-of-{files:05d}.arrow")
    with pa.ipc.new_stream(str(directory / names[-1]), table.schema) as w:
      w.write_table(table.slice(i * per, per), max_chunksize=4)
  state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "0", "_split": None}
  (directory / "state.json").write_text(json.dumps(state))
  (directory / "dataset_info.json").write_text(json.dumps({"features": {}}))
  return directory


def test_each_format_gives_the_same_shards_as_text(tmp_path):
  (tmp_path / "docs.txt").write_text("\n\n".join("\n".join(d) for d in DOCS) + "\n")
  texts = ["\n".join(d) for d in DOCS]
  rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
  table = pa.table({"id": list(range(len(texts))), "text": texts})
  inputs = {
      "jsonl": _write_jsonl(tmp_path / "docs.jsonl", rows),
      "json.gz": _write_jsonl(tmp_path / "docs.json.gz", rows, gzip.compress),
      "jsonl.zst": _write_jsonl(
          tmp_path / "docs.jsonl.zst", rows, zstandard.ZstdCompressor().compress
      ),
      "saved dataset": _write_saved_dataset(tmp_path / "saved", table, files=3),
  }
  pq.write_table(table, tmp_path / "docs.parquet", row_group_size=5)  # 5 row groups
  inputs["parquet"] = tmp_path / "docs.parquet"
  with pa.ipc.new_file(str(tmp_path / "docs.arrow"), table.schema) as w:  # the IPC file format
    w.write_table(table, max_chunksize=7)
  inputs["arrow file"] = tmp_path / "docs.arrow"
  want = _prepare(tmp_path, [tmp_path / "docs.txt"], "text")
  want_shards = _shards(tmp_path / "text", want)
  assert want["documents"] == len(DOCS) and len(want_shards) == 3  # 2 train + 1 eval
  for name, path in inputs.items():
    # Small chunks: many tasks per file, so record numbers and order must carry across them.
    meta = _prepare(tmp_path, [path], name, chunk_bytes=300)
    assert _shards(tmp_path / name, meta) == want_shards, name
    for key in ("documents", "sentences", "tokens", "skipped", "repaired", "warnings"):
      assert meta[key] == want[key], (name, key)
    assert meta["text_field"] == "text"
  assert sorted(map(tuple, _decoded(tmp_path / "parquet"))) == sorted(map(tuple, DOCS))


def test_bad_records_are_skipped_and_counted_by_file_and_record(tmp_path):
  good = ["\n".join(d) for d in DOCS[:4]]
  lines = [
      json.dumps({"text": good[0]}) + "\n",  # 1
      '{"text": "cut off\n',  # 2: not JSON
      json.dumps({"body": "wrong field"}) + "\n",  # 3
      json.dumps({"text": None}) + "\n",  # 4
      json.dumps({"text": 17}) + "\n",  # 5
      json.dumps({"text": "  \n "}) + "\n",  # 6
      "\n",  # 7: a blank line is no record, and no problem
      json.dumps({"text": good[1]}).replace("Sentence", "Sent\\u0000ence", 1) + "\n",  # 8: NUL
      json.dumps({"text": good[2]}).encode().replace(b"document", b"docu\xffment", 1)
      + b"\n",  # 9: invalid UTF-8
      json.dumps(["a", "list"]) + "\n",  # 10
  ]
  path = tmp_path / "bad.jsonl"
  path.write_bytes(b"".join(l if isinstance(l, bytes) else l.encode() for l in lines))
  table = pa.table({"text": [good[3], None, "", good[0]]})
  pq.write_table(table, tmp_path / "bad.parquet")
  meta = _prepare(tmp_path, [path, tmp_path / "bad.parquet"], chunk_bytes=64)
  assert meta["skipped"] == {
      formats.BAD_JSON: 1,
      formats.NO_FIELD: 2,
      formats.NULL_FIELD: 2,
      formats.NOT_STRING: 1,
      formats.BLANK_RECORD: 2,
  }
  assert meta["repaired"] == {text.NUL_BYTES: 1, text.INVALID_UTF8: 1}
  reports = meta["examples_of_problems"]
  for record, reason in [(2, formats.BAD_JSON), (3, formats.NO_FIELD), (4, formats.NULL_FIELD)]:
    assert f"{path}:record {record}: {reason}" in reports
  for record, reason in [(5, formats.NOT_STRING), (6, formats.BLANK_RECORD)]:
    assert f"{path}:record {record}: {reason}" in reports
  assert f"{path}:record 8: {text.NUL_BYTES}" in reports  # found by the worker, same numbers
  assert f"{path}:record 9: {text.INVALID_UTF8}" in reports
  assert f"{path}:record 10: {formats.NO_FIELD}" in reports
  assert f"{tmp_path / 'bad.parquet'}:record 2: {formats.NULL_FIELD}" in reports
  assert f"{tmp_path / 'bad.parquet'}:record 3: {formats.BLANK_RECORD}" in reports
  assert meta == json.loads((tmp_path / "out" / "metadata.json").read_text())
  # Every good record is a document, whole: 3 of the JSON lines, 2 of the Parquet file.
  assert meta["documents"] == 5
  decoded = _decoded(tmp_path / "out")
  assert DOCS[0] in decoded and DOCS[3] in decoded
  assert DOCS[1] in decoded  # the NUL removed


def test_a_dotted_text_field_reaches_nested_fields(tmp_path):
  texts = ["\n".join(d) for d in DOCS[:6]]
  rows = [{"meta": {"body": t, "n": 1}} for t in texts[:5]] + [{"meta.body": texts[5]}]
  _write_jsonl(tmp_path / "nested.jsonl", rows)
  structs = [{"body": t, "n": 1} for t in texts[:5]] + [None]  # a null struct: a null text
  pq.write_table(pa.table({"meta": structs}), tmp_path / "nested.parquet", row_group_size=2)
  meta = _prepare(
      tmp_path, [tmp_path / "nested.jsonl", tmp_path / "nested.parquet"], text_field="meta.body"
  )
  assert meta["documents"] == 11 and meta["skipped"] == {formats.NULL_FIELD: 1}
  decoded = _decoded(tmp_path / "out")
  assert all(decoded.count(d) == (1 if i == 5 else 2) for i, d in enumerate(DOCS[:6]))


def _corrupt_row_group(path: pathlib.Path, rg: int) -> None:
  column = pq.ParquetFile(path).metadata.row_group(rg).column(0)
  start = column.dictionary_page_offset or column.data_page_offset
  raw = bytearray(path.read_bytes())
  raw[start : start + 40] = b"\xff" * 40  # the page header: unreadable
  path.write_bytes(bytes(raw))


def test_a_corrupt_parquet_row_group_is_skipped_and_counted(tmp_path):
  path = tmp_path / "c.parquet"
  pq.write_table(pa.table({"text": ["\n".join(d) for d in DOCS]}), path, row_group_size=10)
  _corrupt_row_group(path, 1)  # records 11-20
  meta = _prepare(tmp_path, [path])
  assert meta["skipped"] == {formats.BAD_ROW_GROUP: 10}
  assert f"{path}:record 11: {formats.BAD_ROW_GROUP} (10 records)" in meta["examples_of_problems"]
  decoded = _decoded(tmp_path / "out")
  assert sorted(map(tuple, decoded)) == sorted(map(tuple, DOCS[:10] + DOCS[20:]))


def test_unreadable_files_are_one_line_errors_and_write_nothing(tmp_path):
  rows = [{"text": "\n".join(d)} for d in DOCS * 40]
  z = zstandard.ZstdCompressor().compress("".join(json.dumps(r) + "\n" for r in rows).encode())
  (tmp_path / "cut.jsonl.zst").write_bytes(z[: len(z) // 2])
  with pytest.raises(
      errors.BadInputError, match=r"cut\.jsonl\.zst:record \d+: unreadable .*zstd -t"
  ):
    _prepare(tmp_path, [tmp_path / "cut.jsonl.zst"])
  table = pa.table({"text": [r["text"] for r in rows]})
  pq.write_table(table, tmp_path / "cut.parquet")
  (tmp_path / "cut.parquet").write_bytes((tmp_path / "cut.parquet").read_bytes()[:-100])
  with pytest.raises(errors.BadInputError, match=r"cut\.parquet: not a readable Parquet file"):
    _prepare(tmp_path, [tmp_path / "cut.parquet"])
  saved = _write_saved_dataset(tmp_path / "saved", table, files=1)
  arrow = saved / "data-00000-of-00001.arrow"
  arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
  with pytest.raises(errors.BadInputError, match=r"\.arrow:record \d+: unreadable Arrow data"):
    _prepare(tmp_path, [saved])
  assert not (tmp_path / "out").exists()


def test_wrong_format_or_field_is_refused_before_writing(tmp_path):
  _write_jsonl(tmp_path / "a.jsonl", [{"id": 1, "body": "Some text."}])
  pq.write_table(pa.table({"id": [1], "body": ["Some text."], "n": [2]}), tmp_path / "a.parquet")
  (tmp_path / "a.txt").write_text("One sentence.\n\nAnother document.\n")
  cases = [
      (
          "a.jsonl",
          {},
          errors.ConfigError,
          r"text_field=text: no record at the start of .*a\.jsonl"
          r" has it \(the first has body, id\)",
      ),
      (
          "a.parquet",
          {},
          errors.ConfigError,
          r"text_field=text: .*a\.parquet has no such column " r"\(it has id, body, n\)",
      ),
      ("a.parquet", {"text_field": "body.x"}, errors.ConfigError, r"body \(string\) has no field"),
      ("a.parquet", {"text_field": "n"}, errors.ConfigError, r"it holds int64, not text"),
      ("a.jsonl", {"input_format": "parquet"}, errors.BadInputError, r"not a readable Parquet"),
      ("a.txt", {"input_format": "jsonl"}, errors.BadInputError, r"a\.txt: not JSON lines"),
      ("a.txt", {"input_format": "arrow"}, errors.BadInputError, r"not an Arrow stream or file"),
      ("a.txt", {"input_format": "csv"}, errors.ConfigError, r"input_format='csv': valid options"),
  ]
  for name, kw, error, pattern in cases:
    with pytest.raises(error, match=pattern):
      _prepare(tmp_path, [tmp_path / name], **kw)
  assert not (tmp_path / "out").exists()
  (tmp_path / "dd").mkdir()
  (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train"]}')
  _write_saved_dataset(tmp_path / "dd" / "train", pa.table({"text": ["x"]}), files=1)
  with pytest.raises(errors.InputNotFoundError, match=r"dd: a DatasetDict .* e\.g\. .*dd/train$"):
    corpus.expand_inputs([str(tmp_path / "dd")])


def test_command_line_format_and_field_mistakes(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  pq.write_table(pa.table({"body": ["Some text. More text."]}), tmp_path / "a.parquet")
  base = ["prepare", "--input", "*.parquet", "--tokenizer", TOKENIZER, "--output", "o"]
  assert cli.main([*base, "--format", "parqet"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "invalid choice: 'parqet'" in err
  assert cli.main([*base, "--text-field", "txt"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1
  assert err.startswith("bertjax prepare: --text-field txt: a.parquet has no such column")
  assert not (tmp_path / "o").exists()
  assert cli.main([*base, "--text-field", "body", "--no-progress", "--processes", "1"]) == 0
  assert records.load_metadata(tmp_path / "o")["documents"] == 1


def test_workers_share_records_each_exactly_once(tmp_path):
  texts = ["\n".join(d) for d in DOCS]
  _write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
  pq.write_table(pa.table({"text": texts}), tmp_path / "b.parquet", row_group_size=3)

  def firsts(worker, workers):
    cfg = prepare.PrepareConfig(
        output="",
        tokenizer="",
        inputs=(str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")),
        chunk_bytes=200,
        worker_index=worker,
        num_workers=workers,
    )
    return [(t.source, t.first_line, len(t.data)) for t in corpus.Tasks(cfg)]

  shares = [firsts(w, 3) for w in range(3)]
  assert all(shares)
  assert sorted(sum(shares, [])) == sorted(firsts(0, 1))
  assert sum(n for _, _, n in firsts(0, 1)) == 2 * len(DOCS)


def test_json_lines_are_read_lazily():
  def endless():
    i = 0
    while True:
      i += 1
      yield json.dumps({"text": f"Record {i}."}).encode() + b"\n"

  problems = []
  chunks = formats.json_chunks(endless(), "text", 1000, lambda: True, problems.append)
  first, texts = next(chunks)  # returns although the input never ends
  assert first == 0 and texts[0] == b"Record 1." and 1000 <= sum(len(t) + 16 for t in texts)
  assert next(chunks)[0] == len(texts)


def test_zstandard_text_and_frames(tmp_path):
  body = b"One sentence.\nAnother one.\n\nA second document.\n"
  c = zstandard.ZstdCompressor()
  (tmp_path / "a.txt").write_bytes(c.compress(body[:20]) + c.compress(body[20:]))  # two frames
  assert corpus.compression(str(tmp_path / "a.txt")) == "zstd"
  with corpus.open_input(str(tmp_path / "a.txt")) as f:
    assert f.read() == body
  (tmp_path / "cut.txt").write_bytes(c.compress(body * 1000)[:50])
  with pytest.raises(errors.BadInputError, match=r"cut\.txt: unreadable input .*zstd -t"):
    list(corpus.file_chunks(str(tmp_path / "cut.txt"), 1 << 20, 1 << 20))


def test_sentences_of_records_are_split_by_the_segmenter():
  assert text.split_sentences("Mr. Darcy met the U.S. Army at 3.5 miles. He did not smile!") == [
      "Mr. Darcy met the U.S. Army at 3.5 miles.",
      "He did not smile!",
  ]
  assert text.split_sentences("他问：“你去哪里？”她没有回答。今天天气很好！") == [
      "他问：“你去哪里？”",
      "她没有回答。",
      "今天天气很好！",
  ]
  assert text.split_sentences("we loved it. the staff were great.") == [
      "we loved it.",
      "the staff were great.",
  ]


_UPLOAD = r"""
import sys
from etils import epath
for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
  epath.Path(dst).write_bytes(open(src, "rb").read())
"""


@pytest.mark.slow
def test_records_on_gs_give_the_same_shards_as_local(gcs, tmp_path):
  import subprocess
  import sys

  local = tmp_path / "local"
  local.mkdir()
  texts = ["\n".join(d) for d in DOCS]
  _write_jsonl(local / "a.jsonl.zst", [{"text": t} for t in texts[:8]], zstandard.compress)
  pq.write_table(pa.table({"text": texts[8:16]}), local / "b.parquet", row_group_size=3)
  saved = _write_saved_dataset(local / "saved", pa.table({"text": texts[16:]}), files=2)
  names = ["a.jsonl.zst", "b.parquet", *(f"saved/{p.name}" for p in sorted(saved.iterdir()))]
  pairs = [(str(local / n), f"{gcs.url}/in/{n}") for n in names]
  env = gcs.environ()
  subprocess.run([sys.executable, "-c", _UPLOAD, *sum(pairs, ())], env=env, check=True)
  inputs = ("in/*.jsonl.zst", "in/b.parquet", "in/saved")
  argv = [sys.executable, "-m", "bertjax.cli", "prepare", "--input"]
  argv += [f"{gcs.url}/{i}" for i in inputs]
  argv += ["--tokenizer", TOKENIZER, "--output", str(tmp_path / "from-gs"), "--processes", "1"]
  argv += ["--num-shards", "2", "--eval-fraction", "0.2", "--no-progress"]
  r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  meta = records.load_metadata(tmp_path / "from-gs")
  want = _prepare(tmp_path, [local / "a.jsonl.zst", local / "b.parquet", saved], "local")
  assert meta["documents"] == want["documents"] == len(DOCS)
  assert _shards(tmp_path / "from-gs", meta) == _shards(tmp_path / "local", want)
