"""The flags glue/squad/ner share (bertjax/commands/finetune_args.py) and the encoder loader
they call (bertjax/tasks/encoder.py): ranges, the one --mesh spelling, flag-named messages."""

import argparse
import json

import pytest

from bertjax import errors
from bertjax.commands import args as args_lib
from bertjax.commands import finetune_args, glue
from bertjax.tasks import encoder as encoder_lib
from conftest import REPO

TOKENIZER = str(REPO / "data" / "tokenizer.model")


def _recipe_parser():
  p = args_lib.ArgumentParser(prog="bertjax glue")
  finetune_args.add_encoder_args(p)
  finetune_args.add_recipe_args(
      p, learning_rate=2e-5, epochs=3, max_seq_len=128, min_seq_len=(4, "pairs")
  )
  return p


def _args(*argv):
  return _recipe_parser().parse_args(["--init", "random", *argv])


@pytest.mark.parametrize(
    "flag,value,want",
    [
        ("--learning-rate", "-1", "> 0"),
        ("--learning-rate", "inf", "> 0"),
        ("--epochs", "0", ">= 1"),
        ("--batch-size", "0", ">= 1"),
        ("--eval-batch-size", "-8", ">= 1"),
        ("--warmup", "1", "< 1"),
        ("--weight-decay", "-0.1", ">= 0"),
        ("--dropout", "1.5", "< 1"),
        ("--seed", "-1", ">= 0"),
        ("--max-steps", "-1", ">= 0"),
        ("--length-bucket", "x", "not an integer"),
        ("--max-lengths", "-2", ">= 0"),
        ("--max-seq-len", "3", r">= 4 \(pairs\)"),
    ],
)
def test_every_numeric_flag_is_range_checked(flag, value, want):
  with pytest.raises(errors.UsageError, match=f"argument {flag}: '{value}'.*{want}"):
    _args(f"{flag}={value}")


def test_mesh_has_one_spelling_and_accepts_the_positional_one():
  assert finetune_args.mesh_of(_args("--mesh", "data=2,fsdp=-1")) == ((2, -1, 1), None)
  assert finetune_args.mesh_of(_args("--mesh", "1,-1,1")) == ((1, -1, 1), None)
  assert finetune_args.spell_mesh((1, -1, 1)) == "data=1,fsdp=-1,tensor=1"
  with pytest.raises(errors.ConfigError, match="--mesh 1,2: the positional form takes 3"):
    finetune_args.mesh_of(_args("--mesh", "1,2"))
  assert "data=1,fsdp=-1,tensor=1" in _recipe_parser().format_help()


def test_mesh_and_batch_sizes_are_checked_against_the_devices():
  finetune_args.check_recipe_args(_args("--mesh", "data=2,fsdp=4"))  # 8 devices
  with pytest.raises(errors.ConfigError, match=r"--mesh data=3: .* but there are 8 devices"):
    finetune_args.check_recipe_args(_args("--mesh", "data=3"))
  with pytest.raises(errors.ConfigError, match="--batch-size 12 does not split over the 8 batch"):
    finetune_args.check_recipe_args(_args("--batch-size", "12"))
  # tensor parallelism leaves 4 batch shards: 12 splits, an eval batch of 6 does not
  with pytest.raises(errors.ConfigError, match=r"--eval-batch-size 6 .* the 4 batch shards"):
    finetune_args.check_recipe_args(
        _args("--mesh", "data=-1,tensor=2", "--batch-size", "12", "--eval-batch-size", "6")
    )


def test_recipe_prints_the_mesh_it_picked(tmp_path, capsys):
  run = tmp_path / "run"
  (run / "checkpoints" / "3").mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"mesh": {"data": 2, "fsdp": -1, "tensor": 1}}))
  args = _recipe_parser().parse_args(["--init", str(run), "--learning-rate", "1e-3"])
  recipe = finetune_args.recipe_from_args(args, 128, "ner")
  assert recipe.mesh == (2, -1, 1)
  assert "ner: mesh data=2,fsdp=-1,tensor=1 (the pretraining mesh" in capsys.readouterr().out
  args = _recipe_parser().parse_args(["--init", str(run), "--mesh", "fsdp=-1"])
  assert finetune_args.recipe_from_args(args, 128, "ner").mesh == (1, -1, 1)
  assert "mesh" not in capsys.readouterr().out  # as given: nothing to announce


