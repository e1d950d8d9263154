"""The ablation configs (experiments/no_nsp.py, sop.py, layers.py, size.py, modern.py) build,
lock and mean what their docstrings say; every config string the ablation runner uses loads."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import ablate, layers, modern, no_nsp, objective, pretrain, rtd_check, size, sop  # noqa: E402
from experiments import retrieval_transfer  # noqa: E402
from bertjax import model as model_lib
from bertjax.training import train  # noqa: E402

SCALES = ("tiny", "mini", "small", "medium", "base", "large")
MODULES = {
    "pretrain.py": pretrain,
    "no_nsp.py": no_nsp,
    "sop.py": sop,
    "layers.py": layers,
    "size.py": size,
    "modern.py": modern,
    "objective.py": objective,
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
        (objective, "demo,block=rnn,objective=mlm", "objective.py: bad option 'block=rnn'"),
        (objective, "demo,block=bert", "expected SCALE,block=NAME,objective=NAME"),
    ],
)
def test_bad_args_name_the_file_and_fix(mod, arg, message):
  with pytest.raises(ValueError, match=message):
    mod.get_config(arg)


@pytest.mark.parametrize("sweep", ablate.SWEEPS)
@pytest.mark.parametrize("scale", ablate.SCALES)
def test_runner_config_strings_load(sweep, scale):
  """Every `--config FILE:ARG` the runner passes to `bertjax pretrain` builds."""
  if sweep in ("modern", "objective") and scale not in modern.SCALES:
    pytest.skip(f"the {sweep} sweep runs at modern.SCALES (ablate refuses the others)")
  vs = ablate.variants(sweep, scale)
  assert len({v.name for v in vs}) == len(vs)
  for v in vs:
    path, arg = v.config.split(":", 1)
    c = MODULES[os.path.basename(path)].get_config(arg)
    c.lock()
    assert bert_config(c).num_layers >= 1


@pytest.mark.process
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
  for mod in (no_nsp, sop, layers, size, modern, objective, rtd_check, retrieval_transfer):
    doc = mod.__doc__
    for section in ("Purpose", "Command", "Hardware", "Expected result"):
      assert section in doc, (mod.__name__, section)


def test_retrieval_transfer_arms_and_table():
  """An arm's flags (random init of a preset: no dropout, as the checkpoints it is compared
  with) and the table's mean ± sd over the seeds."""
  pretrain_flags, score_flags = retrieval_transfer._arm_flags("random:tiny")
  assert "--config.model.preset=tiny" in pretrain_flags and "--init" not in pretrain_flags
  assert "--config.model.hidden_dropout_rate=0.0" in pretrain_flags
  assert score_flags == ["--init", "random", "--preset", "tiny"]
  assert retrieval_transfer._arm_flags("runs/demo") == (["--init", "runs/demo"],) * 2
  scores = lambda n: dict(ndcg_at_10=n, mrr_at_10=0, recall_at_100=0.5, map_at_100=0)
  results = {"arms": {"demo": {"init": "runs/demo", "before": scores(0.01)}}}
  results["arms"]["demo"]["after"] = {0: scores(0.02), 1: scores(0.04)}
  row = retrieval_transfer._table(results).splitlines()[2]
  assert "| 0.0100 | 0.0300 ± 0.0141 | 0.0200, 0.0400 | 0.5000 → 0.5000 |" in row, row


def test_rtd_check_auc_is_the_share_of_correctly_ordered_pairs():
  """rtd_check.auc against its definition: over every (replaced, original) pair, the share
  the scores order correctly, ties counting half."""
  rng = np.random.default_rng(0)
  labels = rng.random(300) < 0.15
  scores = np.round(rng.normal(size=300) + labels, 1)  # rounded: ties
  pos, neg = scores[labels], scores[~labels]
  pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
  assert rtd_check.auc(scores, labels) == pytest.approx(pairs, abs=1e-12)
  assert rtd_check.auc(np.arange(4.0), np.array([0, 0, 1, 1])) == 1.0
  with pytest.raises(ValueError, match="needs both classes"):
    rtd_check.auc(np.zeros(3), np.zeros(3))


def test_every_pretrain_variant_has_a_one_line_description():
  """`bertjax pretrain --help` lists pretrain.VARIANTS: every variant get_config accepts,
  each with one short line."""
  for name, text in pretrain.VARIANTS.items():
    assert text and "\n" not in text and len(text) <= 90, name
    assert pretrain.get_config(name).variant == name
  with pytest.raises(ValueError, match=r"unknown variant 'huge'; valid: demo, tiny"):
    pretrain.get_config("huge")


# --------------------------------------------------------------------------- the modern ladder

