"""bertjax.schema: the models of the structured inputs and the one line a mismatch becomes;
tasks.files: text lines that say which bytes are not text, JSON lines, files closed on every
exit."""

import gc
import json
import sys

import pydantic
import pytest

from bertjax import errors, schema
from bertjax.tasks import files


def _error(model, value) -> str:
  with pytest.raises(pydantic.ValidationError) as e:
    model.model_validate(value)
  return schema.problem(e.value)


# --------------------------------------------------------------------------------- messages


def test_a_mismatch_is_the_path_inside_the_file_what_was_expected_and_what_was_found():
  assert schema.location(("data", 0, "paragraphs", 12, "qas")) == "data[0].paragraphs[12].qas"
  assert schema.location(()) == ""
  assert schema.location(("tokenizer", "special_ids", "a\nb")) == 'tokenizer.special_ids["a\\nb"]'

  blob = {"data": [{"paragraphs": 3}]}
  assert _error(schema.SquadFile, blob) == "data[0].paragraphs: expected a list, found the number 3"
  assert _error(schema.SquadFile, {"data": [[]]}) == "data[0]: expected an object, found []"
  assert _error(schema.SquadFile, {}) == 'field "data" is missing'
  assert _error(schema.SquadFile, [1, 2]) == "expected an object, found a list of 2 items"
  para = {"qas": [], "context": True}
  assert _error(schema.SquadFile, {"data": [{"paragraphs": [para]}]}) == (
      "data[0].paragraphs[0].context: expected a string, found true"
  )
  # Strict, as JSON is: "3" is not 3, true is not 1, 1.0 is not an integer.
  for value, found in (("3", 'the string "3"'), (True, "true"), (1.5, "the number 1.5")):
    answer = {"text": "x", "answer_start": value}
    assert _error(schema.SquadAnswer, answer) == f"answer_start: expected an integer, found {found}"
  # Every mismatch counts; the first is named.
  assert _error(schema.SquadFile, {"data": [1, 2, 3]}) == (
      "data[0]: expected an object, found the number 1 (and 2 more)"
  )


def test_values_from_a_file_are_shown_on_one_printable_line():
  assert schema.found("line one\nline two") == 'the string "line one\\nline two"'
  assert schema.found("x" * 100).endswith('xxx..."') and len(schema.found("x" * 100)) < 60
  assert schema.found("\ud800") == 'the string "\\ud800"'
  assert (
      schema.found(None) == "null"
      and schema.found({}) == "{}"
      and schema.found([0]) == ("a list of 1 item")
  )
  assert schema.printable("q-1") == "q-1"
  assert schema.printable("q\n1") == '"q\\n1"'
  # An unpaired surrogate (a "\ud800" escape in the JSON) is refused where text is expected.
  why = _error(schema.SquadQuestion, {"id": "q", "question": "wh\ud800y?"})
  assert why == (
      'question: text with an unpaired surrogate "\\ud800" at character 3 (not Unicode)'
  ), why


def test_load_json_names_the_line_and_the_hint(tmp_path):
  path = tmp_path / "f.json"
  path.write_text('{"a": 1,\n "b": }')
  with pytest.raises(errors.BadInputError) as e:
    schema.load_json(path, errors.BadInputError, " — fix it")
  assert str(e.value) == f"{path}:2: not valid JSON (Expecting value, column 7) — fix it"
  path.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}')  # a byte-order mark is not a mistake
  assert schema.load_json(path, errors.BadInputError, "") == {"a": 1}
  path.write_text("[" * 100_000 + "]" * 100_000)
  with pytest.raises(errors.BadInputError, match="f.json: JSON nested too deeply"):
    schema.load_json(path, errors.BadInputError, "")
  with pytest.raises(errors.BadInputError, match="shown.json: no such file"):
    schema.load_json(tmp_path / "none.json", errors.BadInputError, "", "shown.json")


# ------------------------------------------------------------------- metadata.json, config.json


def test_the_metadata_prepare_writes_is_valid_and_each_field_is_checked(tmp_path, prepare_austen):
  (tmp_path / "shards").mkdir()
  out = prepare_austen(tmp_path / "shards", 20_000)
  meta = schema.read_metadata(f"{out}/metadata.json")
  assert meta == json.loads((tmp_path / "shards" / "metadata.json").read_text())  # as written
  bad = json.loads(json.dumps(meta))
  bad["shards"][0]["documents"] = "12"
  (tmp_path / "bad.json").write_text(json.dumps(bad))
  with pytest.raises(errors.BadInputError) as e:
    schema.read_metadata(tmp_path / "bad.json", "data/metadata.json")
  assert str(e.value) == (
      "data/metadata.json: not the metadata of prepared data (shards[0].documents: expected an "
      'integer, found the string "12") — copy it again, or prepare the data again with '
      "`bertjax prepare ... --overwrite`"
  )
  del bad["tokenizer"]["vocab_size"]
  bad["shards"][0]["documents"] = 12
  bad["shards"][0]["split"] = "dev"
  with pytest.raises(errors.BadInputError, match=r"\(shards\[0\].split: expected one of"):
    schema.check_metadata(bad, "m.json")
  bad["shards"][0]["split"] = "eval"
  with pytest.raises(errors.BadInputError, match='tokenizer: field "vocab_size" is missing'):
    schema.check_metadata(bad, "m.json")
  (tmp_path / "bad.json").write_text("{not json")
  with pytest.raises(errors.BadInputError, match=r"^data/metadata.json:1: not valid JSON"):
    schema.read_metadata(tmp_path / "bad.json", "data/metadata.json")
  with pytest.raises(errors.InputNotFoundError, match="none.json: no such file"):
    schema.read_metadata(tmp_path / "none.json")


