"""Mistakes table rows (see test_mistakes.py) for the finetune commands: glue, squad, ner, and
the model tools extract and convert."""

import json
import pathlib

from mistakes_common import Mistake

GLUE_DIR = "{repo}/tests/fixtures/glue"
MOVIES = "{repo}/data/movie_snippets"
RANDOM = ("--init", "random", "--tokenizer", "{tokenizer}")


def _glue(*extra: str) -> tuple[str, ...]:
  """A valid `glue` run on the fixture GLUE_DIR, then `extra` (later flags win)."""
  return ("glue", "--task", "sst2", "--data", GLUE_DIR, "--workdir", "ft", *RANDOM, *extra)


def _custom(*extra: str) -> tuple[str, ...]:
  """A custom task over files the row's setup writes (train.tsv, dev.tsv)."""
  return (
      "glue",
      "--task",
      "custom",
      "--train",
      "train.tsv",
      "--dev",
      "dev.tsv",
      "--text-columns",
      "sentence",
      "--label-column",
      "label",
      "--workdir",
      "ft",
      *RANDOM,
      *extra,
  )


def _squad(*extra: str) -> tuple[str, ...]:
  return (
      "squad",
      "--train",
      "train.json",
      "--dev",
      "train.json",
      "--version",
      "1.1",
      "--workdir",
      "ft",
      *RANDOM,
      *extra,
  )


def _ner(*extra: str) -> tuple[str, ...]:
  return ("ner", "--train", "train.txt", "--dev", "train.txt", "--workdir", "ft", *RANDOM, *extra)


def _write(name: str, text: str):
  return lambda cwd: (cwd / name).write_text(text)


def _tsvs(train: str, dev: str = "sentence\tlabel\ngood\t1\nbad\t0\n"):
  def setup(cwd: pathlib.Path) -> None:
    (cwd / "train.tsv").write_text(train)
    (cwd / "dev.tsv").write_text(dev)

  return setup


_GOOD_TSV = "sentence\tlabel\ngood\t1\nbad\t0\n"
_SQUAD = {
    "data": [
        {
            "paragraphs": [
                {
                    "context": "The cat sat on the mat.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Where did the cat sit?",
                            "answers": [{"text": "the mat", "answer_start": 15}],
                        }
                    ],
                }
            ]
        }
    ]
}


def _small_vocab(cwd: pathlib.Path) -> None:
  """A 100-piece WordPiece vocab.txt: fits the tiny run's vocab of 1000."""
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]
  (cwd / "vocab.txt").write_text("\n".join(pieces) + "\n")
  (cwd / "input.txt").write_text("w1 w2\n")


