"""config_checks: every numeric field of every shipped recipe is range-checked, a bad value is
one ConfigError naming the field, and the inputs (prepared data, init_from) are checked before
the loop creates its workdir."""

import json
import math

import pytest
from ml_collections import config_dict

from bertjax import errors
from bertjax.training import config_checks, fields, optim
from experiments import layers, no_nsp, pretrain, size, sop

CHECKED = (
    set(config_checks.RANGES)
    | set(config_checks.PHASE2_RANGES)
    | {"data.seq_len", "eval.batch_size"}  # checked with rules that depend on other fields
)


def _numeric_fields(section, prefix=""):
  for key in section.keys():
    value, kind = section[key], section.get_type(key)
    if isinstance(value, config_dict.ConfigDict):
      yield from _numeric_fields(value, f"{prefix}{key}.")
    elif kind in (int, float) and kind is not bool:
      yield f"{prefix}{key}"


RECIPES = [pretrain.get_config(v) for v in pretrain.VARIANTS] + [
    no_nsp.get_config("tiny"),
    sop.get_config("tiny"),
    layers.get_config("tiny,layers=3"),
    size.get_config("tiny,L=2,H=128,A=2"),
]


@pytest.mark.parametrize("config", RECIPES, ids=[c.variant for c in RECIPES])
def test_every_numeric_field_of_every_recipe_is_checked(config):
  numeric = set(_numeric_fields(config))
  assert numeric - CHECKED == set(), "add a Range for these fields to bertjax/training/fields.py"
  config_checks.validate(config)  # and every shipped recipe passes its own checks


def _bad_values(rule: config_checks.Range):
  """Values just outside `rule`, of the field's own type."""
  out = []
  if rule.low is not None:
    below = rule.low if rule.low_open else rule.low - 1
    out.append(int(below) if rule.kind is int else float(below))
    if rule.minus_one_ok and below == -1:
      out[-1] = -2
  if rule.high is not None:
    above = rule.high if rule.high_open else rule.high + 1
    out.append(int(above) if rule.kind is int else float(above))
  if rule.kind is float:
    out += [math.nan, math.inf]
  return out


@pytest.mark.parametrize("path", sorted(config_checks.RANGES))
def test_a_value_out_of_range_is_one_config_error_naming_the_field(path):
  rule = config_checks.RANGES[path]
  bad = _bad_values(rule)
  assert bad, path
  for value in bad:
    c = pretrain.get_config("tiny")
    node, _, key = path.rpartition(".")
    (c[node] if node else c)[key] = value
    with pytest.raises(errors.ConfigError) as e:
      config_checks.validate(c)
    assert str(e.value).startswith(f"config.{path}={value!r}: must be "), str(e.value)


def test_phase2_fields_are_checked_only_when_phase2_runs():
  c = pretrain.get_config("tiny")
  c.phase2.batch_size = 0
  config_checks.validate(c)  # one phase: phase 2's batch is unused
  c.phase2.fraction = 0.5
  with pytest.raises(errors.ConfigError, match=r"config.phase2.batch_size=0: must be an integer"):
    config_checks.validate(c)


@pytest.mark.parametrize("value", [-1e-4, 0.0, math.inf])
def test_a_learning_rate_that_cannot_train_never_starts(tmp_path, value):
  from conftest import loop_config

  from bertjax.training import loop

  wd = tmp_path / "run"
  with pytest.raises(errors.ConfigError, match=r"config.train.learning_rate=.*: must be a finite"):
    loop.train_and_evaluate(loop_config(2, **{"train.learning_rate": value}), str(wd))
  assert not wd.exists()


def test_the_rules_read_as_the_messages_say():
  r = config_checks.Range(float, 0.0, 1.0, low_open=True)
  assert r.describe() == "a finite number in (0, 1]"
  assert [r.accepts(v) for v in (0.0, 0.5, 1.0, 1.5, math.nan, True, None)] == [
      False,
      True,
      True,
      False,
      False,
      False,
      False,
  ]
  mesh = config_checks.RANGES["mesh.data"]
  assert mesh.describe() == "an integer >= 1 or -1"
  assert [mesh.accepts(v) for v in (-1, 0, 1, 2.0)] == [True, False, True, False]


