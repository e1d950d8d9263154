"""GLUE loaders: the TSV fixtures in the GLUE download layout (with malformed rows), TFDS
`glue/<task>` under `tfds.testing.mock_data`, custom TSVs, and [CLS] A [SEP] B [SEP] packing."""

import os
import re

import numpy as np
import pytest

from bertjax.tasks import inputs
from bertjax.tasks.glue import features, tasks, tsv

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "glue")
TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "data", "tokenizer.model")

# task -> split -> (rows kept, labels or None, skipped "file:line" prefixes)
EXPECTED = {
    "cola": {
        "train": (5, [1, 1, 0, 1, 0], ["CoLA/train.tsv:5"]),
        "dev": (3, [1, 0, 1], []),
        "test": (2, None, []),
    },
    "sst2": {
        "train": (5, [0, 0, 1, 1, 1], ["SST-2/train.tsv:6", "SST-2/train.tsv:7"]),
        "dev": (3, [1, 0, 1], []),
        "test": (3, None, []),
    },
    "mrpc": {
        "train": (3, [1, 0, 1], ["MRPC/train.tsv:5"]),
        "dev": (2, [1, 0], []),
        "test": (2, None, []),
    },
    "stsb": {
        "train": (3, [5.0, 3.8, 3.8], ["STS-B/train.tsv:5"]),
        "dev": (4, [5.0, 4.75, 5.0, 2.4], []),
        "test": (2, None, []),
    },
    "qqp": {
        "train": (4, [0, 1, 1, 0], ["QQP/train.tsv:4"]),
        "dev": (3, [0, 0, 1], []),
        "test": (2, None, []),
    },
    "mnli": {
        "train": (6, [1, 0, 0, 0, 1, 2], []),
        "dev_matched": (2, [1, 2], ["MNLI/dev_matched.tsv:4"]),
        "dev_mismatched": (2, [2, 0], []),
        "test_matched": (2, None, []),
        "test_mismatched": (1, None, []),
        "ax": (3, None, []),
    },
    "qnli": {
        "train": (3, [1, 1, 0], ["QNLI/train.tsv:5"]),
        "dev": (2, [0, 1], []),
        "test": (1, None, []),
    },
    "rte": {"train": (3, [1, 0, 0], []), "dev": (2, [1, 0], []), "test": (2, None, [])},
    "wnli": {"train": (4, [1, 1, 1, 0], []), "dev": (2, [0, 1], []), "test": (1, None, [])},
}


@pytest.mark.parametrize("name", tasks.ALL)
def test_tsv_fixture_loads_every_split(name):
  task = tasks.TASKS[name]
  data = tsv.load_task(task, FIXTURES)
  assert set(data) == set(EXPECTED[name])
  for split, (n, labels, skipped) in EXPECTED[name].items():
    ex = data[split]
    assert len(ex) == n, split
    assert (ex.text_b is not None) == task.is_pair
    assert all(isinstance(t, str) and t for t in ex.text_a)
    if labels is None:
      assert ex.labels is None
      assert ex.index == [str(i) for i in range(n)]  # the test files' own index column
    else:
      np.testing.assert_allclose(ex.labels, labels, rtol=1e-6)
      assert ex.labels.dtype == (np.float32 if task.is_regression else np.int32)
    assert [s.split(": ")[0] for s in ex.skipped] == skipped, ex.skipped


def test_tsv_quirks():
  sst2 = tsv.load_task(tasks.TASKS["sst2"], FIXTURES)["train"]
  assert 'the "greatest musicians ' in sst2.text_a  # a quote that is not quoting
  assert any("label 'positive' is not one of ['0', '1']" in s for s in sst2.skipped)
  assert any("3 fields, expected 2" in s for s in sst2.skipped)
  cola = tsv.load_task(tasks.TASKS["cola"], FIXTURES)["train"]
  assert cola.text_a[0].startswith("Our friends won't buy")  # headerless: 4th column
  mnli = tsv.load_task(tasks.TASKS["mnli"], FIXTURES)
  assert mnli["train"].text_b[0] == "Product and geography are what make cream skimming work. "