ROWS: list[Mistake] = [
    # ------------------------------------------------------------------ glue: numeric flags
    Mistake("glue_negative_lr", _glue("--learning-rate", "-1"), ("--learning-rate", "> 0")),
    Mistake("glue_zero_epochs", _glue("--epochs", "0"), ("--epochs", ">= 1")),
    Mistake("glue_zero_batch", _glue("--batch-size", "0"), ("--batch-size", ">= 1")),
    Mistake(
        "glue_batch_does_not_split",
        _glue("--batch-size", "12"),
        ("--batch-size 12", "multiple of 8"),
    ),
    Mistake("glue_warmup_one", _glue("--warmup", "1"), ("--warmup", "< 1")),
    Mistake("glue_seq_len_too_short", _glue("--max-seq-len", "3"), ("--max-seq-len", ">= 4")),
    Mistake(
        "glue_seq_len_over_positions",
        _glue("--max-seq-len", "4096"),
        ("--max-seq-len 4096", "max_position_embeddings=512"),
    ),
    Mistake("glue_sweep_zero_seeds", _glue("--sweep", "--seeds", "0"), ("--seeds", ">= 1")),
    Mistake("glue_seeds_without_sweep", _glue("--seeds", "3"), ("--seeds", "only with --sweep")),
    Mistake("glue_bad_mesh_axis", _glue("--mesh", "batch=2"), ("--mesh", "unknown axis 'batch'")),
    Mistake("glue_mesh_too_big", _glue("--mesh", "data=3"), ("--mesh data=3", "8 devices")),
    # ------------------------------------------------------------------ glue: tasks and data
    Mistake("glue_unknown_task", _glue("--task", "sst3"), ("--task 'sst3'", "valid: cola")),
    Mistake("glue_data_not_a_dir", _glue("--data", "nowhere"), ("--data nowhere",)),
    Mistake(
        "glue_data_dir_without_task",
        _glue("--data", MOVIES),
        ("SST-2/train.tsv: not found", "GLUE download layout"),
    ),
    Mistake(
        "glue_custom_missing_flags",
        ("glue", "--task", "custom", "--train", "t.tsv", "--workdir", "ft", *RANDOM),
        ("--task custom needs --dev, --text-columns, --label-column",),
    ),
    Mistake(
        "glue_custom_flag_on_glue_task",
        _glue("--label-column", "label"),
        ("--label-column", "only for --task custom"),
    ),
    Mistake("glue_missing_tsv", _custom(), ("train.tsv: no such file",)),
    Mistake(
        "glue_tsv_without_column",
        _custom(),
        ("train.tsv:1", "no column 'sentence'"),
        setup=_tsvs("text\tlabel\ngood\t1\nbad\t0\n"),
    ),
    Mistake(
        "glue_tsv_one_label",
        _custom(),
        ("train.tsv", "one label"),
        setup=_tsvs("sentence\tlabel\ngood\t1\nfine\t1\n"),
    ),
    Mistake(
        "glue_dev_without_usable_rows",
        _custom(),
        ("dev.tsv: no usable rows", "dev.tsv:2", "label 'maybe'"),
        setup=_tsvs(_GOOD_TSV, "sentence\tlabel\nso so\tmaybe\n"),
    ),
    Mistake(
        "glue_test_row_unreadable",
        _custom("--test", "test.tsv"),
        ("test.tsv:3: 2 fields, expected 1",),
        setup=lambda cwd: (
            _tsvs(_GOOD_TSV)(cwd),
            (cwd / "test.tsv").write_text("sentence\nfine\ntab\tinside\n"),
        ),
    ),
    # ------------------------------------------------------------------ glue: the encoder
    Mistake(
        "glue_missing_init",
        ("glue", "--task", "sst2", "--data", GLUE_DIR, "--workdir", "ft", "--init", "runs/none"),
        ("--init runs/none: no such checkpoint",),
    ),
    Mistake(
        "glue_init_not_a_checkpoint",
        ("glue", "--task", "sst2", "--data", GLUE_DIR, "--workdir", "ft", "--init", MOVIES),
        ("--init", "movie_snippets: not a checkpoint"),
    ),
    Mistake(
        "glue_random_without_tokenizer",
        ("glue", "--task", "sst2", "--data", GLUE_DIR, "--workdir", "ft", "--init", "random"),
        ("--init random needs --tokenizer",),
    ),
    Mistake("glue_unknown_preset", _glue("--preset", "huge"), ("--preset 'huge'", "valid:")),
    Mistake(
        "glue_missing_tokenizer",
        _glue("--tokenizer", "nope.model"),
        ("--tokenizer nope.model: no such file",),
    ),
    Mistake(
        "glue_init_without_tokenizer",
        ("glue", "--task", "sst2", "--data", GLUE_DIR, "--workdir", "ft", "--init", "{tiny_run}"),
        ("no tokenizer recorded", "--tokenizer"),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "glue_tokenizer_too_big",
        _glue("--init", "{tiny_run}"),
        ("--tokenizer", "8000 ids", "vocab_size is 1000"),
        fixtures=("tiny_run",),
    ),
    # ------------------------------------------------------------------ squad
    Mistake(
        "squad_malformed_json",
        _squad(),
        ("train.json:2: not valid JSON",),
        setup=_write("train.json", '{"data": [\n  {"paragraphs": [}\n]}'),
    ),
    Mistake(
        "squad_not_squad_json",
        _squad(),
        ('train.json: field "data" is missing',),
        setup=_write("train.json", '{"version": "1.1"}'),
    ),
    Mistake("squad_missing_train", _squad(), ("train.json: no such file",)),
    Mistake(
        "squad_no_usable_questions",
        _squad(),
        ("train.json: no usable questions", "question q1: answer_start 3"),
        setup=_write(
            "train.json",
            json.dumps(
                {
                    "data": [
                        {
                            "paragraphs": [
                                {
                                    "context": "The cat sat on the mat.",
                                    "qas": [
                                        {
                                            "id": "q1",
                                            "question": "Where?",
                                            "answers": [{"text": "the mat", "answer_start": 3}],
                                        }
                                    ],
                                }
                            ]
                        }
                    ]
                }
            ),
        ),
    ),
    Mistake(
        "squad_query_fills_window",
        _squad("--max-seq-len", "32"),
        ("--max-seq-len 32", "--max-query-length 64"),
        setup=_write("train.json", json.dumps(_SQUAD)),
    ),
    Mistake("squad_zero_doc_stride", _squad("--doc-stride", "0"), ("--doc-stride", ">= 1")),
    Mistake("squad_unknown_version", _squad("--version", "3.0"), ("--version", "'3.0'")),
    Mistake("squad_nan_threshold", _squad("--null-threshold", "nan"), ("--null-threshold",)),
    Mistake(
        "squad_init_is_a_file",
        _squad("--init", "train.json"),
        ("--init train.json: not a checkpoint",),
        setup=_write("train.json", json.dumps(_SQUAD)),
    ),
    # ------------------------------------------------------------------ ner
    Mistake("ner_zero_epochs", _ner("--epochs", "0"), ("--epochs", ">= 1")),
    Mistake("ner_dropout_one", _ner("--dropout", "1"), ("--dropout", "< 1")),
    Mistake("ner_seq_len_too_short", _ner("--max-seq-len", "2"), ("--max-seq-len", ">= 3")),
    Mistake("ner_missing_train", _ner(), ("train.txt: no such file",)),
    Mistake(
        "ner_packing_with_length_buckets",
        _ner("--packing", "--length-bucket", "16"),
        ("--length-bucket", "--packing fills --max-seq-len rows", "--no-packing"),
    ),
    Mistake(
        "squad_packing_with_max_lengths",
        _squad("--packing", "--max-lengths", "2"),
        ("--max-lengths", "--no-packing"),
    ),
    Mistake(
        "ner_malformed_conll",
        _ner(),
        ("train.txt: no sentences", "train.txt:1: one column 'EU'"),
        setup=_write("train.txt", "EU\nrejects\n\nGerman\n"),
    ),
    Mistake(
        "ner_bad_tag",
        _ner(),
        ("train.txt: no sentences", "train.txt:1: tag 'PER'"),
        setup=_write("train.txt", "John PER\n"),
    ),
    Mistake(
        "ner_eval_batch_does_not_split",
        _ner("--eval-batch-size", "4"),
        ("--eval-batch-size 4", "multiple of 8"),
    ),
    # ------------------------------------------------------------------ embed, retrieval
    Mistake(
        "embed_missing_input",
        ("embed", "--init", "{tiny_run}", "--input", "input.txt", "--output", "e.npy"),
        ("--input input.txt: no such file",),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "embed_output_suffix",
        ("embed", "--init", "{tiny_run}", "--input", "input.txt", "--output", "e.csv"),
        ("--output e.csv", ".npy"),
        setup=_write("input.txt", "a line\n"),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "retrieval_not_a_beir_directory",
        ("retrieval", "--init", "{tiny_run}", "--data", "nodir", "--workdir", "out"),
        ("--data nodir", "corpus.jsonl"),
        fixtures=("tiny_run",),
    ),
    # ------------------------------------------------------------------ extract
    Mistake(
        "extract_existing_output",
        ("extract", "--init", "{tiny_run}", "--input", "input.txt", "--output", "f.jsonl"),
        ("--output f.jsonl already exists", "--overwrite"),
        setup=lambda cwd: (_write("input.txt", "a line\n")(cwd), _write("f.jsonl", "{}\n")(cwd)),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "extract_existing_tokens_file",
        ("extract", "--init", "{tiny_run}", "--input", "input.txt", "--output", "f.npy"),
        ("f.tokens.jsonl", "already exists"),
        setup=lambda cwd: (_write("input.txt", "a\n")(cwd), _write("f.tokens.jsonl", "")(cwd)),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "extract_output_suffix",
        ("extract", "--init", "{tiny_run}", "--input", "input.txt", "--output", "f.txt"),
        ("--output f.txt", ".jsonl or .npy"),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "extract_missing_input",
        ("extract", "--init", "{tiny_run}", "--input", "input.txt", "--output", "f.jsonl"),
        ("--input input.txt: no such file",),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "extract_empty_input",
        ("extract", "--init", "{tiny_run}", "--input", "input.txt", "--output", "f.jsonl"),
        ("input.txt: empty",),
        setup=_write("input.txt", ""),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "extract_invalid_utf8",
        ("extract", "--init", "{tiny_run}", "--input", "input.txt", "--output", "f.jsonl"),
        ("input.txt:2: invalid UTF-8",),
        setup=lambda cwd: (cwd / "input.txt").write_bytes(b"fine\n\xff\xfe\n"),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "extract_zero_batch",
        ("extract", "--init", "x", "--input", "i", "--output", "f.npy", "--batch-size", "0"),
        ("--batch-size", ">= 1"),
    ),
    Mistake(
        "extract_random_init",
        ("extract", "--init", "random", "--input", "input.txt", "--output", "f.npy"),
        ("--init random",),
    ),
    Mistake(
        "extract_layer_out_of_range",
        (
            "extract",
            "--init",
            "{tiny_run}",
            "--tokenizer",
            "vocab.txt",
            "--input",
            "input.txt",
            "--output",
            "f.jsonl",
            "--layers",
            "-1,9",
        ),
        ("--layers: 9 is out of range",),
        setup=_small_vocab,
        fixtures=("tiny_run",),
    ),
    Mistake(
        "extract_vocab_alias_missing",
        (
            "extract",
            "--init",
            "{tiny_run}",
            "--vocab",
            "v.txt",
            "--input",
            "input.txt",
            "--output",
            "f.jsonl",
        ),
        ("--tokenizer v.txt: no such file",),
        setup=_write("input.txt", "a\n"),
        fixtures=("tiny_run",),
    ),
    # ------------------------------------------------------------------ convert
    Mistake(
        "convert_existing_output",
        ("convert", "--from", "hf", "{repo}/data", "--to", "bertjax", "out"),
        ("DST out already exists", "--overwrite"),
        setup=lambda cwd: (cwd / "out").mkdir(),
    ),
    Mistake(
        "convert_existing_file_output",
        ("convert", "--from", "hf", "{repo}/data", "--to", "hf", "out"),
        ("DST out already exists",),
        setup=_write("out", "not a model\n"),
    ),
    Mistake(
        "convert_missing_src",
        ("convert", "--from", "hf", "models/none", "--to", "bertjax", "out"),
        ("SRC models/none: no such file or directory",),
    ),
    Mistake(
        "convert_unknown_format",
        ("convert", "--from", "onnx", "{repo}/data", "--to", "hf", "out"),
        ("--from", "invalid choice: 'onnx'"),
    ),
    Mistake(
        "convert_not_hf_dir",
        ("convert", "--from", "hf", "{repo}/data", "--to", "bertjax", "out"),
        ("config.json: not found",),
    ),
    Mistake(
        "convert_not_google_dir",
        ("convert", "--from", "google", "{repo}/data", "--to", "hf", "out"),
        ("no bert_model.ckpt.index",),
    ),
    Mistake(
        "convert_not_bertjax_dir",
        ("convert", "--from", "bertjax", "{repo}/data", "--to", "hf", "out"),
        ("not a bertjax checkpoint",),
    ),
    Mistake(
        "convert_missing_bert_config",
        (
            "convert",
            "--from",
            "google",
            "{repo}/data",
            "--to",
            "hf",
            "out",
            "--bert-config",
            "c.json",
        ),
        ("--bert-config c.json: no such file",),
    ),
    Mistake(
        "convert_bert_config_not_google",
        ("convert", "--from", "hf", "{repo}/data", "--to", "hf", "out", "--bert-config", "c.json"),
        ("--bert-config", "only for --from google"),
    ),
    Mistake(
        "convert_into_its_source",
        (
            "convert",
            "--from",
            "bertjax",
            "{tiny_run}",
            "--to",
            "bertjax",
            "{tiny_run}",
            "--overwrite",
        ),
        ("holds SRC",),
        fixtures=("tiny_run",),
    ),
    Mistake(
        "convert_tokenizer_too_big",
        (
            "convert",
            "--from",
            "bertjax",
            "{tiny_run}",
            "--to",
            "hf",
            "out",
            "--tokenizer",
            "{tokenizer}",
        ),
        ("8000 pieces", "vocab_size is 1000"),
        fixtures=("tiny_run",),
    ),
]

