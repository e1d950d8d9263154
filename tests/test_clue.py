"""CLUE through `bertjax glue`: CLUE's JSON-lines files read as CLUE distributes them, malformed
lines skipped or refused as GLUE's TSV rows are, and the leaderboard's submission files."""

import json
import os
import random

import numpy as np
import pytest

from bertjax.tasks.glue import jsonl, submission, tasks, tsv

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _lines(path, records, extra: str = ""):
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")
    f.write(extra)


# One record of each task as CLUE's README and public zips show them.
_RECORDS = {
    "afqmc": {"sentence1": "双十一花呗提额在哪", "sentence2": "里可以提花呗额度", "label": "0"},
    "tnews": {
        "label": "102",
        "label_desc": "news_entertainment",
        "sentence": "江疏影甜甜圈自拍，迷之角度竟这么好看，美吸引一切事物",
        "keywords": "江疏影,美少女,经纪人,甜甜圈",
    },
    "iflytek": {"label": "110", "label_des": "社区超市", "sentence": "朴朴快送超市创立于2016年"},
    "cmnli": {
        "sentence1": "新的权利已经足够好了",
        "sentence2": "每个人都很喜欢最新的福利",
        "label": "neutral",
    },
    "ocnli": {
        "level": "medium",
        "sentence1": "身上裹一件工厂发的棉大衣,手插在袖筒里",
        "sentence2": "身上至少一件衣服",
        "label": "entailment",
        "label0": "entailment",
        "genre": "lit",
        "prem_id": "lit_635",
        "id": 0,
    },
    "csl": {
        "id": 1,
        "abst": "为解决传统均匀FFT波束形成算法引起的3维声呐成像分辨率降低的问题",
        "keyword": ["水声学", "FFT", "波束形成", "3维成像声呐"],
        "label": "1",
    },
    "cluewsc2020": {
        "target": {"span2_index": 37, "span1_index": 5, "span1_text": "床", "span2_text": "它"},
        "idx": 261,
        "label": "false",
        "text": "这时候放在床上枕头旁边的手机响了，我感到奇怪，因为欠费已被停机两个月，现在它突然响了。",
    },
}

# (text_a, text_b, class id) each task reads from its record
_READ = {
    "afqmc": ("双十一花呗提额在哪", "里可以提花呗额度", 0),
    "tnews": ("江疏影甜甜圈自拍，迷之角度竟这么好看，美吸引一切事物", None, 2),  # 100 101 [102]
    "iflytek": ("朴朴快送超市创立于2016年", None, 110),
    "cmnli": ("新的权利已经足够好了", "每个人都很喜欢最新的福利", 2),
    "ocnli": ("身上裹一件工厂发的棉大衣,手插在袖筒里", "身上至少一件衣服", 1),
    "csl": (
        "水声学 FFT 波束形成 3维成像声呐",
        "为解决传统均匀FFT波束形成算法引起的3维声呐成像分辨率降低的问题",
        1,
    ),
    "cluewsc2020": (
        "这时候放在_床_上枕头旁边的手机响了，我感到奇怪，因为欠费已被停机两个月，现在[它]突然响了。",
        None,
        1,
    ),
}


def _test_record(name: str, i: int) -> dict:
  r = {k: v for k, v in _RECORDS[name].items() if k not in ("label", "label_desc", "label_des")}
  r["id"] = i
  return r


def _clue_dir(root, name: str, n_test: int = 2) -> str:
  d = os.path.join(root, name)
  os.makedirs(d)
  _lines(os.path.join(d, "train.json"), [_RECORDS[name]] * 2)
  _lines(os.path.join(d, "dev.json"), [_RECORDS[name]])
  _lines(os.path.join(d, "test.json"), [_test_record(name, 10 + i) for i in range(n_test)])
  return d


@pytest.mark.parametrize("name", tasks.CLUE_ALL)
def test_each_task_reads_clues_files(tmp_path, name):
  task = tasks.get(name)
  d = _clue_dir(str(tmp_path), name)
  tsv.check_task(task, d)
  got = tsv.load_task(task, d)
  assert set(got) == {"train", "dev", "test"}
  a, b, y = _READ[name]
  train = got["train"]
  assert train.text_a == [a, a] and train.text_b == (None if b is None else [b, b])
  assert train.labels.tolist() == [y, y] and task.labels[y] == _RECORDS[name]["label"]
  assert got["test"].index == [10, 11] and got["test"].labels is None