def test_tsv_crlf_and_errors(tmp_path):
  d = tmp_path / "RTE"
  d.mkdir()
  (d / "train.tsv").write_bytes(
      b"index\tsentence1\tsentence2\tlabel\r\n"
      b"0\ta\tb\tentailment\r\n1\tc\td\tnot_entailment\r\n\r\n"
  )
  (d / "dev.tsv").write_text("index\tsentence1\tlabel\n0\ta\tentailment\n")
  task = tasks.TASKS["rte"]
  train = tsv.load_split(task, task.train, str(tmp_path), labelled=True)
  assert train.labels.tolist() == [0, 1] and train.text_b == ["b", "d"] and not train.skipped
  with pytest.raises(tsv.GlueDataError, match=r"RTE/dev.tsv:1: header has no column 'sentence2'"):
    tsv.load_split(task, task.dev[0], str(tmp_path), labelled=True)
  with pytest.raises(tsv.GlueDataError, match="QNLI/train.tsv: not found"):
    tsv.load_task(tasks.TASKS["qnli"], str(tmp_path))


def test_mrpc_header_with_a_byte_order_mark(tmp_path):
  # The GLUE download's MRPC train/dev headers start with U+FEFF (from msr_paraphrase_*.txt).
  d = tmp_path / "MRPC"
  d.mkdir()
  header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
  rows = "1\t1\t2\tHe said so .\tHe did say so .\n0\t3\t4\tA cat .\tA dog .\n"
  for name in ("train.tsv", "dev.tsv"):
    (d / name).write_bytes(("\ufeff" + header + rows).encode("utf-8"))
  (d / "test.tsv").write_bytes(
      ("\ufeffindex" + header[len("Quality") :] + "0\t5\t6\tx .\ty .\n").encode("utf-8")
  )
  data = tsv.load_task(tasks.TASKS["mrpc"], str(tmp_path))
  assert data["train"].labels.tolist() == [1, 0] and not data["train"].skipped
  assert data["train"].text_a == ["He said so .", "A cat ."]
  assert data["train"].text_b == ["He did say so .", "A dog ."]
  assert data["test"].index == ["0"] and data["test"].text_b == ["y ."]


def test_a_tab_inside_a_train_sentence_skips_the_row_and_counts_it(tmp_path):
  d = tmp_path / "CoLA"
  d.mkdir()
  (d / "train.tsv").write_text(
      "gj04\t1\t\tOur friends\twon't buy this.\n"
      "gj04\t0\t*\tThey drank the pub.\n"
      "gj04\t1\t\tA trailing empty field is harmless.\t\n"
  )
  task = tasks.TASKS["cola"]
  train = tsv.load_split(task, task.train, str(tmp_path), labelled=True)
  assert train.text_a == ["They drank the pub.", "A trailing empty field is harmless."]
  assert train.skipped == ["CoLA/train.tsv:1: 5 fields, expected 4"]


@pytest.mark.parametrize(
    "glue_dir,name,header,bad",
    [
        ("MRPC", "mrpc", "index\t#1 ID\t#2 ID\t#1 String\t#2 String", "{i}\t1\t2\tone string"),
        ("SST-2", "sst2", "index\tsentence", "{i}\ta\ttab inside"),
        ("CoLA", "cola", "index\tsentence", "{i}"),
    ],
)
def test_a_test_row_that_cannot_be_read_is_an_error(tmp_path, glue_dir, name, header, bad):
  # MRPC: 23 rows, 2 malformed (the loader used to keep 21); SST-2/CoLA: 20 rows, 1 malformed.
  task = tasks.TASKS[name]
  n, broken = (23, (6, 18)) if name == "mrpc" else (20, (12,))
  width = header.count("\t") + 1
  good = lambda i: "\t".join([str(i)] + ["s"] * (width - 1))
  lines = [header] + [bad.format(i=i) if i in broken else good(i) for i in range(n)]
  d = tmp_path / glue_dir
  d.mkdir()
  (d / "test.tsv").write_text("\n".join(lines) + "\n")
  first = broken[0] + 2  # 1-based, after the header
  got = len(bad.format(i=0).split("\t"))
  want = f"{d / 'test.tsv'}:{first}: {got} fields, expected {width} — every test row needs"
  with pytest.raises(tsv.GlueDataError, match="^" + re.escape(want)):
    tsv.load_tests(task, str(tmp_path))
  (d / "test.tsv").write_text(
      "\n".join(l for k, l in enumerate(lines) if k - 1 not in broken) + "\n\n"
  )
  assert len(tsv.load_tests(task, str(tmp_path))["test"]) == n - len(broken)