def test_the_table_writes_each_field_once_and_the_recipe_sets_its_own():
  paths = [f.path for f in fields.FIELDS]
  assert len(paths) == len(set(paths))
  for name, read in optim.SCHEDULE_FIELDS.items():  # the schedules read their fields from it
    assert {f"train.{k}" for k in read} <= set(fields.DEFAULTS), name
  recipe = {f.path: 1 for f in fields.FIELDS if f.default is fields.RECIPE}
  del recipe["train.steps"]
  with pytest.raises(ValueError, match=r"lacks \['train.steps'\]"):
    fields.base_config(recipe)
  c = pretrain.get_config("tiny")
  assert c.data.get_type("path") is str and c.data.path is None  # overridable as a string
  assert "num_layers" not in c.model  # the preset's, unless a recipe sets it


# ----------------------------------------------------------------------------- inputs


def _synthetic(**overrides):
  c = pretrain.get_config("tiny")
  c.data.source = "synthetic"
  c.model.vocab_size = 1000
  for k, v in overrides.items():
    node, _, key = k.rpartition(".")
    c[node][key] = v
  return c


def test_a_missing_data_dir_names_the_field_and_the_fix(tmp_path):
  c = pretrain.get_config("tiny")
  c.data.path = str(tmp_path / "nowhere")
  with pytest.raises(errors.InputNotFoundError, match=r"config.data.path=.*nowhere: no such dir"):
    config_checks.check_inputs(c, str(tmp_path / "run"))
  (tmp_path / "nowhere").mkdir()
  with pytest.raises(errors.InputNotFoundError, match=r"no metadata.json"):
    config_checks.check_inputs(c, str(tmp_path / "run"))
  (tmp_path / "nowhere" / "metadata.json").write_text("{not json")
  with pytest.raises(errors.BadInputError, match=r"nowhere"):  # names the dir or its file
    config_checks.check_inputs(c, str(tmp_path / "run"))


def test_data_prepared_from_an_empty_corpus_stops_before_the_workdir(tmp_path):
  """Shards with no document (what `bertjax prepare` wrote for an empty corpus before it
  refused one): one error naming the data path and the fix, and no workdir."""
  from bertjax.training import loop
  from conftest import loop_config

  shards = tmp_path / "shards"
  shards.mkdir()
  meta = {
      "documents": 0,
      "examples_of_problems": ["empty.txt: empty file"],
      "inputs": ["empty.txt"],
      "num_workers": 1,
      "shards": [],
      "tokenizer": {"file": "tokenizer.model", "type": "sentencepiece", "vocab_size": 8000},
      "worker_index": 0,
  }
  (shards / "metadata.json").write_text(json.dumps(meta))
  c = loop_config(2, **{"data.source": "prepared", "data.path": str(shards)})
  c.model.vocab_size = None
  wd = tmp_path / "run"
  with pytest.raises(errors.InputNotFoundError) as e:
    loop.train_and_evaluate(c, str(wd))
  assert str(e.value) == (
      f"config.data.path={shards}: the prepared data holds no training documents (`bertjax "
      "prepare` found no text in empty.txt: empty.txt: empty file) — re-run `bertjax prepare` "
      "on a non-empty corpus"
  )
  assert not wd.exists()


def test_one_file_serves_any_number_of_processes_and_no_held_out_split_warns(tmp_path):
  """Every process reads blocks of all the shard files, so one train file is enough for any
  number of processes (tests/test_multihost.py trains on 2 from one); a run evaluates when the
  data holds any held-out file, and says so once when it holds none."""
  from bertjax.training import loop

  shard = lambda split, n: {
      "file": f"{split}-00000-of-00001.tfrecord",
      "split": split,
      "documents": n,
  }
  meta = {
      "shards": [shard("train", 3), shard("eval", 0)],
      "tokenizer": {"file": "tokenizer.model", "type": "sentencepiece", "vocab_size": 1000},
  }
  (tmp_path / "metadata.json").write_text(json.dumps(meta))
  c = _synthetic(**{"data.source": "prepared", "data.path": str(tmp_path)})
  config_checks.check_data(c, meta)
  said = []
  writer = type("Writer", (), {"log": lambda self, line: said.append(line)})()
  assert not loop._has_eval_data(c, meta, writer)
  assert said == [
      f"warning: {tmp_path} holds no held-out documents: training without held-out evaluation. "
      "`bertjax prepare --eval-fraction F` writes them; --config.eval.every_steps=0 silences this"
  ]
  meta["shards"][1]["documents"] = 1
  (tmp_path / "metadata.json").write_text(json.dumps(meta))
  assert loop._has_eval_data(c, meta, writer) and len(said) == 1


