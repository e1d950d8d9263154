"""`--config` finds the shipped recipes from any working directory: by bare variant name, by
`experiments/pretrain.py:VARIANT` and by file name; a file where the user stands wins; the
command prints which file and variant it read."""

import os
import pathlib
import subprocess
import sys

import pytest

from bertjax import errors
from bertjax.commands import pretrain

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = REPO / "experiments"


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
  """A working directory with no experiments/ in it."""
  monkeypatch.chdir(tmp_path)
  return tmp_path


def test_the_shipped_recipes_are_the_installed_experiments_package():
  import importlib.util

  assert pretrain.shipped_dir() == SHIPPED
  spec = importlib.util.find_spec("experiments.pretrain")  # what a plain `pip install` ships
  assert pathlib.Path(spec.origin).resolve() == SHIPPED / "pretrain.py"
  assert pretrain.recipe_files()[0] == "pretrain.py"
  assert {"no_nsp.py", "sop.py", "layers.py", "size.py"} <= set(pretrain.recipe_files())
  assert "ablate.py" not in pretrain.recipe_files()  # a script, not a get_config file


@pytest.mark.parametrize(
    "spec, file, arg, shown",
    [
        ("base", "pretrain.py", "base", "experiments/pretrain.py:base"),
        ("experiments/pretrain.py:tiny", "pretrain.py", "tiny", "experiments/pretrain.py:tiny"),
        ("pretrain.py:demo", "pretrain.py", "demo", "experiments/pretrain.py:demo"),
        ("experiments/pretrain.py", "pretrain.py", None, "experiments/pretrain.py"),
        ("no_nsp.py:mini", "no_nsp.py", "mini", "experiments/no_nsp.py:mini"),
        ("sop:tiny", "sop.py", "tiny", "experiments/sop.py:tiny"),
    ],
)
def test_a_recipe_resolves_from_another_directory(elsewhere, spec, file, arg, shown):
  recipe = pretrain.resolve(spec)
  assert recipe.path == SHIPPED / file and recipe.arg == arg and recipe.shipped
  assert recipe.shown == shown
  config = pretrain.load_config(recipe)
  assert config.variant.endswith(arg or "tiny")  # get_config's default variant is tiny


def test_a_file_where_the_user_stands_wins(elsewhere):
  mine = elsewhere / "experiments" / "pretrain.py"
  mine.parent.mkdir()
  mine.write_text(
      "import ml_collections\n"
      "def get_config(arg='x'):\n"
      "  return ml_collections.ConfigDict({'variant': 'mine/' + arg})\n"
  )
  recipe = pretrain.resolve("experiments/pretrain.py:base")
  assert recipe.path == pathlib.Path("experiments/pretrain.py") and not recipe.shipped
  assert pretrain.load_config(recipe).variant == "mine/base"
  assert pretrain.resolve("base").shipped  # a bare name is always the shipped recipe's
  assert recipe.source_line() == (
      "config: experiments/pretrain.py:base (local file: experiments/pretrain.py)"
  )


def test_the_source_line_names_the_shipped_file(elsewhere):
  line = pretrain.resolve("base").source_line()
  prefix = "config: experiments/pretrain.py:base (shipped with bertjax: "
  assert line.startswith(prefix) and line.endswith(")")
  assert pathlib.Path(line[len(prefix) : -1]).resolve() == SHIPPED / "pretrain.py"
  line = pretrain.resolve("experiments/pretrain.py").source_line("tiny")
  assert line.startswith("config: experiments/pretrain.py (its default variant tiny; shipped")


def test_parse_prints_what_it_read_and_accepts_dashed_flags(elsewhere, capsys):
  fv = pretrain.parse(
      [
          "--config",
          "base",
          "--workdir",
          "w",
          "--num-processes",
          "2",
          "--process_id=1",
          "--coordinator-address=host:1234",
          "--config.train.steps=7",
      ],
      "bertjax pretrain",
  )
  assert fv.config.variant == "base" and fv.config.train.steps == 7
  assert (fv.num_processes, fv.process_id, fv.coordinator_address) == (2, 1, "host:1234")
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 1 and out[0].startswith("config: experiments/pretrain.py:base (shipped")
  assert not (elsewhere / "w").exists()


@pytest.mark.parametrize(
    "spec, error, needles, bad",
    [
        ("tinyy", errors.ConfigError, ["variants: demo, tiny", "did you mean tiny?"], "tinyy"),
        (
            "experiments/pretrain.py:bsae",
            errors.ConfigError,
            ["unknown variant 'bsae'", "valid: demo, tiny", "did you mean base?"],
            "bsae",
        ),
        (
            "experiments/nope.py:tiny",
            errors.InputNotFoundError,
            ["no config file experiments/nope.py", "pretrain.py, ", "no_nsp.py", "--config tiny"],
            "nope",
        ),
    ],
)
def test_a_wrong_recipe_lists_the_valid_ones(elsewhere, spec, error, needles, bad):
  with pytest.raises(error) as e:
    pretrain.load_config(spec)
  message = str(e.value)
  for needle in needles:
    assert needle in message, (needle, message)
  what, fix = message.split(" — ", 1)
  assert bad in what and bad not in fix, message  # the fix never repeats the mistake


def test_a_shipped_files_own_argument_error_names_the_recipe(elsewhere):
  with pytest.raises(errors.ConfigError) as e:
    pretrain.load_config("no_nsp.py:huge")
  assert str(e.value).startswith("--config experiments/no_nsp.py:huge: ")
  assert "unknown variant 'huge'" in str(e.value) and "base_lamb" in str(e.value)


def test_a_broken_file_of_the_users_is_a_config_error(elsewhere):
  (elsewhere / "mine.py").write_text("def get_config():\n  return 1 / 0\n")
  with pytest.raises(errors.ConfigError, match=r"--config mine.py: .*ZeroDivisionError"):
    pretrain.load_config("mine.py")


@pytest.mark.slow
def test_the_command_finds_the_recipe_from_any_directory(tmp_path):
  """A real process in a directory without experiments/ and with nothing of the repository on
  sys.path: the recipe resolves, the source line is printed, the mistake after it is one line."""
  env = dict(os.environ, PYTHONPATH="", JAX_PLATFORMS="cpu")
  env.pop("BERTJAX_DEBUG", None)
  for spec in ("base", "experiments/pretrain.py:base"):
    r = subprocess.run(
        [sys.executable, "-m", "bertjax.cli", "pretrain", "--config", spec],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert r.stdout.startswith("config: experiments/pretrain.py:base (shipped with bertjax: ")
    assert r.stderr.strip() == (
        "bertjax pretrain: --workdir is required (checkpoints, logs, metrics.jsonl), e.g. "
        "--workdir runs/tiny"
    )
  assert list(tmp_path.iterdir()) == []