def test_a_test_row_without_its_id_is_an_error(tmp_path):
  d = tmp_path / "RTE"
  d.mkdir()
  (d / "test.tsv").write_text("index\tsentence1\tsentence2\n0\ta\tb\n\tc\td\n")
  with pytest.raises(tsv.GlueDataError, match=r"RTE/test.tsv:3: empty 'index' column"):
    tsv.load_tests(tasks.TASKS["rte"], str(tmp_path))


def test_missing_test_file_drops_only_the_submission(tmp_path):
  d = tmp_path / "SST-2"
  d.mkdir()
  for split in ("train", "dev"):
    (d / f"{split}.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
  assert set(tsv.load_task(tasks.TASKS["sst2"], str(tmp_path))) == {"train", "dev"}


def test_custom_task(tmp_path):
  rows = "id\treview\tstars\n0\tlovely\thigh\n1\tawful\tlow\n2\tfine\tmid\n3\tx\t\n"
  (tmp_path / "train.tsv").write_text(rows)
  (tmp_path / "dev.tsv").write_text("id\treview\tstars\n0\tnice\thigh\n1\tmeh\tunseen\n")
  (tmp_path / "test.tsv").write_text("review\nsuper\n")
  labels = tsv.custom_labels(str(tmp_path / "train.tsv"), ("review",), "stars")
  assert labels == ("high", "low", "mid")
  task = tasks.custom(
      "reviews",
      str(tmp_path / "train.tsv"),
      str(tmp_path / "dev.tsv"),
      str(tmp_path / "test.tsv"),
      ("review",),
      "stars",
      labels,
  )
  data = tsv.load_task(task, "")
  assert data["train"].labels.tolist() == [0, 1, 2]
  assert data["train"].skipped == ["tmp/train.tsv:5: empty label".replace("tmp", tmp_path.name)]
  assert data["dev"].labels.tolist() == [0] and "label 'unseen'" in data["dev"].skipped[0]
  assert data["test"].text_a == ["super"] and data["test"].index == ["0"]
  assert task.metrics == ("accuracy",)
  reg = tasks.custom("r", "a", "b", None, ("x", "y"), "s", None)
  assert reg.is_regression and reg.is_pair and reg.test == ()


@pytest.mark.slow
@pytest.mark.parametrize("name", tasks.ALL)
def test_tfds_mock_every_task(name):
  tfds = pytest.importorskip("tensorflow_datasets")
  from bertjax.tasks.glue import tfds_source

  task = tasks.TASKS[name]
  with tfds.testing.mock_data(num_examples=4):
    data = tfds_source.load_task(task, None)
  want = {"train"} | {s.name for s in task.dev} | {s.name for s in task.test}
  assert set(data) == want
  for split, ex in data.items():
    assert len(ex) == 4 and (ex.text_b is not None) == task.is_pair
    assert all(isinstance(t, str) for t in ex.text_a)
    if split.startswith(("test", "ax")):
      assert ex.labels is None and all(i.isdigit() for i in ex.index)
    elif task.is_regression:
      assert ex.labels.dtype == np.float32
    else:
      assert ex.labels.dtype == np.int32
      assert ((0 <= ex.labels) & (ex.labels < task.num_labels)).all()


def test_tfds_not_prepared_says_how(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  from bertjax.tasks.glue import tfds_source

  task = tasks.TASKS["sst2"]
  with pytest.raises(tsv.GlueDataError, match=r"tfds build glue --config sst2 --data_dir DIR"):
    tfds_source.load_split(task, task.train, str(tmp_path), labelled=True)


class _Chars:
  """A tokenizer with WordPiece-style special ids: one id per character."""

  cls_id, sep_id, pad_id = 101, 102, 0

  def encode(self, text):
    return [ord(c) for c in text]

  def encode_batch(self, texts):
    return [self.encode(t) for t in texts]


def test_pack_pairs_segments_and_truncation():
  ex = features.Examples(["abcdef", "a"], ["xy", "wxyz"], np.array([1, 0], np.int32), ["0", "1"])
  f = features.encode(_Chars(), ex, max_seq_len=8)
  a, x = ord("a"), ord("x")
  # 8 - 3 specials = 5 tokens: the longer segment A loses its tail first -> "abc" + "xy".
  assert f.input_ids_NxL[0].tolist() == [101, a, a + 1, a + 2, 102, x, x + 1, 102]
  assert f.token_type_ids_NxL[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
  assert f.attention_mask_NxL[0].tolist() == [1] * 8
  # Short pair: padded with pad_id, mask 0 and segment 0 on padding.
  assert f.input_ids_NxL[1].tolist() == [101, a, 102, ord("w"), x, x + 1, x + 2, 102]
  single = features.encode(_Chars(), features.Examples(["ab"], None, None, ["0"]), 6)
  assert single.input_ids_NxL[0].tolist() == [101, a, a + 1, 102, 0, 0]
  assert single.attention_mask_NxL[0].tolist() == [1, 1, 1, 1, 0, 0]
  assert single.token_type_ids_NxL[0].tolist() == [0] * 6
  assert inputs.truncate_pair([1, 2, 3], [4, 5, 6, 7], 4) == ([1, 2], [4, 5])


def test_encode_with_the_sentencepiece_tokenizer():
  from bertjax.data import tokenizer as tokenizer_lib

  tok = tokenizer_lib.SentencePieceTokenizer(TOKENIZER)
  mrpc = tsv.load_task(tasks.TASKS["mrpc"], FIXTURES)["dev"]
  f = features.encode(tok, mrpc, max_seq_len=32)
  assert f.input_ids_NxL.shape == (2, 32) and f.input_ids_NxL.dtype == np.int32
  row = f.input_ids_NxL[0]
  assert row[0] == tokenizer_lib.CLS_ID and row[-1] == tokenizer_lib.SEP_ID  # truncated: full
  assert (row == tokenizer_lib.SEP_ID).sum() == 2
  sep_a = int(np.argmax(row == tokenizer_lib.SEP_ID))
  assert (f.token_type_ids_NxL[0, : sep_a + 1] == 0).all()
  assert (f.token_type_ids_NxL[0, sep_a + 1 :] == 1).all()


def test_check_task_reads_every_file_and_refuses_an_empty_split(tmp_path):
  d = tmp_path / "SST-2"
  d.mkdir()
  (d / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
  (d / "dev.tsv").write_text("sentence\tlabel\nso so\tmaybe\n")
  sst2 = tasks.TASKS["sst2"]
  want = r"SST-2/dev.tsv: no usable rows \(1 skipped; first: SST-2/dev.tsv:2: label 'maybe'"
  with pytest.raises(tsv.GlueDataError, match=want):
    tsv.check_task(sst2, str(tmp_path))
  (d / "dev.tsv").write_text("sentence\tlabel\nfine\t0\n")
  tsv.check_task(sst2, str(tmp_path))
  (d / "test.tsv").write_text("index\tsentence\n")  # a submission needs every test row
  with pytest.raises(tsv.GlueDataError, match=r"SST-2/test.tsv: no usable rows \(0 skipped\)"):
    tsv.check_task(sst2, str(tmp_path))


def test_unknown_task_is_a_config_error():
  from bertjax import errors

  assert tasks.get("ax") is tasks.TASKS["mnli"]
  with pytest.raises(
      errors.ConfigError, match="task 'sst3' is not a GLUE or CLUE task — valid: cola"
  ):
    tasks.get("sst3")