def test_encoder_messages_name_the_flags_the_caller_gives(tmp_path):
  flags = {"init": "--init", "tokenizer": "--vocab"}
  with pytest.raises(errors.ConfigError, match="^init random needs tokenizer"):
    encoder_lib.load_encoder("random")
  with pytest.raises(errors.ConfigError, match="^--init random needs --vocab"):
    encoder_lib.load_encoder("random", names=flags)
  with pytest.raises(errors.InputNotFoundError, match=r"^--init .*missing: no such checkpoint"):
    encoder_lib.load_encoder(str(tmp_path / "missing"), names=flags)
  with pytest.raises(errors.InputNotFoundError, match="^--vocab nope.txt: no such file"):
    encoder_lib.load_encoder("random", "nope.txt", names=flags)
  with pytest.raises(errors.ConfigError, match="^preset 'huge' is neither a model preset"):
    encoder_lib.load_encoder("random", TOKENIZER, "huge")
  (tmp_path / "notes.txt").write_text("not a model")
  for path in (tmp_path, tmp_path / "notes.txt"):
    with pytest.raises(errors.BadInputError, match=f"^--init {path}: not a checkpoint"):
      encoder_lib.load_encoder(str(path), names=flags)
    with pytest.raises(errors.BadInputError, match="not a bertjax checkpoint"):
      encoder_lib.load_bertjax(path)
  assert encoder_lib.load_encoder("random", TOKENIZER).config.vocab_size == 8000


def test_checkpoint_kinds(tmp_path):
  assert encoder_lib.checkpoint_kind(tmp_path) is None
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("{}")
  assert encoder_lib.checkpoint_kind(tmp_path / "hf") == "hf"
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text("{}")  # a pretrain workdir's training config: not HF
  assert encoder_lib.checkpoint_kind(run) == "bertjax"
  (run / "checkpoints" / "300").mkdir()
  assert encoder_lib.checkpoint_kind(run / "checkpoints") == "bertjax"
  (tmp_path / "g").mkdir()
  (tmp_path / "g" / "bert_model.ckpt.index").write_text("")
  assert encoder_lib.checkpoint_kind(tmp_path / "g") == "google"
  assert encoder_lib.checkpoint_kind(tmp_path / "g" / "bert_model.ckpt") == "google"


def test_glue_flags_that_only_make_sense_together():
  parse = glue._parser().parse_args
  base = ["--task", "sst2", "--init", "random", "--workdir", "out"]
  assert parse([*base, "--sweep", "--seeds", "3"]).seeds == [0, 1, 2]
  assert parse([*base, "--sweep", "--seeds", "0,7"]).seeds == [0, 7]
  assert parse([*base, "--sweep", "--learning-rates", "1e-3, 3e-4"]).learning_rates == [1e-3, 3e-4]
  with pytest.raises(errors.UsageError, match="argument --learning-rates: '-1e-3' must be"):
    parse([*base, "--sweep", "--learning-rates", "1e-3,-1e-3"])
  with pytest.raises(errors.UsageError, match="argument --seeds: '-1' must be >= 0"):
    parse([*base, "--sweep", "--seeds", "1,-1"])
  with pytest.raises(errors.ConfigError, match="--learning-rates: only with --sweep"):
    glue._check_flags(parse([*base, "--learning-rates", "1e-3"]))
  with pytest.raises(errors.ConfigError, match="--train, --regression: only for --task custom"):
    glue._check_flags(parse([*base, "--train", "t.tsv", "--regression"]))
  with pytest.raises(errors.ConfigError, match="--learning-rate: a --sweep runs the grid"):
    glue._check_flags(parse([*base, "--sweep", "--learning-rate", "1e-3"]))
  glue._check_flags(parse([*base, "--sweep", "--seeds", "2"]))
  with pytest.raises(errors.ConfigError, match="--task 'qa' is not a task"):
    glue._task_list(argparse.Namespace(task="qa"))