# ------------------------------------------------------ malformed task files (schema checks)
ROWS += [
    Mistake(
        "squad_paragraphs_not_a_list",
        _squad(),
        ("train.json: data[0].paragraphs: expected a list, found the number 3",),
        setup=_write("train.json", '{"data": [{"title": "t", "paragraphs": 3}]}'),
    ),
    Mistake(
        "squad_article_not_an_object",
        _squad(),
        ("train.json: data[1]: expected an object, found the string", "SQuAD file"),
        setup=_write("train.json", json.dumps({"data": [_SQUAD["data"][0], "oops"]})),
    ),
    Mistake(
        "squad_context_missing",
        _squad(),
        ('train.json: data[0].paragraphs[0]: field "context" is missing',),
        setup=_write("train.json", '{"data": [{"paragraphs": [{"qas": []}]}]}'),
    ),
    Mistake(
        "glue_test_row_with_nul",
        _custom("--test", "test.tsv"),
        ("test.tsv:3: a NUL byte at column 4", "fix this row"),
        setup=lambda cwd: (
            _tsvs(_GOOD_TSV)(cwd),
            (cwd / "test.tsv").write_bytes(b"sentence\nfine\nbad\x00 row\n"),
        ),
    ),
    Mistake(
        "glue_dev_only_nul_rows",
        _custom(),
        ("dev.tsv: no usable rows (1 skipped", "dev.tsv:2: a NUL byte at column 3"),
        setup=lambda cwd: (
            _tsvs(_GOOD_TSV)(cwd),
            (cwd / "dev.tsv").write_bytes(b"sentence\tlabel\nok\x00\t1\n"),
        ),
    ),
    Mistake(
        "glue_tsv_header_not_utf8",
        _custom(),
        ("train.tsv:1: invalid UTF-8 (byte 0xff at column 1) in the header row",),
        setup=lambda cwd: (
            _tsvs(_GOOD_TSV)(cwd),
            (cwd / "train.tsv").write_bytes("sentence\tlabel\ngood\t1\n".encode("utf-16")),
        ),
    ),
    Mistake(
        "ner_only_undecodable_lines",
        _ner(),
        ("train.txt: no sentences", "train.txt:1: invalid UTF-8 (byte 0xe9 at column 4)"),
        setup=lambda cwd: (cwd / "train.txt").write_bytes(b"Jos\xe9 B-PER\n"),
    ),
]


