"""Mistakes table rows (see test_mistakes.py) for the data commands: tokenizer, prepare, data."""

import pathlib

from mistakes_common import REPO, Mistake

# A few Austen sentences: enough to train a small tokenizer in a fraction of a second, far too
# few for 8,000 pieces.
_SENTENCES = "\n".join(
    [
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife.",
        "However little known the feelings or views of such a man may be on his first "
        "entering a neighbourhood, this truth is so well fixed in the minds of the "
        "surrounding families.",
        "Emma Woodhouse, handsome, clever, and rich, had lived nearly twenty-one years.",
        "Sir Walter Elliot never took up any book but the Baronetage.",
    ]
)


def _write(name: str, data: bytes):
  def setup(cwd: pathlib.Path) -> None:
    path = cwd / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)

  return setup


def _corpus_and(*more: tuple[str, bytes]):
  def setup(cwd: pathlib.Path) -> None:
    for name, data in (("corpus.txt", _SENTENCES.encode() + b"\n"), *more):
      _write(name, data)(cwd)

  return setup


_CORPUS = _corpus_and()


def _shards(cwd: pathlib.Path) -> None:
  """Prepared data in `shards/`, quietly: one train shard, no held-out split."""
  from bertjax.data import prepare

  # Each sentence its own document: a file of one document would be reported.
  (cwd / "corpus.txt").write_text(_SENTENCES.replace("\n", "\n\n") + "\n")
  prepare.prepare(
      prepare.PrepareConfig(
          output=str(cwd / "shards"),
          tokenizer=str(REPO / "data" / "tokenizer.model"),
          inputs=(str(cwd / "corpus.txt"),),
          num_shards=1,
          eval_fraction=0,
          processes=1,
          progress=False,
      )
  )


_TOK = ("--tokenizer", "{tokenizer}")
_PREPARE = ("prepare", "--input", "corpus.txt", *_TOK, "--output", "shards")
_TRAIN = ("tokenizer", "train", "--input", "corpus.txt", "--output", "tok/mine")
_PREVIEW = ("data", "preview", "--data", "shards")
_STATS = ("data", "stats", "--data", "shards")