def test_label_lists_are_clues():
  from bertjax.commands import glue

  assert glue.CLUE_NAMES == tasks.CLUE_ALL
  assert tasks.get("tnews").labels == (
      tuple("100 101 102 103 104 106 107 108 109 110 112 113 114 115 116".split())
  )
  assert tasks.get("iflytek").labels == tuple(str(i) for i in range(119))
  assert tasks.get("ocnli").labels == ("contradiction", "entailment", "neutral")
  assert tasks.get("cluewsc2020").labels == ("true", "false")
  assert all(tasks.get(n).metrics == ("accuracy",) for n in tasks.CLUE_ALL)


def test_wsc_marks_the_noun_and_the_pronoun_in_either_order():
  text = "小明把书给了他的弟弟"
  first = {
      "text": text,
      "target": {"span1_index": 0, "span1_text": "小明", "span2_index": 6, "span2_text": "他"},
  }
  assert jsonl.wsc_text(first) == ("_小明_把书给了[他]的弟弟", "")
  later = {
      "text": text,
      "target": {"span1_index": 8, "span1_text": "弟弟", "span2_index": 6, "span2_text": "他"},
  }
  assert jsonl.wsc_text(later) == ("小明把书给了[他]的_弟弟_", "")
  wrong = {
      "text": text,
      "target": {"span1_index": 1, "span1_text": "小明", "span2_index": 6, "span2_text": "他"},
  }
  assert jsonl.wsc_text(wrong) == (
      None,
      'target.span1_text "\\u5c0f\\u660e" is not at target.span1_index 1 of the text '
      '(found "\\u660e\\u628a")',
  )


def test_malformed_train_and_dev_lines_are_skipped_and_counted(tmp_path):
  task = tasks.get("cmnli")
  d = tmp_path / "cmnli"
  d.mkdir()
  good = _RECORDS["cmnli"]
  bad = (
      '{"sentence1": "甲", "sentence2": "乙", "label": "-"}\n'  # no majority label
      '{"sentence1": "甲", "label": "neutral"}\n'
      '{"sentence1": "甲", "sentence2": 3, "label": "neutral"}\n'
      "\n"  # blank: not a record
      '["a list"]\n'
      '{"sentence1": "甲", "sentence2": "乙", "label": "neutral"\n'
  )
  _lines(d / "train.json", [good], bad)
  with open(d / "train.json", "ab") as f:
    f.write(b'{"sentence1": "\xff", "sentence2": "b", "label": "neutral"}\n')
  _lines(d / "dev.json", [good])
  got = tsv.load_task(task, str(d))
  assert len(got["train"]) == 1 and got["dev"].labels.tolist() == [2]
  assert got["train"].skipped == [
      "cmnli/train.json:2: label '-' is not one of ['contradiction', 'entailment', 'neutral']",
      'cmnli/train.json:3: no "sentence2" field',
      "cmnli/train.json:4: sentence2: expected a string or a list of strings, found the number 3",
      "cmnli/train.json:6: expected a JSON object, found a list of 1 item",
      "cmnli/train.json:7: not valid JSON (Expecting ',' delimiter, column 56)",
      "cmnli/train.json:8: invalid UTF-8 (byte 0xff at column 16)",
  ]
  assert "test" not in got  # no test.json: no submission, not an error


def test_a_test_line_that_cannot_be_read_stops_the_command(tmp_path):
  task = tasks.get("afqmc")
  d = _clue_dir(str(tmp_path), "afqmc")
  _lines(os.path.join(d, "test.json"), [_test_record("afqmc", 0)], '{"id": 1, "sentence1": "甲"}\n')
  with pytest.raises(
      tsv.GlueDataError, match=r'afqmc/test.json:2: no "sentence2" field — every test line'
  ):
    tsv.check_task(task, d)


def test_a_test_file_without_ids_is_numbered_from_zero(tmp_path):
  task = tasks.get("tnews")
  d = _clue_dir(str(tmp_path), "tnews")
  _lines(os.path.join(d, "test.json"), [{"sentence": "新闻"}, {"sentence": "体育"}])
  assert tsv.load_task(task, d)["test"].index == [0, 1]


# name -> (submission files, in the order of the task's test splits)
_FILES = {
    "afqmc": ["afqmc_predict.json"],
    "tnews": ["tnews11_predict.json", "tnews10_predict.json"],
    "iflytek": ["iflytek_predict.json"],
    "cmnli": ["cmnli_predict.json"],
    "ocnli": ["ocnli_50k_predict.json"],
    "csl": ["csl_predict.json"],
    "cluewsc2020": ["cluewsc11_predict.json", "cluewsc10_predict.json"],
}


