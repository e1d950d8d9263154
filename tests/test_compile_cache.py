"""The persistent compilation cache: where it goes, how to turn it off, and that a second
process reads every compiled step back instead of compiling it."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from bertjax.runtime import compile_cache
from conftest import REPO


def test_cache_dir_follows_the_environment(tmp_path):
  home = str(tmp_path / "home")
  assert compile_cache.cache_dir({"XDG_CACHE_HOME": home}) == os.path.join(home, "bertjax", "xla")
  assert compile_cache.cache_dir({"BERTJAX_COMPILE_CACHE": "off"}) is None
  assert compile_cache.cache_dir({"BERTJAX_COMPILE_CACHE": "OFF"}) is None
  assert compile_cache.cache_dir({"BERTJAX_COMPILE_CACHE": "/x/y"}) == "/x/y"
  # JAX's own variable wins over ours
  both = {"BERTJAX_COMPILE_CACHE": "off", "JAX_COMPILATION_CACHE_DIR": "/jax"}
  assert compile_cache.cache_dir(both) == "/jax"
  env = {"BERTJAX_COMPILE_CACHE": str(tmp_path / "c")}
  assert compile_cache.configure(env) == str(tmp_path / "c")
  assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "c")
  assert env["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(compile_cache.MAX_BYTES)
  off = {"BERTJAX_COMPILE_CACHE": "off"}
  assert compile_cache.configure(off) is None and "JAX_COMPILATION_CACHE_DIR" not in off


def _glue(workdir: pathlib.Path, cache: pathlib.Path) -> dict:
  task = REPO / "data" / "movie_snippets"
  env = dict(os.environ, BERTJAX_COMPILE_CACHE=str(cache))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # cache the tiny model's steps too
  cmd = [sys.executable, "-m", "bertjax.cli", "glue", "--task", "custom", "--train",
         str(task / "train.tsv"), "--dev", str(task / "dev.tsv"), "--text-columns", "sentence",
         "--label-column", "label", "--init", "random", "--tokenizer",
         str(REPO / "data" / "tokenizer.model"), "--preset", "tiny", "--epochs", "1",
         "--max-train-examples", "96", "--batch-size", "16", "--workdir", str(workdir),
         "--no-progress"]  # fmt: skip
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads((workdir / "results.json").read_text())


@pytest.mark.long
@pytest.mark.slow
def test_a_second_process_compiles_nothing(tmp_path):
  cache = tmp_path / "cache"
  programs = lambda: sorted(p.name for p in cache.iterdir() if p.name.endswith("-cache"))
  first = _glue(tmp_path / "a", cache)
  written = programs()
  # the init, train and predict steps at least (train and predict under `traced`)
  assert sum("traced" in p for p in written) >= 2 and len(written) >= 3, written
  second = _glue(tmp_path / "b", cache)
  # every program the second run compiled was already there: nothing new was written
  assert programs() == written
  assert second == first  # and it computes the same numbers
