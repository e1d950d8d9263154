"""`text_file.records`: the texts of .txt, .jsonl and .parquet in order, a `Bad` naming file
and line in place of each record without text."""

import json

import pytest


def test_records_keep_their_places_and_name_the_bad_ones(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  from bertjax import errors
  from bertjax.tasks import text_file

  txt = tmp_path / "t.txt"
  txt.write_bytes(b"one\n\n\xff\xfe\nfour\n")
  got = list(text_file.records(str(txt)))
  assert got[0] == "one" and got[3] == "four"
  assert [str(b) for b in got[1:3]] == [f"{txt}:2: empty line", f"{txt}:3: invalid UTF-8"]

  jsonl = tmp_path / "t.jsonl"
  rows = [{"q": "a"}, {"q": ""}, "not json", {"other": 1}, {"q": "e"}]
  jsonl.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
  got = list(text_file.records(str(jsonl), "q"))
  assert (got[0], got[4]) == ("a", "e")
  assert [str(b).split(": ", 1)[1] for b in got[1:4]] == [
      "no text in field 'q'",
      "not a JSON object",
      "no text in field 'q'",
  ]

  parquet = tmp_path / "t.parquet"
  pq.write_table(pa.table({"q": ["a", None, "c"]}), parquet, row_group_size=2)
  got = list(text_file.records(str(parquet), "q"))
  assert (got[0], got[2], str(got[1])) == ("a", "c", f"{parquet}:2: no text in column 'q'")
  with pytest.raises(errors.BadInputError, match="no column 'text' — columns: q"):
    list(text_file.records(str(parquet)))
