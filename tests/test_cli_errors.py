"""`bertjax` user errors: one line naming the field and the fix, exit 2, no traceback, nothing
written; `BERTJAX_DEBUG=1` / `--debug` show the traceback; one help style; quiet start-up."""

import argparse
import importlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from bertjax import cli, errors
from bertjax.commands import args as args_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = "experiments/pretrain.py"


def _env(**extra) -> dict:
  env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      PYTHONPATH=str(REPO),
      XLA_FLAGS="--xla_force_host_platform_device_count=8",
  )
  env.update(extra)
  if "BERTJAX_DEBUG" not in extra:
    env.pop("BERTJAX_DEBUG", None)
  return env


def _bertjax(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "-m", "bertjax.cli", *map(str, args)],
      cwd=REPO,
      env=env or _env(),
      capture_output=True,
      text=True,
      timeout=timeout,
  )


def _assert_one_line(r: subprocess.CompletedProcess, command: str, *needles: str) -> str:
  assert r.returncode == 2, (r.returncode, r.stderr)
  assert "Traceback" not in r.stderr, r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1, r.stderr
  assert lines[0].startswith(f"bertjax {command}: "), lines[0]
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  return lines[0]


# (overrides after `--config FILE:tiny --workdir W --config.data.source=synthetic`, needles)
PRETRAIN_ERRORS = {
    "typo_key": (
        ["--config.train.stepz=100"],
        ["--config.train.stepz", "config.train.steps?", "valid keys of config.train", "batch_size"],
    ),
    "typo_section": (["--config.trian.steps=3"], ["'trian'", "config.train?", "eval"]),
    "steps_zero": (["--config.train.steps=0"], ["config.train.steps=0", "an integer >= 1"]),
    "steps_zero_spaced": (["--config.train.steps", "0"], ["config.train.steps=0", ">= 1"]),
    "steps_not_int": (
        ["--config.train.steps=abc"],
        ["--config.train.steps=abc", "takes an integer", "2000"],
    ),
    "batch_zero": (["--config.train.batch_size=0"], ["config.train.batch_size=0", ">= 1"]),
    "batch_indivisible": (
        ["--config.train.batch_size=33"],
        ["config.train.batch_size=33", "8 batch shards", "multiple of 8"],
    ),
    "eval_every_negative": (
        ["--config.eval.every_steps=-1"],
        ["config.eval.every_steps=-1", ">= 0"],
    ),
    "eval_steps_negative": (["--config.eval.steps=-2"], ["config.eval.steps=-2", ">= 0"]),
    "bad_bool": (["--config.tensorboard=maybe"], ["config.tensorboard", "true or false"]),
    "bad_choice": (
        ["--config.train.optimizer=sgd"],
        ["config.train.optimizer='sgd'", "adamw, lamb"],
    ),
    "bad_preset": (["--config.model.preset=huge"], ["config.model", "'huge'", "tiny"]),
    "phase2_fraction": (["--config.phase2.fraction=1.0"], ["config.phase2.fraction=1.0", "[0, 1)"]),
    "unknown_flag": (["--workdirr=x"], ["workdirr", "workdir"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(PRETRAIN_ERRORS))
def test_pretrain_user_error_is_one_line_and_writes_nothing(case, tmp_path):
  overrides, needles = PRETRAIN_ERRORS[case]
  workdir = tmp_path / "run"
  r = _bertjax(
      "pretrain",
      "--config",
      f"{CONFIG}:tiny",
      "--workdir",
      workdir,
      "--config.data.source=synthetic",
      *overrides,
  )
  _assert_one_line(r, "pretrain", *needles)
  assert not workdir.exists()


@pytest.mark.parametrize(
    "args, needles",
    [
        (
            [f"--config={CONFIG}:tinyy"],
            [
                "unknown variant 'tinyy'",
                "valid: demo, tiny, mini",
                "base_lamb, large_lamb",
                "did you mean tiny?",
            ],
        ),
        (
            ["--config", "experiments/nope.py:tiny"],
            ["no config file experiments/nope.py", "pretrain.py, ", "--config tiny"],
        ),
        ([], ["--config is required", "--config tiny", "base_lamb"]),
        ([f"--config={CONFIG}:tiny"], ["--workdir is required"]),
    ],
)
@pytest.mark.process
def test_pretrain_config_and_workdir_errors(args, needles, tmp_path):
  workdir = tmp_path / "run"
  extra = ["--workdir", workdir] if "--workdir is required" not in needles else []
  r = _bertjax("pretrain", *args, *extra)
  _assert_one_line(r, "pretrain", *needles)
  assert not workdir.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needles",
    [
        (["--config.train.stepz=1"], ["config.train.steps?"]),
        (["--mesh", "data=x"], ["--mesh data=x", "not an integer"]),
        (["--mesh", "pipe=2"], ["unknown axis 'pipe'", "fsdp"]),
        (["--devicez", "8"], ["devicez", "devices"]),
        (
            ["--config.train.batch_size=33", "--devices", "8"],
            ["config.train.batch_size=33", "multiple of 8"],
        ),
    ],
)
def test_compile_user_errors(args, needles):
  r = _bertjax("compile", "--config", f"{CONFIG}:tiny", *args)
  _assert_one_line(r, "compile", *needles)


@pytest.mark.process
@pytest.mark.parametrize("how", ["env", "flag"])
def test_debug_shows_the_traceback(how, tmp_path):
  args = [
      "pretrain",
      "--config",
      f"{CONFIG}:tiny",
      "--workdir",
      tmp_path / "run",
      "--config.train.steps=0",
  ]
  if how == "env":
    r = _bertjax(*args, env=_env(BERTJAX_DEBUG="1"))
  else:
    r = _bertjax(*args, "--debug")
  assert r.returncode != 0
  assert "Traceback (most recent call last)" in r.stderr
  assert "ConfigError: config.train.steps=0" in r.stderr
  assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- in-process


class _Raises:

  def __init__(self, error: BaseException):
    self.error = error

  def main(self, argv):
    raise self.error


def test_the_message_is_the_exceptions_own(monkeypatch, capsys):
  monkeypatch.delenv("BERTJAX_DEBUG", raising=False)
  monkeypatch.setattr(
      cli, "_load", lambda name: _Raises(errors.ConfigError("config.x=1: bad\nset 2"))
  )
  assert cli.main(["tokenizer"]) == 2
  assert capsys.readouterr().err == "bertjax tokenizer: config.x=1: bad set 2\n"
  monkeypatch.setattr(
      cli, "_load", lambda name: _Raises(errors.InputNotFoundError("data/x: no such file"))
  )
  assert cli.main(["tokenizer"]) == 2
  assert capsys.readouterr().err == "bertjax tokenizer: data/x: no such file\n"


@pytest.mark.parametrize(
    "error",
    [
        KeyError(0),
        KeyError("params"),
        RuntimeError("boom"),
        TypeError("unsupported operand"),
        ValueError("a bug, not a user's mistake"),
        FileNotFoundError("a bug too"),
    ],
)
def test_bugs_are_not_swallowed(monkeypatch, error):
  monkeypatch.delenv("BERTJAX_DEBUG", raising=False)
  monkeypatch.setattr(cli, "_load", lambda name: _Raises(error))
  with pytest.raises(type(error)):
    cli.main(["tokenizer"])


# ----------------------------------------------------------------------------- help


def _variants() -> dict[str, str]:
  spec = importlib.util.spec_from_file_location("_pretrain_config", REPO / CONFIG)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.VARIANTS


@pytest.mark.slow
@pytest.mark.parametrize("command", ["pretrain", "compile"])
def test_config_command_help_lists_variants_and_flags(command):
  r = _bertjax(command, "--help")
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith(f"usage: bertjax {command} --config")
  # Each variant on its own line with its one-line description, in the file's order.
  listed = re.findall(r"^  (\w+) +(\S.*)$", r.stdout.split("variants of")[1], re.M)
  names = list(_variants())
  assert [name for name, _ in listed[: len(names)]] == names
  for name, text in listed[: len(names)]:
    assert _variants()[name].startswith(text.strip()), name
  out = " ".join(r.stdout.split())
  for flag in ["--config VARIANT|FILE:VARIANT", "--config.SECTION.KEY=VALUE", "--debug"]:
    assert flag in out
  assert "no_nsp.py" in out  # the other shipped recipe files
  if command == "compile":
    assert "--devices N" in out and "(default: the mesh's size, or 8)" in out
  else:
    for flag in ("--workdir DIR", "--coordinator-address HOST:PORT", "--num-processes N"):
      assert flag in out
    assert "--process-id I" in out and "--coordinator_address HOST:PORT" not in out
  assert "--helpfull" not in out and "absl.flags" not in out  # not absl's wall of flags


@pytest.mark.process
def test_pretrain_help_with_a_config_lists_its_fields_and_values():
  r = _bertjax("pretrain", "--config", f"{CONFIG}:demo", "--help")
  assert r.returncode == 0, r.stderr
  assert "  train.steps = 2000\n" in r.stdout and "  data.source = 'prepared'\n" in r.stdout


def _parsers(p: argparse.ArgumentParser, name: str):
  yield name, p
  for action in p._actions:
    if isinstance(action, argparse._SubParsersAction):
      for sub, sp in action.choices.items():
        yield from _parsers(sp, f"{name} {sub}")


@pytest.mark.parametrize(
    "command",
    [
        "tokenizer",
        "prepare",
        "data",
        "convert",
        "extract",
        "embed",
        "retrieval",
        "bench",
        "squad",
        "ner",
    ],
)
def test_argparse_help_shows_defaults(command):
  mod = importlib.import_module(f"bertjax.commands.{command}")
  shown = 0
  for name, p in _parsers(mod._parser(), f"bertjax {command}"):
    assert p.formatter_class is args_lib.HelpFormatter, name
    text = " ".join(p.format_help().split())
    for a in p._actions:
      if not a.option_strings or a.required or a.help is argparse.SUPPRESS:
        continue
      if "default" in (a.help or ""):  # the help says it in words
        shown += 1
      elif a.default not in (None, "", argparse.SUPPRESS) and a.default is not False:
        assert f"(default: {a.default})" in text, (name, a.option_strings)
        shown += 1
  assert shown, command  # at least one default per command, so the checks above ran


# ----------------------------------------------------------------------------- quiet start-up


@pytest.mark.slow
def test_tensorflow_cuda_lines_are_silenced(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text((REPO / "data" / "austen.txt").read_text()[:20000])
  r = _bertjax(
      "prepare",
      "--input",
      corpus,
      "--tokenizer",
      REPO / "data" / "tokenizer.model",
      "--output",
      tmp_path / "data",
      "--processes",
      1,
      "--num-shards",
      1,
      "--no-progress",
  )
  assert r.returncode == 0, r.stderr
  stats = ["data", "stats", "--data", tmp_path / "data", "--n", 10, "--reader", "tf.data"]
  control = _bertjax(*stats, env=_env(TF_CPP_MIN_LOG_LEVEL="0"))  # the opt-out shows them
  assert control.returncode == 0, control.stderr
  if "Could not find cuda drivers" not in control.stderr:
    pytest.skip("this machine's TensorFlow finds CUDA drivers: no such line to silence")
  for level in ("3", "2"):  # cli's default, and the tests'
    r = _bertjax(*stats, env=_env(TF_CPP_MIN_LOG_LEVEL=level))
    assert r.returncode == 0, r.stderr
    assert '"examples": 10' in r.stdout
    assert "cuda drivers" not in r.stderr and "InitializeLog" not in r.stderr, r.stderr


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory):
  """A one-step `bertjax pretrain` workdir (tiny model, synthetic data, adamw)."""
  workdir = tmp_path_factory.mktemp("cli_errors") / "run"
  r = _bertjax(*_small_run(workdir), env=_env(XLA_FLAGS=""))
  assert r.returncode == 0, r.stderr
  return workdir


def _small_run(workdir) -> list:
  return [
      "pretrain",
      "--config",
      f"{CONFIG}:tiny",
      "--workdir",
      workdir,
      "--config.data.source=synthetic",
      "--config.model.vocab_size=100",
      "--config.data.seq_len=16",
      "--config.data.max_predictions_per_seq=2",
      "--config.train.batch_size=8",
      "--config.train.steps=1",
      "--config.eval.every_steps=0",
      "--config.tensorboard=false",
  ]


@pytest.mark.slow
def test_resume_mismatch_is_one_line(trained_workdir):
  before = sorted(p.name for p in (trained_workdir / "checkpoints").iterdir())
  r = _bertjax(
      *_small_run(trained_workdir),
      "--config.train.steps=2",
      "--config.train.optimizer=lamb",
      env=_env(XLA_FLAGS=""),
  )
  _assert_one_line(
      r, "pretrain", "config.train.optimizer='adamw'", "'lamb'", "--config.train.init_from="
  )
  r = _bertjax(
      *_small_run(trained_workdir),
      "--config.train.steps=2",
      "--config.model.preset=mini",
      env=_env(XLA_FLAGS=""),
  )
  _assert_one_line(r, "pretrain", "config.model.hidden_size=128", "256", "new --workdir")
  assert sorted(p.name for p in (trained_workdir / "checkpoints").iterdir()) == before


@pytest.mark.slow
def test_checkpoint_load_has_no_orbax_metadata_warning(trained_workdir, tmp_path):
  code = "from bertjax.training import pretrained; import sys; "
  code += "pretrained.load_pretrained(sys.argv[1])"
  control = subprocess.run(
      [sys.executable, "-c", code, str(trained_workdir)],
      cwd=REPO,
      env=_env(XLA_FLAGS=""),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert control.returncode == 0, control.stderr
  if "_CHECKPOINT_METADATA" not in control.stderr:
    pytest.skip("this orbax does not warn about the step metadata: nothing to silence")
  r = _bertjax(
      "convert",
      "--from",
      "bertjax",
      trained_workdir,
      "--to",
      "bertjax",
      tmp_path / "out",
      env=_env(XLA_FLAGS=""),
  )
  assert r.returncode == 0, r.stderr
  assert (tmp_path / "out" / "pretrained.json").exists()
  assert "_CHECKPOINT_METADATA" not in r.stderr, r.stderr
