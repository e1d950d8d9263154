"""The ablation configs (experiments/no_nsp.py, sop.py, layers.py, size.py) build, lock and mean
what their docstrings say; every config string the ablation runner uses loads."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import ablate, layers, no_nsp, pretrain, size, sop  # noqa: E402
from bertjax import model as model_lib
from bertjax.training import train  # noqa: E402

SCALES = ("tiny", "mini", "small", "medium", "base", "large")
MODULES = {
    "pretrain.py": pretrain,
    "no_nsp.py": no_nsp,
    "sop.py": sop,
    "layers.py": layers,
    "size.py": size,
}


def bert_config(c) -> model_lib.BertConfig:
  c = c.copy_and_resolve_references()
  c.model.vocab_size = 8000  # normally filled from the data's metadata.json
  return train.model_config(c)


@pytest.mark.parametrize("scale", SCALES)
def test_pair_mode_ablations_build_and_lock(scale):
  base = pretrain.get_config(scale)
  for mod, mode in ((no_nsp, "none"), (sop, "sop")):
    c = mod.get_config(scale)
    c.lock()
    assert c.data.pair_mode == mode
    # Only the pair task and the name differ from the base config.
    diff = {
        k
        for k in base.to_dict()
        if k not in ("data", "variant") and base.to_dict()[k] != c.to_dict()[k]
    }
    assert not diff
    assert bert_config(c) == bert_config(base)


@pytest.mark.parametrize("n", layers.LAYERS)
def test_layers_changes_depth_only(n):
  c = layers.get_config(f"tiny,layers={n}")
  c.lock()
  cfg, base = bert_config(c), bert_config(pretrain.get_config("tiny"))
  assert cfg.num_layers == n
  assert (cfg.hidden_size, cfg.num_heads, cfg.intermediate_size) == (
      base.hidden_size,
      base.num_heads,
      base.intermediate_size,
  )
  assert c.data.pair_mode == "nsp"


def test_layers_default_and_override():
  assert bert_config(layers.get_config("mini")).num_layers == 4  # the preset's
  c = layers.get_config("tiny,layers=3")
  c.model.num_layers = 5  # what --config.model.num_layers=5 does
  assert bert_config(c).num_layers == 5


@pytest.mark.parametrize("scale", sorted(size.GRID))
def test_size_grid_rows(scale):
  for l, h, a in size.GRID[scale]:
    c = size.get_config(f"{scale},L={l},H={h},A={a}")
    c.lock()
    cfg = bert_config(c)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size) == (
        l,
        h,
        a,
        4 * h,
    )
  if scale == "base":  # the paper's Table 6 rows, in its order
    assert size.GRID["base"][0] == (3, 768, 12) and size.GRID["base"][-1] == (24, 1024, 16)


@pytest.mark.parametrize(
    "mod,arg,message",
    [
        (layers, "tiny,depth=2", "layers.py: bad option 'depth=2'"),
        (layers, "tiny,layers=0", "layers=L with L >= 1"),
        (size, "tiny,L=2,H=128", "give all of L, H and A"),
        (size, "tiny,L=2,H=100,A=3", "H divisible by A"),
        (no_nsp, "huge", "unknown variant 'huge'"),
    ],
)
def test_bad_args_name_the_file_and_fix(mod, arg, message):
  with pytest.raises(ValueError, match=message):
    mod.get_config(arg)


@pytest.mark.parametrize("sweep", ablate.SWEEPS)
@pytest.mark.parametrize("scale", ablate.SCALES)
def test_runner_config_strings_load(sweep, scale):
  """Every `--config FILE:ARG` the runner passes to `bertjax pretrain` builds."""
  vs = ablate.variants(sweep, scale)
  assert len({v.name for v in vs}) == len(vs)
  for v in vs:
    path, arg = v.config.split(":", 1)
    c = MODULES[os.path.basename(path)].get_config(arg)
    c.lock()
    assert bert_config(c).num_layers >= 1


def test_config_files_load_by_path_from_anywhere(tmp_path):
  """`bertjax pretrain --config experiments/no_nsp.py` loads the file by path, with the repo
  root not on sys.path: the base config import must still resolve."""
  code = (
      "from ml_collections.config_flags import config_flags as cf\n"
      "import sys\n"
      "for name in ('no_nsp', 'sop', 'layers', 'size'):\n"
      f"  m = cf._LoadConfigModule(name, {str(REPO)!r} + f'/experiments/{{name}}.py')\n"
      "  print(m.get_config().variant)\n"
  )
  env = dict(os.environ, PYTHONPATH="")
  out = subprocess.run(
      [sys.executable, "-c", code],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      check=True,
  ).stdout.split()
  assert out == ["no_nsp/tiny", "sop/tiny", "layers/tiny,layers=2", "size/tiny,L=2,H=128,A=2"]


def test_every_experiment_file_has_the_docstring_sections():
  for mod in (no_nsp, sop, layers, size):
    doc = mod.__doc__
    for section in ("Purpose", "Command", "Hardware", "Expected result"):
      assert section in doc, (mod.__name__, section)


def test_every_pretrain_variant_has_a_one_line_description():
  """`bertjax pretrain --help` lists pretrain.VARIANTS: every variant get_config accepts,
  each with one short line."""
  for name, text in pretrain.VARIANTS.items():
    assert text and "\n" not in text and len(text) <= 90, name
    assert pretrain.get_config(name).variant == name
  with pytest.raises(ValueError, match=r"unknown variant 'huge'; valid: demo, tiny"):
    pretrain.get_config("huge")