def test_the_config_pretrain_writes_is_valid_and_its_mesh_is_checked(tmp_path):
  from experiments import pretrain

  path = tmp_path / "config.json"
  # What the training loop writes into its workdir.
  path.write_text(pretrain.get_config("tiny").to_json_best_effort(indent=2))
  config = schema.read_run_config(path)
  assert config["mesh"]["data"] == -1 and config["model"]["preset"] == "tiny"
  config["mesh"]["fsdp"] = 0
  path.write_text(json.dumps(config))
  with pytest.raises(errors.BadInputError) as e:
    schema.read_run_config(path)
  assert str(e.value).startswith(
      f"{path}: mesh.fsdp: expected -1 (the devices left) or a size >= 1, found the number 0 — "
      "not the config.json `bertjax pretrain` writes"
  )
  del config["mesh"]
  path.write_text(json.dumps(config))
  with pytest.raises(errors.BadInputError, match='config.json: field "mesh" is missing'):
    schema.read_run_config(path)


# ------------------------------------------------------------------------- lines, JSON lines


def test_text_lines_say_which_bytes_are_not_text(tmp_path):
  path = tmp_path / "t.txt"
  path.write_bytes(b"fine\r\nJos\xe9\rnul\x00here\n\xef\xbf\xbd kept\n")
  with files.text_lines(path) as lines:
    got = list(lines)
  assert got == [
      ("fine\r\n", None),
      ("Jos\ufffd\r", "invalid UTF-8 (byte 0xe9 at column 4)"),
      ("nul\x00here\n", "a NUL byte at column 4"),
      ("\ufffd kept\n", None),  # a real U+FFFD in the file is text
  ]


def test_a_reader_that_stops_at_a_bad_row_closes_its_file(tmp_path):
  """A test TSV with a bad row ends in GlueDataError; the file was closed before it left the
  reader. It used to be closed by the garbage collector, which then printed "Exception ignored
  in: <generator object text_lines>" and a traceback after the one-line error."""
  from bertjax.tasks.glue import tsv

  path = tmp_path / "test.tsv"
  path.write_text("sentence\nfine\ntab\tinside\nok\n")
  unraisable = []
  hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
  try:

    def read() -> str:
      try:
        tsv.read_rows(str(path), tsv.Columns(("sentence",), None), strict=True)
      except tsv.GlueDataError as e:
        return str(e)  # the handler keeps the exception (and its frames) until it returns

    assert read().startswith(f"{path}:3: 2 fields, expected 1")
    gc.collect()
  finally:
    sys.unraisablehook = hook
  assert not unraisable, [u.exc_value for u in unraisable]


class _Review(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(strict=True)
  text: schema.Text
  label: str


def test_json_lines_skip_and_count_each_bad_record(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_bytes(
      b'{"text": "good", "label": "pos"}\n'
      b"\n"
      b'{"text": "bad", "label": 0}\n'
      b'{"text": "half"\n'
      b'["a", "list"]\n'
      b'{"text": "caf\xe9", "label": "pos"}\n'
      b'{"text": "\\ud800", "label": "neg"}\r\n'
      b'{"text": "fine", "label": "neg"}'
  )
  records, skipped = files.read_jsonl(str(path), _Review)
  assert [(r.text, r.label) for r in records] == [("good", "pos"), ("fine", "neg")]
  assert skipped == [
      "train.jsonl:3: label: expected a string, found the number 0",
      "train.jsonl:4: not valid JSON (Expecting ',' delimiter, column 16)",
      "train.jsonl:5: expected an object, found a list of 2 items",
      "train.jsonl:6: invalid UTF-8 (byte 0xe9 at column 14)",
      'train.jsonl:7: text with an unpaired surrogate "\\ud800" (not Unicode)',
  ]
  path.write_text('{"text": 1}\n[]\n')
  with pytest.raises(errors.BadInputError) as e:
    files.read_jsonl(str(path), _Review)
  assert str(e.value) == (
      f"{path}: no usable records (2 skipped; first: train.jsonl:1: text: expected a string, "
      "found the number 1 (and 1 more)) — expected one JSON object a line"
  )
  with pytest.raises(errors.BadInputError, match="none.jsonl: no such file"):
    files.read_jsonl(str(tmp_path / "none.jsonl"), _Review)
