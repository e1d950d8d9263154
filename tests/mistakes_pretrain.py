"""Mistakes table rows (see test_mistakes.py) for `bertjax pretrain` and `bertjax demo`.

Every row names a workdir (`w`) that must not be created: the checks run before it is.
"""

import json
import pathlib

from mistakes_common import Mistake

RUN = ("--workdir", "w")
SYNTH = ("--config", "tiny", *RUN, "--config.data.source=synthetic")


def _file(name: str):
  def setup(cwd: pathlib.Path) -> None:
    (cwd / name).write_text("not a directory\n")

  return setup


def _empty_prepared(cwd: pathlib.Path) -> None:
  """What `bertjax prepare` writes for a corpus with no text: metadata and no shard."""
  (cwd / "shards").mkdir()
  meta = {
      "documents": 0,
      "examples_of_problems": ["empty.txt: empty file"],
      "format_version": 1,
      "inputs": ["empty.txt"],
      "num_workers": 1,
      "shards": [],
      "tokenizer": {"file": "tokenizer.model", "type": "sentencepiece", "vocab_size": 8000},
      "worker_index": 0,
  }
  (cwd / "shards" / "metadata.json").write_text(json.dumps(meta))


ROWS: list[Mistake] = [
    # --- the recipe -----------------------------------------------------------------------
    Mistake("pretrain_no_config", ("pretrain", *RUN), ("--config is required", "--config tiny")),
    Mistake(
        "pretrain_unknown_variant",
        ("pretrain", "--config", "tinyy", *RUN),
        ("variants: demo, tiny", "did you mean tiny?"),
    ),
    Mistake(
        "pretrain_unknown_variant_in_file",
        ("pretrain", "--config", "experiments/pretrain.py:huge", *RUN),
        ("unknown variant 'huge'", "valid: demo, tiny", "large_lamb"),
    ),
    Mistake(
        "pretrain_unknown_recipe_file",
        ("pretrain", "--config", "experiments/nope.py:tiny", *RUN),
        ("no config file experiments/nope.py", "pretrain.py, ", "no_nsp.py"),
    ),
    Mistake(
        "pretrain_config_file_without_get_config",
        ("pretrain", "--config", "mine.py:tiny", *RUN),
        ("--config mine.py:tiny", "defines no get_config"),
        setup=lambda cwd: (cwd / "mine.py").write_text("STEPS = 3\n"),
    ),
    # --- config fields ----------------------------------------------------------------------
    Mistake(
        "pretrain_key_typo",
        ("pretrain", *SYNTH, "--config.train.stepz=3"),
        ("config.train has no field 'stepz'", "did you mean config.train.steps?"),
    ),
    Mistake(
        "pretrain_section_typo",
        ("pretrain", *SYNTH, "--config.trian.steps=3"),
        ("config has no field 'trian'", "config.train?"),
    ),
    Mistake(
        "pretrain_wrong_type",
        ("pretrain", *SYNTH, "--config.train.batch_size=big"),
        ("--config.train.batch_size=big", "takes an integer"),
    ),
    Mistake(
        "pretrain_zero_steps",
        ("pretrain", *SYNTH, "--config.train.steps=0"),
        ("config.train.steps=0", "an integer >= 1"),
    ),
    Mistake(
        "pretrain_negative_warmup",
        ("pretrain", *SYNTH, "--config.train.warmup_steps=-5"),
        ("config.train.warmup_steps=-5", ">= 0"),
    ),
    Mistake(
        "pretrain_negative_learning_rate",
        ("pretrain", *SYNTH, "--config.train.learning_rate=-1"),
        ("config.train.learning_rate=-1.0", "> 0"),
    ),
    Mistake(
        "pretrain_nan_learning_rate",
        ("pretrain", *SYNTH, "--config.train.learning_rate=nan"),
        ("config.train.learning_rate=nan", "finite number > 0"),
    ),
    Mistake(
        "pretrain_mask_prob_above_one",
        ("pretrain", *SYNTH, "--config.data.mask_prob=1.5"),
        ("config.data.mask_prob=1.5", "in (0, 1]"),
    ),
    Mistake(
        "pretrain_dropout_of_one",
        ("pretrain", *SYNTH, "--config.model.hidden_dropout_rate=1"),
        ("config.model.hidden_dropout_rate=1.0", "in [0, 1)"),
    ),
    Mistake(
        "pretrain_seq_len_beyond_positions",
        ("pretrain", *SYNTH, "--config.data.seq_len=1024"),
        ("config.data.seq_len=1024", "config.model.max_position_embeddings=512"),
    ),
    Mistake(
        "pretrain_prediction_budget_beyond_row",
        (
            "pretrain",
            *SYNTH,
            "--config.data.seq_len=16",
            "--config.data.max_predictions_per_seq=20",
        ),
        (
            "config.data.max_predictions_per_seq=20 exceeds config.data.seq_len=16",
            "config.data.max_predictions_per_seq=3",
        ),
    ),
    Mistake(
        "pretrain_batch_not_divisible",
        ("pretrain", *SYNTH, "--config.train.batch_size=33"),
        ("config.train.batch_size=33", "multiple of 8"),
    ),
    Mistake(
        "pretrain_eval_batch_not_divisible",
        ("pretrain", *SYNTH, "--config.eval.batch_size=12"),
        ("config.eval.batch_size=12", "multiple of 8"),
    ),
    # --- inputs and outputs ------------------------------------------------------------------
    Mistake(
        "pretrain_missing_data_path",
        ("pretrain", "--config", "tiny", *RUN, "--config.data.path=nowhere"),
        ("config.data.path=nowhere", "no such directory", "bertjax prepare"),
    ),
    Mistake(
        "pretrain_empty_prepared_data",
        ("pretrain", "--config", "tiny", *RUN, "--config.data.path=shards"),
        ("config.data.path=shards", "no training documents", "non-empty corpus"),
        setup=_empty_prepared,
    ),
    Mistake(
        "pretrain_vocab_differs_from_the_data",
        (
            "pretrain",
            "--config",
            "tiny",
            *RUN,
            "--config.data.path={austen_shards}",
            "--config.model.vocab_size=1000",
        ),
        ("config.model.vocab_size=1000", "vocab_size=8000", "drop the override"),
        fixtures=("austen_shards",),
    ),
    Mistake(
        "pretrain_source_without_weight",
        ("pretrain", "--config", "tiny", *RUN, "--config.data.sources=web={austen_shards}"),
        ("config.data.sources", "has no weight", "NAME=PATH:WEIGHT"),
        fixtures=("austen_shards",),
    ),
    Mistake(
        "pretrain_sources_beside_data_path",
        (
            "pretrain",
            "--config",
            "tiny",
            *RUN,
            "--config.data.path={austen_shards}",
            "--config.data.sources=web={austen_shards}:1",
        ),
        ("config.data.path and config.data.sources are both set", "unset one"),
        fixtures=("austen_shards",),
    ),
    Mistake(
        "pretrain_missing_source",
        (
            "pretrain",
            "--config",
            "tiny",
            *RUN,
            "--config.data.sources=web={austen_shards}:0.5,books=nowhere:0.5",
        ),
        ("config.data.sources (books): nowhere: no such directory", "bertjax prepare"),
        fixtures=("austen_shards",),
    ),
    Mistake(
        "pretrain_missing_tokenizer",
        ("pretrain", *SYNTH, "--config.data.tokenizer=nowhere.model"),
        ("config.data.tokenizer=nowhere.model", "no such file"),
    ),
    Mistake(
        "pretrain_init_missing",
        ("pretrain", *SYNTH, "--init", "nowhere"),
        ("config.train.init_from=nowhere", "no such file or directory", "transformers directory"),
    ),
    Mistake(
        "pretrain_init_and_init_from_differ",
        ("pretrain", *SYNTH, "--init", "a", "--config.train.init_from=b"),
        ("--init a and --config.train.init_from=b differ", "give one of them"),
    ),
    Mistake(
        "pretrain_missing_init_from",
        ("pretrain", *SYNTH, "--config.train.init_from=nowhere"),
        ("config.train.init_from=nowhere", "no such file or directory"),
    ),
    Mistake(
        "pretrain_init_from_another_model",
        (
            "pretrain",
            *SYNTH,
            "--config.model.vocab_size=1000",
            "--config.model.preset=mini",
            "--config.train.init_from={tiny_run}",
        ),
        ("config.train.init_from=", "hidden_size=128", "256"),
        fixtures=("tiny_run",),
    ),
    Mistake("pretrain_no_workdir", ("pretrain", "--config", "tiny"), ("--workdir is required",)),
    Mistake(
        "pretrain_workdir_is_a_file",
        ("pretrain", *SYNTH),
        ("w: exists and is not a directory",),
        setup=_file("w"),
    ),
    Mistake(
        "pretrain_process_id_out_of_range",
        (
            "pretrain",
            *SYNTH,
            "--coordinator-address",
            "localhost:1234",
            "--num-processes",
            "2",
            "--process-id",
            "2",
        ),
        ("--process-id 2", "below --num-processes 2"),
    ),
    Mistake(
        "pretrain_multihost_flags_incomplete",
        ("pretrain", *SYNTH, "--num-processes", "2"),
        ("--coordinator-address, --process-id missing",),
    ),
    Mistake(
        "pretrain_flag_value_not_a_number",
        ("pretrain", *SYNTH, "--num_processes=two"),
        ("--num-processes=two",),
    ),
    # --- demo ----------------------------------------------------------------------------------
    Mistake("demo_zero_steps", ("demo", "--steps", "0", *RUN), ("--steps", ">= 1")),
    Mistake("demo_unknown_flag", ("demo", "--stepz", "3", *RUN), ("--stepz", "--help")),
    Mistake(
        "demo_workdir_is_a_file",
        ("demo", *RUN),
        ("--workdir w: exists and is not a directory",),
        setup=_file("w"),
    ),
]
