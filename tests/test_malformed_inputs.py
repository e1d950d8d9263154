"""Malformed inputs, generated (hypothesis): SQuAD JSON, JSON lines, GLUE TSV, CoNLL files and
metadata.json.

Each file goes through the function its command calls. It either ends in a `UserError` whose
message is one printable line naming the file (the command prints it and exits 2), or it reads
with every record accounted for: read, or skipped and named "file:line" / "question ID" in a
one-line reason. Never another exception (a traceback, exit 1), never a record lost silently.
Two end-to-end runs check what the command line prints.
"""

import copy
import json
import os
import pathlib
import re
import subprocess
import sys

import pydantic
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bertjax import errors, schema
from bertjax.commands import squad as squad_cmd
from bertjax.tasks import files
from bertjax.tasks.glue import tasks, tsv
from bertjax.tasks.ner import conll

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _one_line(e: errors.UserError, name: str) -> str:
  message = str(e)
  event("a one-line error")
  assert message.isprintable(), message  # no newline, no raw control or surrogate character
  assert name in message, message
  return message


def _reason(reason: str) -> None:
  event("a skipped record")
  assert reason.isprintable(), reason
  reason.encode("utf-8")  # the skipped_*.txt files are UTF-8


# What files hold where text is expected: the odd characters readers must not choke on.
ODD = st.sampled_from(["", " ", "\n", "\r", "\t", "\x00", "\ud800", "\ufeff", "é", "\u2028", "-"])
TEXT = st.one_of(st.text(max_size=6), ODD, st.tuples(st.text(max_size=3), ODD).map("".join))
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
# Bytes a text file may be broken with: invalid UTF-8, NUL, a byte-order mark, line ends.
BAD_BYTES = st.sampled_from([b"\xff", b"\xe9", b"\xc3", b"\x00", b"\xef\xbb\xbf", b"\r", b"\t"])


def _raw_lines(data: bytes) -> list[bytes]:
  """The lines of `data` as the readers split them (universal newlines)."""
  return re.split(rb"\r\n|\r|\n", data)


def _lines_of(data: bytes) -> list[str]:
  """The lines of `data`, decoded as text mode with errors="replace" decodes them."""
  return [line.decode("utf-8", "replace") for line in _raw_lines(data)]


def _not_text(line_bytes: bytes) -> bool:
  try:
    return "\x00" in line_bytes.decode("utf-8")
  except UnicodeDecodeError:
    return True


@st.composite
def _broken(draw, data: bytes, keep: int = 0) -> bytes:
  """`data` with a few bad bytes put in, or cut short; mostly after its first `keep` bytes."""
  for _ in range(draw(st.integers(0, 3))):
    at = draw(st.integers(min(draw(st.sampled_from([keep, keep, 0])), len(data)), len(data)))
    data = data[:at] + draw(BAD_BYTES) + data[at:]
  if draw(st.booleans()) and draw(st.integers(0, 9)) == 0:
    data = data[: draw(st.integers(0, len(data)))]
  return data


# -------------------------------------------------------------------------------------- SQuAD

QUESTION = st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=4), "question": st.just("Where did it sit?")},
    optional={
        "answers": st.just([{"text": "the mat", "answer_start": 15}]),
        "is_impossible": st.booleans(),
    },
)
PARAGRAPH = st.fixed_dictionaries(
    {"context": st.just("The cat sat on the mat."), "qas": st.lists(QUESTION, max_size=3)}
)
SQUAD = st.fixed_dictionaries(
    {"data": st.lists(st.fixed_dictionaries({"paragraphs": st.lists(PARAGRAPH, max_size=2)}))}
)


def _nodes(value):
  """Every (container, key) in a JSON value, outermost first."""
  items = value.items() if isinstance(value, dict) else enumerate(value)
  for key, child in list(items):
    yield value, key
    if isinstance(child, (dict, list)):
      yield from _nodes(child)


@st.composite
def squad_files(draw) -> bytes:
  blob = copy.deepcopy(draw(SQUAD))  # st.just's values are shared between examples
  nodes = list(_nodes(blob))
  for _ in range(draw(st.integers(0, 3)) if nodes else 0):
    container, key = draw(st.sampled_from(nodes))
    if isinstance(container, dict) and draw(st.booleans()):
      container.pop(key, None)
    elif key in (container if isinstance(container, dict) else range(len(container))):
      container[key] = draw(JSON)
  text = json.dumps(blob, ensure_ascii=draw(st.booleans()), allow_nan=False)
  data = text.encode("utf-8", "surrogatepass")  # a raw surrogate is not UTF-8: a file can hold one
  return draw(_broken(data)) if draw(st.integers(0, 4)) == 0 else data


def _questions(data: bytes) -> int:
  blob = json.loads(data.decode("utf-8-sig"))
  return sum(len(p["qas"]) for a in blob["data"] for p in a["paragraphs"])