def test_a_missing_tokenizer_or_init_from_is_named(tmp_path):
  c = _synthetic(**{"data.tokenizer": str(tmp_path / "t.model")})
  with pytest.raises(errors.InputNotFoundError, match=r"config.data.tokenizer=.*t.model: no such"):
    config_checks.check_inputs(c, str(tmp_path / "run"))
  c = _synthetic(**{"train.init_from": str(tmp_path / "ckpt")})
  with pytest.raises(errors.InputNotFoundError, match=r"config.train.init_from=.*ckpt: no such"):
    config_checks.check_inputs(c, str(tmp_path / "run"))
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  config_checks.check_inputs(c, str(tmp_path / "run"))  # a resume does not read init_from


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
  (tmp_path / "run").write_text("")
  with pytest.raises(errors.ConfigError, match=r"run: exists and is not a directory"):
    config_checks.check_inputs(_synthetic(), str(tmp_path / "run"))


# ------------------------------------------------------------------ the modern block's fields


@pytest.mark.parametrize(
    "changes, needles",
    [
        ({"model.local_attention": 127}, ["config.model: local_attention=127: must be even"]),
        ({"model.local_attention": -2}, ["config.model.local_attention=-2: must be an integer"]),
        (
            {"model.global_every": 1},
            ["config.model: local_attention=128 with global_every=1", "no layer uses the window"],
        ),
        (
            {"model.local_attention": 0},
            ["config.model: global_every=3 with local_attention=0", "have no window"],
        ),
        ({"model.rope_theta": 0.0}, ["config.model.rope_theta=0.0: must be a finite number > 0"]),
        ({"model.norm_placement": "middle"}, ["config.model.norm_placement='middle': valid: post"]),
        ({"model.mlp_type": "swiglu"}, ["config.model.mlp_type='swiglu': valid: dense, glu"]),
        ({"model.position_embedding": "alibi"}, ["valid: learned, rope"]),
        ({"model.type_vocab_size": -1}, ["config.model.type_vocab_size=-1: must be an integer"]),
    ],
)
def test_a_contradictory_modern_config_is_one_config_error(changes, needles):
  c = pretrain.get_config("modern_base")
  for k, v in changes.items():
    node, _, key = k.rpartition(".")
    c[node][key] = v
  with pytest.raises(errors.ConfigError) as e:  # a range or a choice, else BertConfig's rules
    config_checks.validate(c)
    config_checks.preflight(c)
  message = str(e.value)
  assert "\n" not in message
  for needle in needles:
    assert needle in message, (needle, message)


def test_positions_past_the_table_matter_only_for_learned_positions():
  c = pretrain.get_config("modern_tiny")  # RoPE: max_position_embeddings is no table
  c.data.seq_len, c.data.max_predictions_per_seq = 512, 154
  config_checks.validate(c)
  c.model.position_embedding = "learned"
  with pytest.raises(errors.ConfigError, match=r"config.data.seq_len=512 exceeds config.model"):
    config_checks.validate(c)


def test_modern_switches_that_do_not_build_are_named_before_the_run():
  c = pretrain.get_config("modern_tiny")
  c.model.scan_layers = True  # local and global layers are not identical: no scan
  with pytest.raises(errors.ConfigError, match=r"^config.model: scan_layers=True"):
    config_checks.preflight(c)
  c = pretrain.get_config("modern_tiny")
  c.model.hidden_size = 126  # head size 63: RoPE rotates pairs of features
  with pytest.raises(errors.ConfigError, match=r"^config.model: position_embedding='rope' needs"):
    config_checks.preflight(c)