# ---------------------------------------------------------------------- CLUE and CMRC 2018

_TNEWS = '{"label": "102", "label_desc": "news_entertainment", "sentence": "好看的电影"}\n'


def _clue_dir(test: str | None = None):
  """A CLUE TNEWS directory (train.json, dev.json and, given, test.json) in the cwd."""

  def setup(cwd: pathlib.Path) -> None:
    (cwd / "train.json").write_text(_TNEWS.replace("102", "103") + _TNEWS, encoding="utf-8")
    (cwd / "dev.json").write_text(_TNEWS, encoding="utf-8")
    if test is not None:
      (cwd / "test.json").write_text(test, encoding="utf-8")

  return setup


def _clue(*extra: str) -> tuple[str, ...]:
  return ("glue", "--task", "tnews", "--data", ".", "--workdir", "ft", *RANDOM, *extra)


ROWS += [
    Mistake(
        "clue_task_from_tfds",
        ("glue", "--task", "tnews", "--workdir", "ft", *RANDOM),
        ("--task tnews", "--data DIR", "train.json"),
    ),
    Mistake("clue_missing_train_json", _clue(), ("train.json: not found", "CLUE")),
    Mistake(
        "clue_test_line_unreadable",
        _clue(),
        ("test.json:2", "not valid JSON", "fix this line"),
        setup=_clue_dir('{"id": 0, "sentence": "电影"}\n{"id": 1, "sentence": "电影"\n'),
    ),
    Mistake(
        "clue_test_id_repeats",
        _clue(),
        ("test.json:2", "id 0", "line 1"),
        setup=_clue_dir('{"id": 0, "sentence": "电影"}\n{"id": 0, "sentence": "电视"}\n'),
    ),
    Mistake(
        "clue_dev_without_usable_lines",
        _clue(),
        ("dev.json: no usable rows", "dev.json:1", "label '105'"),
        setup=lambda cwd: (
            _clue_dir()(cwd),
            (cwd / "dev.json").write_text(_TNEWS.replace("102", "105"), encoding="utf-8"),
        ),
    ),
    Mistake(
        "clue_custom_columns_and_fields",
        _custom("--text-fields", "sentence"),
        ("--text-columns/--label-column", "--text-fields/--label-field"),
    ),
    Mistake(
        "clue_custom_json_with_tsv_flags",
        _custom("--train", "train.json"),
        ("--train train.json", "--text-fields and --label-field"),
    ),
    Mistake(
        "squad_test_question_unreadable",
        _squad("--test", "test.json"),
        ("test.json: question q9", 'no "question"', "every test question needs an answer"),
        setup=lambda cwd: (
            (cwd / "train.json").write_text(json.dumps(_SQUAD)),
            (cwd / "test.json").write_text(
                json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "q9"}]}]}]})
            ),
        ),
    ),
    Mistake(
        "squad_cmrc2018_with_v2",
        _squad("--metric", "cmrc2018", "--version", "2.0"),
        ("--metric cmrc2018", "--version 1.1"),
    ),
]