@pytest.mark.parametrize("name", tasks.CLUE_ALL)
def test_submission_files_names_ids_and_labels(tmp_path, name):
  task = tasks.get(name)
  preds = np.array([1, 0])
  for split, want in zip(task.test, _FILES[name], strict=True):
    path = submission.write_submission(task, split, [7, "x8"], preds, str(tmp_path))
    assert os.path.relpath(path, tmp_path) == os.path.join("submission", want)
    lines = [json.loads(l) for l in open(path, encoding="utf-8")]
    assert lines == [{"id": 7, "label": task.labels[1]}, {"id": "x8", "label": task.labels[0]}]
  with pytest.raises(ValueError, match="2 test rows but 1 predictions"):
    submission.write_submission(task, task.test[0], [7, 8], preds[:1], str(tmp_path))


def test_tnews_labels_are_written_as_clue_numbers(tmp_path):
  task = tasks.get("tnews")
  path = submission.write_submission(
      task, task.test[0], [0, 1, 2], np.array([0, 4, 14]), str(tmp_path)
  )
  assert open(path).read() == (
      '{"id": 0, "label": "100"}\n{"id": 1, "label": "104"}\n{"id": 2, "label": "116"}\n'
  )


def _glue_main(argv):
  from bertjax.commands import glue

  assert glue.main(argv) == 0


def test_custom_jsonl_task_flags(tmp_path):
  from bertjax.commands import glue

  _lines(tmp_path / "train.json", [{"q": "好", "topic": "b"}, {"q": "坏", "topic": "a"}])
  args = glue._parser().parse_args(
      [
          "--task",
          "custom",
          "--name",
          "news",
          "--train",
          str(tmp_path / "train.json"),
          "--dev",
          "d",
          "--test",
          "t",
          "--text-fields",
          "q",
          "--label-field",
          "topic",
          "--workdir",
          "w",
          "--init",
          "random",
      ]
  )
  (task,) = glue._task_list(args)
  assert task.format == "jsonl" and task.labels == ("a", "b") and task.text_columns == ("q",)
  assert submission.file_name(task, task.test[0]) == "news_predict.json"


# ------------------------------------------------------------------- fine-tuning end to end

_ZH = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后"
_CUES = "电影体育财经"  # the character that decides a TNEWS-like label: 100, 101, 102


def _vocab(path) -> str:
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(_ZH + _CUES) + ["，", "。"]
  path.write_text("\n".join(pieces) + "\n", encoding="utf-8")
  return str(path)


@pytest.mark.slow
def test_tnews_packed_writes_the_leaderboard_files(tmp_path):
  r = random.Random(0)

  def record(k):
    words = [r.choice(_ZH) for _ in range(r.randint(4, 9))]
    words.insert(r.randint(0, len(words)), _CUES[2 * k])
    return "".join(words) + "。"

  d = tmp_path / "tnews"
  d.mkdir()
  for split, n in (("train", 48), ("dev", 16)):
    ks = [r.randrange(3) for _ in range(n)]
    _lines(
        d / f"{split}.json",
        [{"label": str(100 + k), "label_desc": "x", "sentence": record(k)} for k in ks],
        '{"label": "105", "sentence": "无"}\n',
    )
  _lines(d / "test.json", [{"id": i, "sentence": record(i % 3), "keywords": ""} for i in range(5)])
  _lines(d / "test1.0.json", [{"id": 100 + i, "sentence": record(i % 3)} for i in range(3)])
  out = tmp_path / "out"
  _glue_main(
      [
          "--task",
          "tnews",
          "--data",
          str(d),
          "--init",
          "random",
          "--tokenizer",
          _vocab(tmp_path / "vocab.txt"),
          "--workdir",
          str(out),
          "--max-seq-len",
          "16",
          "--epochs",
          "1",
          "--max-steps",
          "2",
          "--learning-rate",
          "1e-3",
          "--no-progress",
      ]
  )
  row = json.loads((out / "results.json").read_text())["tnews"]
  assert set(row) == {"accuracy"} and 0.0 <= row["accuracy"] <= 1.0
  assert sorted(os.listdir(out / "submission")) == ["tnews10_predict.json", "tnews11_predict.json"]
  for name, ids in (
      ("tnews11_predict.json", list(range(5))),
      ("tnews10_predict.json", [100, 101, 102]),
  ):
    lines = [json.loads(l) for l in (out / "submission" / name).read_text().splitlines()]
    assert [l["id"] for l in lines] == ids
    assert all(set(l) == {"id", "label"} and l["label"] in tasks.get("tnews").labels for l in lines)
  skipped = (out / "tnews" / "skipped_rows.txt").read_text().splitlines()
  assert skipped[0].startswith("tnews/train.json:49: label '105' is not one of")
  assert len(skipped) == 2