@EXAMPLES
@given(data=squad_files(), version=st.sampled_from(["1.1", "2.0"]), training=st.booleans())
def test_squad_files_end_in_one_line_or_count_every_question(tmp_path, data, version, training):
  path = tmp_path / "train.json"
  path.write_bytes(data)
  try:
    examples, skipped = squad_cmd._read(str(path), version, training)
  except errors.UserError as e:
    _one_line(e, "train.json")
    return
  assert len(examples) + len(skipped) == _questions(data)
  for reason in skipped:
    _reason(reason)
    assert reason.startswith("train.json: question ")
  for ex in examples:
    (ex.qid + ex.question + ex.context + "".join(ex.answers)).encode("utf-8")
    assert (
        not training or ex.is_impossible or ex.context[ex.answer_start :].startswith(ex.answer_text)
    )


# ------------------------------------------------------------------------------ metadata.json

METADATA = {
    "shards": [
        {"file": "train-00000-of-00001.tfrecord", "split": "train", "documents": 3, "bytes": 10},
        {"file": "eval-00000-of-00001.tfrecord", "split": "eval", "documents": 0},
    ],
    "tokenizer": {"file": "tokenizer.model", "type": "sentencepiece", "vocab_size": 8000},
    "inputs": ["corpus.txt"],
    "num_workers": 1,
    "worker_index": 0,
}


@EXAMPLES
@given(meta=st.builds(copy.deepcopy, st.just(METADATA)), st_data=st.data())
def test_metadata_ends_in_one_line_or_holds_what_training_reads(tmp_path, meta, st_data):
  nodes = list(_nodes(meta))
  for _ in range(st_data.draw(st.sampled_from([0, 1, 1, 2, 3]))):
    container, key = st_data.draw(st.sampled_from(nodes))
    container[key] = st_data.draw(JSON)
  path = tmp_path / "metadata.json"
  path.write_text(json.dumps(meta))
  try:
    meta = schema.read_metadata(path)
  except errors.UserError as e:
    _one_line(e, "metadata.json")
    return
  event("read")
  # What config_checks, records and the stream index into it.
  assert meta["tokenizer"]["vocab_size"] >= 1 and isinstance(meta["tokenizer"]["file"], str)
  for shard in meta["shards"]:
    assert shard["split"] in ("train", "eval") and shard["documents"] >= 0
    assert isinstance(shard["file"], str)


# --------------------------------------------------------------------------------- JSON lines