# What each rung changes, written out here independently of experiments/modern.py.
LADDER = {
    "bert": set(),
    "no_nsp": {"data.pair_mode"},
    "mask30": {"data.mask_prob", "data.max_predictions_per_seq"},
    "pre_ln": {"model.norm_placement"},
    "geglu": {"model.mlp_type", "model.intermediate_size"},
    "rope": {"model.position_embedding"},
    "no_bias": {"model.use_bias", "model.type_vocab_size"},
    "packing": {"data.packing"},
    "schedule": {
        "train.optimizer",
        "train.schedule",
        "train.b2",
        "train.weight_decay",
        "train.clip_norm",
    },
    "local_global": {"model.local_attention", "model.global_every"},
}


def flat(c) -> dict:
  return {
      f"{section}.{k}": v
      for section, d in c.to_dict().items()
      if isinstance(d, dict)
      for k, v in d.items()
  }


@pytest.mark.parametrize("scale", sorted(modern.SCALES))
def test_modern_ladder_adds_exactly_one_change_per_rung(scale):
  assert list(modern.RUNGS) == list(LADDER)
  prev = None
  for name, changed in LADDER.items():
    c = modern.get_config(f"{scale},rung={name}")
    c.lock()
    assert c.variant == f"modern/{scale},rung={name}"
    bert_config(c)  # every rung's network builds
    if prev is not None:
      cur = flat(c)
      diff = {k for k in {*cur, *prev} if cur.get(k, "absent") != prev.get(k, "absent")}
      assert diff == changed, name
    prev = flat(c)
  # The top rung is ModernBERT's block and recipe, as modern_tiny has it (size aside).
  top, ref = prev, flat(pretrain.get_config("modern_tiny"))
  for k in ("norm_placement", "mlp_type", "position_embedding", "use_bias", "type_vocab_size"):
    assert top[f"model.{k}"] == ref[f"model.{k}"], k
  assert (top["data.pair_mode"], top["data.mask_prob"]) == ("none", 0.3)
  assert (top["train.optimizer"], top["train.schedule"], top["data.packing"]) == (
      "stable_adamw",
      "wsd",
      True,
  )
  seq_len, batch = modern.SCALES[scale]
  assert (top["data.seq_len"], top["train.batch_size"], top["phase2.fraction"]) == (
      seq_len,
      batch,
      0.0,
  )
  assert top["model.local_attention"] == seq_len // 4


def test_modern_rungs_are_scored_on_the_same_examples_at_15_percent():
  """The held-out stream each rung builds (loop.make_stream, split eval): 15% masking on the
  same single-segment unpacked rows whatever the rung trains with, and whatever its seed."""
  from bertjax.training import loop, phases

  batches = {}
  for name in LADDER:
    for seed in (0, 3):
      c = modern.get_config(f"demo,rung={name}")
      c.data.source = "synthetic"  # no prepared data needed; same held-out logic
      c.model.vocab_size = 1000
      c.seed = seed
      assert c.eval.mask_prob == 0.15
      stream = loop.make_stream(c, phases.phases(c)[0], None, split="eval")
      batches[name, seed] = next(stream)
  ref = batches["bert", 0]
  tokens_B = (ref["input_ids"] != 0).sum(axis=1)
  # google's rule: round(tokens * 0.15) predictions per row ([CLS]/[SEP] counted).
  assert (ref["masked_weights"].sum(axis=1) == (tokens_B * 0.15).round()).all()
  assert "segment_ids" not in ref or not ref["segment_ids"].any()  # single segments
  for (name, seed), b in batches.items():
    for k in ("input_ids", "masked_positions", "masked_ids"):
      n = min(ref[k].shape[1], b[k].shape[1])  # 30% rungs leave room for more predictions
      assert (b[k][:, :n] == ref[k][:, :n]).all(), (name, seed, k)
    assert b["masked_weights"].sum() == ref["masked_weights"].sum(), (name, seed)
  # The training stream still follows the rung's own masking.
  c = modern.get_config("demo,rung=mask30")
  c.data.source, c.model.vocab_size = "synthetic", 1000
  train_batch = next(loop.make_stream(c, phases.phases(c)[0], None, split="train"))
  assert train_batch["masked_weights"].sum() > 1.5 * ref["masked_weights"].sum() * (
      train_batch["input_ids"].shape[0] / ref["input_ids"].shape[0]
  )


def test_modern_bad_args():
  with pytest.raises(ValueError, match="NAME one of bert, no_nsp"):
    modern.get_config("demo,rung=nope")
  with pytest.raises(ValueError, match="SCALE one of demo, tiny"):
    modern.get_config("base,rung=bert")
