"""`--config` finds the shipped recipes from any working directory: by bare variant name, by
`experiments/pretrain.py:VARIANT` and by file name; a file where the user stands wins; the
command prints which file and variant it read."""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bertjax import errors
from bertjax.commands import pretrain
from bertjax.training import phases as phases_lib
from experiments import pretrain as recipes

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


# ------------------------------------------------------------------------ the modern recipes

# answerdotai/ModernBERT-base's config.json as transformers writes it: `ModernBertConfig()`'s
# defaults are that model's, and the recipe must build the same network.
MODERN_FROM_HF = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "layer_norm_eps": "norm_eps",
    "local_attention": "local_attention",
    "max_position_embeddings": "max_position_embeddings",
    "hidden_act": "hidden_activation",
    "attention_dropout_rate": "attention_dropout",
    "hidden_dropout_rate": "mlp_dropout",
    "initializer_range": "initializer_range",
}


def _bert_config(config, vocab=8000):
  from bertjax.training import train

  c = config.copy_and_resolve_references()
  c.model.vocab_size = vocab  # filled from the prepared data's tokenizer by `pretrain`
  return train.model_config(c)


@pytest.mark.parametrize("variant", ["modern_base", "modern_tiny"])
def test_the_modern_recipes_build_and_pass_the_checks(elsewhere, variant):
  from bertjax.training import config_checks

  for spec in (variant, f"experiments/pretrain.py:{variant}"):
    config = pretrain.load_config(spec)
    assert config.variant == variant
    config_checks.validate(config)
    config_checks.preflight(config)  # the BertConfig and the batch split over 8 devices
  cfg = _bert_config(config)
  assert (cfg.norm_placement, cfg.mlp_type, cfg.position_embedding) == ("pre", "glu", "rope")
  assert (cfg.use_bias, cfg.type_vocab_size, cfg.global_every) == (False, 0, 3)
  last = phases_lib.phase_config(config, phases_lib.phases(config)[-1])  # after any extension
  assert (last.model.rope_theta, last.model.local_rope_theta) == (160_000.0, 10_000.0)
  assert not cfg.scan_layers  # local and global layers differ
  assert (config.data.pair_mode, config.data.mask_prob) == ("none", 0.3)
  for ph in phases_lib.phases(config):  # room for 30% of every phase's tokens
    assert ph.max_predictions >= 0.3 * ph.seq_len, ph
  # the window is shorter than the sequence, so the local layers differ from the global ones
  assert 0 < cfg.local_attention < config.data.seq_len


def test_modern_base_is_modernbert_base_as_transformers_configures_it():
  hf = pytest.importorskip("transformers").ModernBertConfig()  # ModernBERT-base's defaults
  config = recipes.get_config("modern_base")
  # ModernBERT-base as released: after the context extension (phase 2's RoPE theta)
  config = phases_lib.phase_config(config, phases_lib.phases(config)[-1])
  cfg = _bert_config(config, vocab=hf.vocab_size)
  for ours, theirs in MODERN_FROM_HF.items():
    assert getattr(cfg, ours) == getattr(hf, theirs), (ours, theirs)
  assert hf.rope_parameters["full_attention"]["rope_theta"] == cfg.rope_theta
  assert hf.rope_parameters["sliding_attention"]["rope_theta"] == cfg.local_rope_theta
  every = [i for i, t in enumerate(hf.layer_types) if t == "full_attention"]
  assert every == list(range(0, cfg.num_layers, cfg.global_every))
  assert not (hf.norm_bias or hf.mlp_bias or hf.attention_bias) and not cfg.use_bias
  assert config.data.seq_len == hf.max_position_embeddings  # the extension's 8,192
  first = recipes.get_config("modern_base")
  assert (first.data.seq_len, first.model.rope_theta) == (1024, 10_000.0)  # before it
  # ModernBERT's training (paper 2.2.3): StableAdamW at 8e-4, trapezoid, extension at 3e-4
  t = first.train
  assert (t.optimizer, t.schedule, t.learning_rate, t.weight_decay) == (
      "stable_adamw",
      "wsd",
      8e-4,
      1e-5,
  )
  assert first.phase2.restart_schedule and first.phase2.learning_rate == 3e-4


def test_modern_tiny_is_modern_base_at_tiny_scale():
  # against the released ModernBERT-base: modern_base after its context extension (phase 2)
  released = recipes.get_config("modern_base")
  base = _bert_config(phases_lib.phase_config(released, phases_lib.phases(released)[-1]))
  tiny = _bert_config(recipes.get_config("modern_tiny"))
  scale = {"num_layers", "hidden_size", "num_heads", "intermediate_size", "local_attention"}
  scale |= {"max_position_embeddings", "dtype", "scan_layers"}
  differ = {f for f in base.to_dict() if getattr(base, f) != getattr(tiny, f)}
  assert differ <= scale, differ - scale
  assert tiny.head_dim == base.head_dim  # 64
  assert tiny.intermediate_size / tiny.hidden_size == base.intermediate_size / base.hidden_size
  assert tiny.num_layers > tiny.global_every - 1  # a global layer and local ones


@pytest.mark.long
@pytest.mark.slow
def test_modern_tiny_pretrains_and_its_loss_falls(tmp_path):
  """The recipe end to end through the loop on the bundled corpus, shortened (40 steps of 16
  sequences); the network, the masking and the optimizer are the recipe's."""
  from conftest import metrics_rows

  from bertjax.training import loop

  c = recipes.get_config("modern_tiny")
  c.train.batch_size, c.train.steps, c.train.warmup_steps = 16, 40, 5
  c.log_every_steps, c.tensorboard = 1, False
  c.checkpoint.every_steps, c.eval.every_steps = 40, 0
  assert loop.train_and_evaluate(c, str(tmp_path / "run")) == 0
  train_rows, _ = metrics_rows(tmp_path / "run")
  losses = [train_rows[s]["mlm_loss"] for s in sorted(train_rows)]
  assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
  # from uniform over the 8,000 pieces (ln 8000 = 9.0) towards the corpus' unigram entropy
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses


def test_the_demo_summary_leaves_out_nsp_for_a_recipe_without_it(tmp_path):
  from bertjax.commands import demo

  rows = [
      {"step": 1, "mlm_loss": 9.0, "nsp_accuracy": 0.0},
      {"step": 9, "mlm_loss": 6.0, "nsp_accuracy": 0.0},
      {"step": 9, "eval_mlm_accuracy": 0.1, "eval_mlm_perplexity": 400.0, "eval_nsp_accuracy": 0.0},
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  text = demo._summary(tmp_path, pairs=False)
  assert "MLM loss 9.000 (step 1) -> 6.000 (step 9)" in text and "NSP" not in text
  assert "NSP accuracy 0.000" in demo._summary(tmp_path)  # the demo recipe's NSP