ROWS: list[Mistake] = [
    # --- tokenizer --------------------------------------------------------------------------
    Mistake(
        "tokenizer_missing_input_glob",
        ("tokenizer", "train", "--input", "corpus/*.txt", "--output", "tok/mine"),
        ("corpus/*.txt", "no file matches"),
    ),
    Mistake(
        "tokenizer_empty_corpus",
        ("tokenizer", "train", "--input", "empty.txt", "--output", "tok/mine"),
        ("no text to train on", "empty.txt: empty file"),
        setup=_write("empty.txt", b""),
    ),
    Mistake(
        "tokenizer_existing_output",
        _TRAIN,
        ("tok/mine.model already exists", "--overwrite"),
        setup=_corpus_and(("tok/mine.model", b"old"), ("tok/mine.vocab", b"old")),
    ),
    Mistake(
        "tokenizer_vocab_too_large_for_corpus",
        (*_TRAIN, "--vocab-size", "8000"),
        ("--vocab-size 8000 is more than this corpus supports", "use --vocab-size <= "),
        setup=_CORPUS,
    ),
    Mistake(
        "tokenizer_zero_vocab",
        (*_TRAIN, "--vocab-size", "0"),
        ("--vocab-size", "'0' must be >= 1"),
        setup=_CORPUS,
    ),
    Mistake(
        "tokenizer_vocab_below_special_and_byte_pieces",
        (*_TRAIN, "--vocab-size", "100"),
        ("--vocab-size 100 is too small", ">= 271"),
        setup=_CORPUS,
    ),
    Mistake(
        "tokenizer_coverage_out_of_range",
        (*_TRAIN, "--character-coverage", "0.5"),
        ("--character-coverage 0.5", "between 0.98 and 1"),
        setup=_CORPUS,
    ),
    Mistake(
        "tokenizer_output_under_a_file",
        ("tokenizer", "train", "--input", "corpus.txt", "--output", "corpus.txt/mine"),
        ("--output corpus.txt/mine", "corpus.txt is a file"),
        setup=_CORPUS,
    ),
    Mistake(
        "tokenizer_missing_tokenizer",
        ("tokenizer", "encode", "--tokenizer", "tok/nowhere.model", "Emma"),
        ("tok/nowhere.model", "not found"),
    ),
    Mistake(
        "tokenizer_unknown_subcommand",
        ("tokenizer", "trian", "--input", "corpus.txt"),
        ("invalid choice: 'trian'", "train"),
    ),
    # --- prepare ----------------------------------------------------------------------------
    Mistake(
        "prepare_missing_input_glob",
        ("prepare", "--input", "corpus/*.txt", *_TOK, "--output", "shards"),
        ("corpus/*.txt", "no file matches"),
    ),
    Mistake(
        "prepare_empty_corpus",
        ("prepare", "--input", "empty.txt", *_TOK, "--output", "shards"),
        ("no document in the input", "empty.txt: empty file"),
        setup=_write("empty.txt", b""),
    ),
    Mistake(
        # Found only after reading the whole input: the output made for it is removed again.
        "prepare_corpus_of_blank_lines",
        ("prepare", "--input", "blank.txt", *_TOK, "--output", "out/shards")
        + ("--processes", "1", "--no-progress"),
        ("no document in the input", "blank.txt: file with only blank lines"),
        setup=_write("blank.txt", b"\n  \n\t\n\n"),
    ),
    Mistake(
        "prepare_missing_tokenizer",
        ("prepare", "--input", "corpus.txt", "--tokenizer", "tok/nowhere.model")
        + ("--output", "shards"),
        ("tok/nowhere.model", "not found"),
        setup=_CORPUS,
    ),
    Mistake(
        "prepare_existing_output",
        _PREPARE,
        ("--output shards already holds prepared data", "--overwrite"),
        setup=_corpus_and(("shards/metadata.json", b"{}")),
    ),
    Mistake(
        "prepare_zero_shards",
        (*_PREPARE, "--num-shards", "0"),
        ("--num-shards", "'0' must be >= 1"),
        setup=_CORPUS,
    ),
    Mistake(
        "prepare_negative_processes",
        (*_PREPARE, "--processes", "-2"),
        ("--processes", "'-2' must be >= 1"),
        setup=_CORPUS,
    ),
    Mistake(
        "prepare_eval_fraction_above_one",
        (*_PREPARE, "--eval-fraction", "1.5"),
        ("--eval-fraction", "'1.5' must be >= 0 and < 1"),
        setup=_CORPUS,
    ),
    Mistake(
        "prepare_worker_index_out_of_range",
        (*_PREPARE, "--worker-index", "2", "--num-workers", "2"),
        ("--worker-index 2 must be < --num-workers 2",),
        setup=_CORPUS,
    ),
    Mistake(
        "prepare_input_is_a_directory",
        ("prepare", "--input", "texts", *_TOK, "--output", "shards"),
        ("texts: is a directory", "texts/*.txt"),
        setup=_write("texts/a.txt", _SENTENCES.encode()),
    ),
    Mistake(
        "prepare_output_under_a_file",
        ("prepare", "--input", "corpus.txt", *_TOK, "--output", "corpus.txt/shards"),
        ("--output corpus.txt/shards", "corpus.txt is a file"),
        setup=_CORPUS,
    ),
    Mistake(
        "prepare_input_and_tfds",
        (*_PREPARE, "--tfds", "wikipedia"),
        ("--tfds", "not allowed with argument --input"),
        setup=_CORPUS,
    ),
    # --- data -------------------------------------------------------------------------------
    Mistake(
        "data_preview_not_prepared_data",
        ("data", "preview", "--data", "texts"),
        ("texts: no metadata.json", "bertjax prepare"),
        setup=_write("texts/a.txt", _SENTENCES.encode()),
    ),
    Mistake(
        "data_missing_directory",
        ("data", "stats", "--data", "nowhere"),
        ("--data nowhere: no such directory",),
    ),
    Mistake(
        "data_preview_zero_examples",
        (*_PREVIEW, "-n", "0"),
        ("-n/--n", "'0' must be >= 1"),
        setup=_shards,
    ),
    Mistake(
        "data_stats_examples_not_a_number",
        (*_STATS, "--n", "ten"),
        ("-n/--n", "'ten' is not an integer"),
        setup=_shards,
    ),
    Mistake(
        "data_stats_packing_negative_examples_per_row",
        (*_STATS, "--packing", "--max-examples-per-row", "-3"),
        ("--max-examples-per-row", "'-3' must be >= 0"),
        setup=_shards,
    ),
    Mistake(
        "data_seq_len_too_short",
        (*_STATS, "--seq-len", "4"),
        ("--seq-len 4 is too short for --pair-mode nsp", ">= 5"),
        setup=_shards,
    ),
    Mistake(
        "data_mask_prob_above_one",
        (*_STATS, "--mask-prob", "1.5"),
        ("--mask-prob", "'1.5' must be between 0 and 1"),
        setup=_shards,
    ),
    Mistake(
        "data_unknown_subcommand",
        ("data", "show", "--data", "shards"),
        ("invalid choice: 'show'", "preview"),
        setup=_shards,
    ),
]