class Review(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(strict=True)
  text: schema.Text
  label: str


GOOD_RECORD = st.builds(lambda t, l: json.dumps({"text": t, "label": l}), TEXT, TEXT)
RECORD = st.one_of(GOOD_RECORD, GOOD_RECORD, st.builds(json.dumps, JSON), TEXT)


@EXAMPLES
@given(
    lines=st.lists(RECORD, min_size=1, max_size=6),
    end=st.sampled_from(["\n", "\r\n"]),
    st_data=st.data(),
)
def test_json_lines_end_in_one_line_or_count_every_record(tmp_path, lines, end, st_data):
  data = end.join(lines).encode("utf-8", "surrogatepass")
  data = st_data.draw(_broken(data))
  path = tmp_path / "train.jsonl"
  path.write_bytes(data)
  try:
    records, skipped = files.read_jsonl(str(path), Review)
  except errors.UserError as e:
    _one_line(e, "train.jsonl")
    return
  content = [
      n for n, line in enumerate(_lines_of(data.removeprefix(b"\xef\xbb\xbf")), 1) if line.strip()
  ]
  assert len(records) + len(skipped) == len(content)
  for reason in skipped:
    _reason(reason)
    assert int(reason.split(":")[1]) in content, reason
  for r in records:
    (r.text + r.label).encode("utf-8")


# ------------------------------------------------------------------------------------ GLUE TSV

FIELD = st.one_of(st.sampled_from(["good film", "bad", "0", "1", ""]), TEXT)
ROW = st.lists(FIELD, min_size=1, max_size=3).map("\t".join)
LABELLED = st.tuples(TEXT, st.sampled_from(["\t0", "\t1"])).map("".join)


def _tsv(draw, header: str) -> bytes:
  """A header and rows, most of them well formed (so that a run would start), then broken."""
  good = LABELLED if "\t" in header else TEXT
  rows = draw(st.lists(st.one_of(good, good, ROW), max_size=8))
  end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
  text = end.join([header, *rows]) + draw(st.sampled_from(["", end]))
  return draw(_broken(text.encode("utf-8", "surrogatepass"), keep=len(header) + 1))


def _rows_in(data: bytes) -> list[int]:
  """Line numbers of the rows after the header that are not blank."""
  lines = _lines_of(data.removeprefix(b"\xef\xbb\xbf"))
  return [n for n, line in enumerate(lines[1:], 2) if line.strip()]


@EXAMPLES
@given(st_data=st.data())
def test_glue_train_files_end_in_one_line_or_count_every_row(tmp_path, st_data):
  train = tmp_path / "train.tsv"
  data = _tsv(st_data.draw, "sentence\tlabel")
  train.write_bytes(data)
  try:  # as `bertjax glue --task custom` reads its --train file
    labels = tsv.custom_labels(str(train), ("sentence",), "label")
    task = tasks.custom("custom", str(train), str(train), None, ("sentence",), "label", labels)
    ex = tsv.load_split(task, task.train, "", labelled=True)
  except errors.UserError as e:
    _one_line(e, "train.tsv")
    return
  assert len(ex) + len(ex.skipped) == len(_rows_in(data))
  for reason in ex.skipped:
    _reason(reason)
    assert int(reason.split(":")[1]) in _rows_in(data), reason
  for text in ex.text_a:
    text.encode("utf-8")
    assert "\x00" not in text


@EXAMPLES
@given(st_data=st.data())
def test_glue_test_files_end_in_one_line_or_read_every_row(tmp_path, st_data):
  test = tmp_path / "test.tsv"
  data = _tsv(st_data.draw, "sentence")
  test.write_bytes(data)
  task = tasks.custom("custom", "train.tsv", "dev.tsv", str(test), ("sentence",), "label", None)
  try:
    ex = tsv.load_split(task, task.test[0], "", labelled=False)
  except errors.UserError as e:
    message = _one_line(e, "test.tsv")
    assert re.search(r"test\.tsv(:\d+)?: ", message), message
    return
  assert len(ex) == len(_rows_in(data)) and not ex.skipped
  bad = [n for n, line in enumerate(_raw_lines(data), 1) if n > 1 and _not_text(line)]
  assert not bad, bad  # a test row that is not text is refused, never read as other text


# -------------------------------------------------------------------------------------- CoNLL

GOOD_CONLL = st.sampled_from(["EU NNP B-ORG", "rejects O", "German B-MISC", "", "-DOCSTART- -X- O"])
CONLL_LINE = st.one_of(
    GOOD_CONLL,
    GOOD_CONLL,
    st.sampled_from(["EU", "John PER", "x B-", "a\tI-LOC"]),
    st.tuples(TEXT, st.sampled_from([" O", " B-PER", ""])).map("".join),
)


@EXAMPLES
@given(lines=st.lists(CONLL_LINE, max_size=8), st_data=st.data())
def test_conll_files_end_in_one_line_or_count_every_token_line(tmp_path, lines, st_data):
  path = tmp_path / "train.txt"
  data = st_data.draw(_broken("\n".join(lines).encode("utf-8", "surrogatepass")))
  path.write_bytes(data)
  try:
    sents = conll.read(str(path))
  except errors.UserError as e:
    _one_line(e, "train.txt")
    return
  content = 0
  for raw in _raw_lines(data):
    cols = raw.decode("utf-8", "replace").split()
    content += bool(cols) and (_not_text(raw) or cols[0] != "-DOCSTART-")
  assert sum(len(t) for t in sents.tokens) + len(sents.skipped) == content
  for reason in sents.skipped:
    _reason(reason)
  conll.write_predictions(tmp_path / "pred.txt", sents, sents.tags)  # every token writes back
  assert len((tmp_path / "pred.txt").read_text().split()) == 3 * sum(map(len, sents.tokens))


# ---------------------------------------------------------------------- the command line itself


def _bertjax(cwd: pathlib.Path, *argv: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  env.pop("BERTJAX_DEBUG", None)
  return subprocess.run(
      [sys.executable, "-m", "bertjax.cli", *argv],
      cwd=cwd,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )


RANDOM = ("--init", "random", "--tokenizer", str(REPO / "data" / "tokenizer.model"))


@pytest.mark.slow
def test_the_commands_print_one_line_and_exit_2(tmp_path):
  """The two reports of the issue, as a user runs them: a SQuAD file whose "paragraphs" is a
  number (was a TypeError traceback, exit 1) and a GLUE test file with a bad row (was the right
  line, then "Exception ignored in: <generator object text_lines>" and a traceback)."""
  (tmp_path / "train.json").write_text('{"data": [{"title": "t", "paragraphs": 3}]}')
  r = _bertjax(
      tmp_path,
      "squad",
      "--train",
      "train.json",
      "--dev",
      "train.json",
      "--workdir",
      "out",
      "--version",
      "1.1",
      *RANDOM,
  )
  assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
  assert r.stderr.startswith(
      "bertjax squad: train.json: data[0].paragraphs: expected a list, found the number 3 — "
  ), r.stderr
  (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
  (tmp_path / "test.tsv").write_text("sentence\nfine\ntab\tinside\nok\n")
  r = _bertjax(
      tmp_path,
      "glue",
      "--task",
      "custom",
      "--train",
      "train.tsv",
      "--dev",
      "train.tsv",
      "--test",
      "test.tsv",
      "--text-columns",
      "sentence",
      "--label-column",
      "label",
      "--workdir",
      "out",
      *RANDOM,
  )
  assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
  assert r.stderr.startswith("bertjax glue: test.tsv:3: 2 fields, expected 1 — "), r.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ["test.tsv", "train.json", "train.tsv"]
