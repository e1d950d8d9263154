"""`bertjax bench`: the report's keys and arithmetic, the FLOP formula, peers and errors.

No timing thresholds: the machine is shared, so only relations that hold at any speed are
checked (tokens/s = seq/s x L, MFU = FLOP/s / peak, ...).
"""

import json
import os
import sys

import jax
import numpy as np
import pytest

import flax.linen as nn

from bertjax import cli, errors
from bertjax import model as model_lib
from bertjax.bench import finetuning, peer_runs, peers as bench_peers, pretraining as bench
from bertjax.bench import spec as bench_spec
from bertjax.commands import bench as bench_cmd
from bertjax.training import flops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--preset",
    "tiny",
    "--vocab-size",
    "512",
    "--batch-size",
    "8",
    "--seq-len",
    "16",
    "--warmup",
    "1",
    "--steps",
    "2",
]


def test_flops_hand_count():
  # 2 layers, H=8, F=16, V=10; B=2, L=4, P=1, counted by hand:
  #   one layer: qkv 3*8*8+24, out 8*8+8, 2 LayerNorms 4*8, MLP 8*16+16 + 16*8+8  = 600
  #   encoder 6 * 2*600 * (2*4 tokens)                              = 57,600
  #   attention 12 * 2 layers * 8 * 4 * (8 tokens)                  =  6,144
  #   MLM head 6 * (8*8 + 8*10) * (2*1 masked rows)                 =  1,728
  #   pooler + NSP 6 * (8*8 + 2*8) * 2                              =    960
  cfg = model_lib.BertConfig(
      vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16
  )
  assert flops.non_embedding_params(cfg) == 1200
  assert flops.pretraining_flops_per_step(cfg, 2, 4, 1) == 57_600 + 6_144 + 1_728 + 960


@pytest.mark.slow
def test_flops_param_count_matches_the_model():
  cfg = model_lib.from_preset("tiny", vocab_size=100)
  d = model_lib.dummy_inputs()
  params = nn.unbox(
      model_lib.BertForPreTraining(cfg).init(
          jax.random.key(0),
          d["input_ids"],
          d["token_type_ids"],
          d["attention_mask"],
          d["masked_positions"],
      )["params"]
  )
  assert flops.non_embedding_params(cfg) == model_lib.count_params(params["bert"]["encoder"])


def test_synthetic_batch_layout():
  b = bench_peers.synthetic_batch(4, 32, 5, vocab_size=50, seed=1)
  assert {k: v.shape for k, v in b.items()} == {
      "input_ids": (4, 32),
      "attention_mask": (4, 32),
      "token_type_ids": (4, 32),
      "masked_positions": (4, 5),
      "masked_ids": (4, 5),
      "masked_weights": (4, 5),
      "nsp_labels": (4,),
  }
  pos = b["masked_positions"]
  assert pos.min() >= 1 and pos.max() < 32  # never [CLS]
  assert all(len(set(row)) == 5 for row in pos)
  assert b["input_ids"].min() >= bench_peers.FIRST_TOKEN_ID and b["input_ids"].max() < 50
  labels = bench_peers.mlm_labels(b)
  assert (labels != -100).sum() == 4 * 5
  np.testing.assert_array_equal(np.take_along_axis(labels, pos, axis=1), b["masked_ids"])
  assert bench_peers.max_predictions(128) == 20  # BERT's max_predictions_per_seq at seq 128


@pytest.mark.slow
def test_json_report(capsys):
  assert bench_cmd.main(TINY + ["--json"]) == 0
  r = json.loads(capsys.readouterr().out)
  for key in (
      "tokens_per_sec",
      "seq_per_sec",
      "step_ms",
      "mfu",
      "peak_flops",
      "compile_s",
      "model_flops_per_step",
      "peak_memory_bytes",
      "peers",
  ):
    assert key in r, key
  assert r["step_ms"] > 0 and r["compile_s"] > 0 and r["peak_flops"] > 0
  assert r["step_ms_min"] <= r["step_ms"]
  np.testing.assert_allclose(r["seq_per_sec"], 8 * 1e3 / r["step_ms"])
  np.testing.assert_allclose(r["tokens_per_sec"], r["seq_per_sec"] * 16)
  np.testing.assert_allclose(
      r["mfu"], r["model_flops_per_step"] * 1e3 / r["step_ms"] / r["peak_flops"]
  )
  assert 0 < r["mfu"] < 1
  assert r["num_masked"] == 3  # ceil(0.15 * 16)
  assert r["devices"] == jax.device_count() == 8  # the real step ran on the whole mesh
  assert r["peak_source"].startswith("measured")
  assert r["peers"] == {}


@pytest.mark.slow
def test_cpu_peak_is_the_best_of_before_and_after(capsys, monkeypatch):
  # a low first measurement (load from elsewhere) must not become the peak
  measured = iter([1e9, 3e9])
  monkeypatch.setattr(bench, "measure_cpu_peak", lambda dtype: next(measured))
  assert bench_cmd.main(TINY + ["--json"]) == 0
  r = json.loads(capsys.readouterr().out)
  assert r["peak_flops"] == 3e9 and "before and after" in r["peak_source"]
  np.testing.assert_allclose(r["mfu"], r["model_flops_per_sec"] / 3e9)


@pytest.mark.slow
def test_table_report_and_peer_unavailable(capsys, monkeypatch):
  monkeypatch.setenv("BERTJAX_HF4_PYTHON", "/nonexistent/python")
  assert bench_cmd.main(TINY + ["--compare", "hf-flax", "--peak-flops", "1e12"]) == 0
  out = capsys.readouterr().out
  assert "tokens/s" in out and "MFU" in out
  assert "hf-flax" in out and "unavailable" in out and "BERTJAX_HF4_PYTHON" in out


@pytest.mark.slow
def test_flax_peer_subprocess_reports_missing_flax_models():
  # This interpreter has transformers 5 (no Flax models) or none: the child must answer with
  # a JSON "unavailable", which the parent parses, rather than crash.
  spec = dict(
      vocab_size=64,
      hidden_size=16,
      num_layers=1,
      num_heads=2,
      intermediate_size=32,
      max_position_embeddings=32,
      hidden_dropout_rate=0.1,
      attention_dropout_rate=0.1,
      batch_size=2,
      seq_len=8,
      num_masked=1,
      warmup=1,
      steps=1,
      threads=1,
  )
  os.environ["BERTJAX_HF4_PYTHON"] = sys.executable
  try:
    r = peer_runs.run_flax_subprocess(spec, repo_root=".", timeout_s=300)
  finally:
    del os.environ["BERTJAX_HF4_PYTHON"]
  try:
    import transformers

    has_flax = hasattr(transformers, "FlaxBertForPreTraining")
  except ImportError:
    has_flax = False
  assert r["name"] == "hf-flax"
  assert r["status"] == ("ok" if has_flax else "unavailable"), r


@pytest.mark.slow
def test_torch_peer_runs_and_matches_the_report_keys():
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  spec = dict(
      vocab_size=64,
      hidden_size=16,
      num_layers=1,
      num_heads=2,
      intermediate_size=32,
      max_position_embeddings=32,
      hidden_dropout_rate=0.1,
      attention_dropout_rate=0.1,
      batch_size=2,
      seq_len=8,
      num_masked=1,
      warmup=1,
      steps=2,
      threads=1,
  )
  r = peer_runs.run_torch(spec, compiled=False)
  assert r["status"] == "ok", r
  assert r["step_ms"] > 0 and r["steps_timed"] == 2
  np.testing.assert_allclose(r["tokens_per_sec"], 2 * 8 * 1e3 / r["step_ms"])


def _needs_keras_hub():
  """Skip, naming the install command, where keras-hub is not installed."""
  import importlib.util

  if importlib.util.find_spec("keras_hub") is None:
    pytest.skip(f"keras-hub is not installed: {bench_peers.KERAS_HUB_INSTALL}")


def test_keras_hub_peer_is_listed_and_reported_unavailable_without_its_python(capsys, monkeypatch):
  for argv in ([], ["finetune"]):
    with pytest.raises(SystemExit):
      bench_cmd.main(argv + ["--help"])
    assert "keras-hub" in capsys.readouterr().out
  monkeypatch.setenv("BERTJAX_KERAS_HUB_PYTHON", "/nonexistent/python")
  r = peer_runs.run_keras_subprocess({})
  assert r["status"] == "unavailable" and bench_peers.KERAS_HUB_INSTALL in r["reason"], r
  r = peer_runs.run_keras_finetune_subprocess({}, {}, {})
  assert r["status"] == "unavailable" and "BERTJAX_KERAS_HUB_PYTHON" in r["reason"], r


@pytest.mark.slow
def test_keras_hub_peer_trains_the_same_model_without_nsp(capsys):
  """keras-hub's BertMaskedLM on the same batch: the ratio, and the parameters: bertjax's
  model has exactly keras-hub's plus the NSP classifier (H x 2 + 2)."""
  _needs_keras_hub()
  spec = bench.BenchSpec(
      preset="tiny", vocab_size=512, batch_size=8, seq_len=16, warmup=1, steps=2, peak_flops=1e12
  )
  r = bench.run(spec, ("keras-hub",))
  peer = r["peers"]["keras-hub"]
  assert peer["status"] == "ok", peer["reason"]
  assert peer["tokens_per_sec"] > 0 and peer["steps_timed"] == 2 and peer["compile_s"] > 0
  np.testing.assert_allclose(r["ratio_keras-hub"], r["tokens_per_sec"] / peer["tokens_per_sec"])
  hidden = spec.model_config().hidden_size
  assert r["params"] == peer["params"] + hidden * 2 + 2
  assert any(d.startswith("NSP: bertjax also trains") for d in peer["differences"])
  report = bench_spec.format_report(r)
  assert "keras-hub vs bertjax" in report and "NSP" in report and "clipped at 1.0" in report


def _one_line_error(argv, capsys) -> str:
  """`bertjax bench ARGV` fails with exit 2 and one line `bertjax bench: ...`; the line."""
  assert cli.main(["bench", *argv]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("bertjax bench: "), lines
  assert "bench: bench:" not in lines[0]
  return lines[0].removeprefix("bertjax bench: ")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "huge"], "--preset 'huge' is not a model preset — valid presets: tiny,"),
        (["--seq-len", "1024"], "--seq-len 1024 exceeds BERT's 512 positions"),
        (["--seq-len", "1"], "--seq-len 1 must be >= 2"),
        (["--batch-size", "0"], "argument --batch-size: '0' must be >= 1"),
        (["--steps", "-1"], "argument --steps: '-1' must be >= 1"),
        (["--num-masked", "16", "--seq-len", "16"], "--num-masked 16 must be below --seq-len 16"),
        (["--vocab-size", "4", "--preset", "tiny"], "--vocab-size 4 must be >= 6"),
        (["--peak-flops", "-1"], "argument --peak-flops: '-1' must be a finite number >= 0"),
        (["--compare", "hf-torch,tensorflow"], "--compare tensorflow: unknown peer — valid: hf-"),
        (["inputs"], "invalid choice: 'inputs'"),
        (["input", "--copies", "0"], "input: argument --copies: '0' must be >= 1"),
        (["input", "--readers", "arrow"], "--readers arrow: unknown reader 'arrow'"),
        (["input", "--corpus", "nope.txt"], "--corpus nope.txt: no such file"),
        (["input", "--data", "nope"], "--data nope: no metadata.json"),
        (["input", "--json", "/nonexistent/r.json"], "--json /nonexistent/r.json: no directory"),
        (["finetune", "--epochs", "0"], "finetune: argument --epochs: '0' must be >= 1"),
        (["finetune", "--preset", "huge"], "--preset 'huge' is not a model preset"),
        (["finetune", "--task-dir", "nope"], "--task-dir nope: no train.tsv"),
        (["finetune", "--max-seq-len", "600"], "--max-seq-len 600 exceeds BERT's 512"),
    ],
)
def test_errors_name_the_flag(argv, message, capsys):
  assert message in _one_line_error(argv, capsys)


def test_specs_name_their_fields():
  """The library speaks its own terms; the command translates them to flags."""
  with pytest.raises(errors.ConfigError, match=r"BenchSpec.seq_len=1024 exceeds"):
    bench.BenchSpec(seq_len=1024)
  with pytest.raises(errors.ConfigError, match=r"BenchSpec.remat='some'"):
    bench.BenchSpec(preset="tiny", remat="some")
  with pytest.raises(errors.ConfigError, match=r"compare=tf: unknown peer"):
    bench.check_peers(("hf-torch", "tf"))
  with pytest.raises(errors.ConfigError, match=r"FinetuneSpec.learning_rate=0"):
    finetuning.FinetuneSpec("d", "t", learning_rate=0)
  with pytest.raises(errors.InputNotFoundError, match=r"FinetuneSpec.tokenizer=nope"):
    finetuning.FinetuneSpec(os.path.join(REPO, "data", "movie_snippets"), "nope").check_inputs()


def test_bf16_peers_are_reported_unavailable():
  spec = bench.BenchSpec(preset="tiny", dtype="bfloat16")
  r = bench._run_peer("hf-torch", spec, spec.model_config(), None)
  assert r["status"] == "unavailable" and "float32" in r["reason"]


def test_bench_input_builds_the_spec_from_the_flags(tmp_path, monkeypatch, capsys):
  from bertjax.bench import input as input_bench

  seen = []
  monkeypatch.setattr(input_bench, "run", lambda spec: seen.append(spec) or {"stream": [1]})
  out = tmp_path / "r.json"
  argv = ["input", "--copies", "2", "--readers", "python", "--steps", "7", "--json", str(out)]
  assert bench_cmd.main(argv) == 0
  (spec,) = seen
  assert (spec.copies, spec.readers, spec.steps, spec.batch) == (2, ("python",), 7, 256)
  assert spec.corpus.endswith(os.path.join("data", "austen.txt")) and not spec.data
  assert json.loads(capsys.readouterr().out) == {"stream": [1]} == json.loads(out.read_text())


def test_the_experiment_script_is_the_same_command_line(monkeypatch, capsys):
  from bertjax.bench import input as input_bench

  monkeypatch.syspath_prepend(REPO)
  from experiments import bench_input

  monkeypatch.setattr(input_bench, "run", lambda spec: {"batch": spec.batch})
  assert bench_input.main(["--batch", "3"]) == 0
  assert json.loads(capsys.readouterr().out) == {"batch": 3}
  assert bench_input.main(["--batch", "0"]) == 2
  assert capsys.readouterr().err.startswith("bertjax bench: input: argument --batch: '0'")


@pytest.mark.slow
def test_profile_breaks_the_step_down_by_model_op(tmp_path, capsys):
  assert (
      bench_cmd.main(
          TINY + ["--peak-flops", "1e12", "--profile", str(tmp_path / "prof"), "--profile-top", "8"]
      )
      == 0
  )
  out = capsys.readouterr().out
  assert "profile: 2 steps" in out and "untraced" in out
  table = out[out.index("profile: 2 steps") :].splitlines()
  assert len(table) == 2 + 8 + 2  # header, top 8 rows, the rest, untraced
  p = bench.profile_bertjax(
      bench.BenchSpec(preset="tiny", batch_size=8, seq_len=16, vocab_size=512),
      str(tmp_path / "prof2"),
  )
  assert os.path.exists(p["trace"]) and p["trace"].startswith(str(tmp_path / "prof2"))
  names = [r["op"] for r in p["ops"]]
  assert any("encoder/layer_N/intermediate/dot_general" in n for n in names), names[:10]
  assert any(n.startswith("transpose(jvp(") for n in names)  # the backward pass is there
  assert all("jit(_train_step)" not in n and "layer_0" not in n for n in names)
  attributed = sum(r["ms_per_step"] for r in p["ops"]) + p["untraced_ms_per_step"]
  np.testing.assert_allclose(attributed, p["span_ms_per_step"], rtol=1e-6)
  assert p["ops"] == sorted(p["ops"], key=lambda r: -r["ms_per_step"])


def _small_task(root, n_train=64, n_dev=32):
  """The first rows of the bundled single-sentence task."""
  src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "movie_snippets")
  os.makedirs(root, exist_ok=True)
  for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
    with open(os.path.join(src, name)) as f:
      lines = f.readlines()[: n + 1]
    with open(os.path.join(root, name), "w") as f:
      f.writelines(lines)
  return str(root)


@pytest.mark.long
@pytest.mark.slow
def test_bench_finetune_reports_both_runs(tmp_path, capsys):
  """A tiny `bench finetune`: one epoch on 64 rows beside the PyTorch peer (no timing checks)."""
  pytest.importorskip("torch")
  argv = [
      "finetune",
      "--task-dir",
      _small_task(tmp_path / "task"),
      "--preset",
      "tiny",
      "--max-seq-len",
      "32",
      "--length-bucket",
      "0",
      "--compare",
      "hf-torch",  # the padding-free peer: test_transformers_padding_free_bert_is_checked_...
      "--json",
  ]
  assert bench_cmd.main(argv) == 0
  r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert r["train_rows"] == 64 and r["dev_rows"] == 32 and r["tokens_max"] <= 32
  assert r["compiled_train_shapes"] == 1 and r["compiled_predict_shapes"] == 1
  torch_run = r["peers"]["hf-torch"]
  assert torch_run["status"] == "ok", torch_run["reason"]
  assert torch_run["steps"] == 2  # 64 rows at batch 32, as bertjax's epoch
  for run in (r, torch_run):
    assert run["wall_s"] > 0 and 0 <= run["accuracy"] <= 1 and np.isfinite(run["train_loss"])
  np.testing.assert_allclose(r["speedup_hf-torch"], torch_run["wall_s"] / r["wall_s"])
  report = finetuning.format_finetune_report(r)
  assert "hf-torch" in report and "dev acc" in report


@pytest.mark.long
@pytest.mark.slow
def test_bench_finetune_keras_hub_peer(tmp_path, capsys):
  """keras-hub's BertTextClassifier: an epoch on the same 64 rows and the dev accuracy."""
  _needs_keras_hub()
  argv = ["finetune", "--task-dir", _small_task(tmp_path / "task"), "--preset", "tiny"]
  argv += ["--max-seq-len", "16", "--length-bucket", "0", "--compare", "keras-hub", "--json"]
  assert bench_cmd.main(argv) == 0
  r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  peer = r["peers"]["keras-hub"]
  assert peer["status"] == "ok", peer["reason"]
  assert peer["steps"] == 2 and peer["wall_s"] > 0 and 0 <= peer["accuracy"] <= 1
  assert np.isfinite(peer["train_loss"])
  np.testing.assert_allclose(r["speedup_keras-hub"], peer["wall_s"] / r["wall_s"])
  assert any(d.startswith("padding: keras-hub") for d in peer["differences"])
  report = finetuning.format_finetune_report(r)
  assert "keras-hub vs bertjax" in report and "padded to --max-seq-len" in report


def test_bench_finetune_packed_compiles_one_shape_each(tmp_path, capsys):
  argv = ["finetune", "--task-dir", _small_task(tmp_path / "task"), "--preset", "tiny"]
  argv += ["--max-seq-len", "32", "--packing", "--compare", "", "--json"]
  assert bench_cmd.main(argv) == 0
  out = capsys.readouterr()
  r = json.loads(out.out)  # --json: stdout is one JSON object, the epoch lines go to stderr
  assert "epoch 1" in out.err
  assert r["packing"] == 2  # 32 // 16 examples a row at most, as `glue --packing`
  assert r["compiled_train_shapes"] == 1 and r["compiled_predict_shapes"] == 1
  assert 0 <= r["accuracy"] <= 1 and np.isfinite(r["train_loss"])


def test_bench_finetune_errors_name_the_flag(tmp_path, capsys):
  argv = ["finetune", "--task-dir", _small_task(tmp_path / "task"), "--compare", "hf-flax"]
  assert _one_line_error(argv, capsys) == (
      "--compare hf-flax: unknown peer — valid: hf-torch, hf-torch-flat, keras-hub"
  )


def test_packing_needs_prepared_data():
  with pytest.raises(errors.ConfigError, match="BenchSpec.packing needs BenchSpec.data"):
    bench.BenchSpec(preset="tiny", packing=True)


def test_data_batches_report_the_real_token_share(austen_shards):
  """Batches of a prepared stream: packing fills more of the row slots with real tokens."""
  shares = {}
  for packing in (False, True):
    spec = bench.BenchSpec(
        preset="tiny",
        batch_size=4,
        seq_len=128,
        vocab_size=8000,
        data=str(austen_shards),
        packing=packing,
    )
    batch, shares[packing] = bench.data_batch(spec)
    assert batch["input_ids"].shape == (4, 128)
    assert ("segment_ids" in batch) == packing
  assert 0.5 < shares[False]["real_token_fraction"] < shares[True]["real_token_fraction"] <= 1.0
  assert shares[False]["examples_per_row"] == 1.0 <= shares[True]["examples_per_row"]
  r = {"step_ms": 100.0, **shares[True]}
  bench._add_rates(r, bench.BenchSpec(preset="tiny", batch_size=4), 1e9, 1e12)
  assert r["real_tokens_per_sec"] == pytest.approx(r["tokens_per_sec"] * r["real_token_fraction"])


def test_packing_comparison_flags_name_the_flag(tmp_path, capsys):
  assert "--compare-packing needs --data" in _one_line_error(["--compare-packing"], capsys)
  both = ["--data", str(tmp_path), "--packing", "--compare-packing"]
  assert "--compare-packing times the packed and the unpacked step both — drop --packing" in (
      _one_line_error(both, capsys)
  )
  profiled = ["--data", str(tmp_path), "--compare-packing", "--profile", str(tmp_path / "p")]
  assert _one_line_error(profiled, capsys) == (
      "--profile traces one step: run it without --compare-packing"
  )


def test_interleaved_steps_alternate_their_order():
  calls = []
  steps = {name: (lambda name=name: calls.append(name) or 0) for name in ("unpacked", "packed")}
  times = bench._interleaved(steps, rounds=4)
  assert calls == ["unpacked", "packed", "packed", "unpacked"] * 2
  assert {name: [len(t) for t in ts] for name, ts in times.items()} == {
      "unpacked": [4, 4],
      "packed": [4, 4],
  }


def test_packing_ratio_arithmetic():
  spec = bench.BenchSpec(preset="tiny", batch_size=4, seq_len=128, vocab_size=512)
  out = {"step_ms": 100.0, "cpu_ms": 180.0, "real_token_fraction": 0.5, "examples_per_row": 1.0}
  packed = {
      "step_ms": 125.0,
      "cpu_ms": 200.0,
      "real_token_fraction": 0.9,
      "examples_per_row": 2.5,
      "num_masked": 27,
  }
  bench._add_rates(out, spec, 1e9, 1e12)
  bench._add_packed(out, packed, [1.2, 1.5, 1.4], spec.model_config(), spec, 1e12)
  assert out["packed"]["real_tokens_per_sec"] == pytest.approx(4 * 128 * 0.9 * 1e3 / 125)
  assert out["packing_ratio"] == pytest.approx((0.9 / 125) / (0.5 / 100))  # 1.44
  assert out["packing_ratio_cpu"] == pytest.approx((0.9 / 200) / (0.5 / 180))  # 1.62
  assert out["packing_ratio_rounds"] == 1.4
  assert out["packed"]["model_flops_per_step"] > flops.pretraining_flops_per_step(
      spec.model_config(), 4, 128, spec.masked()
  )  # 27 masked slots a row against 20: more MLM head work


@pytest.mark.slow
def test_compare_packing_times_both_steps_in_one_run(austen_shards, capsys):
  argv = ["--preset", "tiny", "--vocab-size", "8000", "--batch-size", "8", "--seq-len", "64"]
  argv += ["--warmup", "1", "--steps", "3", "--peak-flops", "1e12", "--data", str(austen_shards)]
  assert bench_cmd.main(argv + ["--compare-packing", "--json"]) == 0
  r = json.loads(capsys.readouterr().out)
  p = r["packed"]
  assert r["compare_packing"] and not r["packing"]
  for row in (r, p):
    assert row["steps_timed"] == 3 and len(row["round_ms"]) == 3
    assert row["step_ms"] == pytest.approx(float(np.median(row["round_ms"])))
    assert row["cpu_ms"] > 0 and row["compile_s"] > 0
  assert r["real_token_fraction"] < p["real_token_fraction"] <= 1.0
  assert r["examples_per_row"] == 1.0 <= p["examples_per_row"]
  assert r["packing_ratio"] == pytest.approx(p["real_tokens_per_sec"] / r["real_tokens_per_sec"])
  rounds = [
      (p["real_token_fraction"] / tp) / (r["real_token_fraction"] / tu)
      for tu, tp in zip(r["round_ms"], p["round_ms"])
  ]
  assert r["packing_ratio_rounds"] == pytest.approx(float(np.median(rounds)))
  table = bench_spec.format_report(r)
  assert "bertjax packed" in table and "packing: real tokens/s packed / unpacked" in table


@pytest.mark.slow
def test_transformers_padding_free_bert_is_checked_then_timed():
  """The padding-free peer is timed only where the flattened examples are measured to stay
  apart; its classifier reads each example's [CLS] and gives the padded model's logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  spec = dict(
      vocab_size=64,
      hidden_size=16,
      num_layers=1,
      num_heads=2,
      intermediate_size=32,
      max_position_embeddings=32,
      seed=0,
  )
  r = peer_runs.run_torch_flat_finetune(spec)  # no data: the check alone
  assert r["name"] == "hf-torch-flat" and r["status"] == "unavailable", r
  check = r["flattening_check"]
  tol = peer_runs.FLAT_TOLERANCE
  # the two controls bound what the check can see, on any transformers version: padding keeps
  # the examples apart, and the row without position_ids (one sequence) lets them mix
  assert check["padded"] < tol
  assert check["joined"] > 10 * tol
  assert check["diff"]["eager"] is not None and check["diff"]["sdpa"] is not None  # run on CPU
  for impl, d in check["diff"].items():
    assert (d is None) == (impl in check["reason"]), (impl, check)
    assert (f"{impl} {d:.1e}" if d is not None else f"{impl} not available") in r["reason"]
  assert "padded batch" in r["reason"] and "without position_ids" in r["reason"]

  rng = np.random.default_rng(0)
  mask = (np.arange(12)[None] < rng.integers(3, 13, size=(10, 1))).astype(np.int32)
  ids = np.where(mask, rng.integers(5, 64, size=(10, 12)), 0).astype(np.int32)
  data = dict(input_ids=ids, token_type_ids=np.zeros_like(ids), attention_mask=mask)
  data["labels"] = rng.integers(0, 2, size=10)
  apart = [i for i, d in check["diff"].items() if d is not None and d <= tol]
  full = dict(spec, num_labels=2, batch_size=4, eval_batch_size=5, epochs=1, learning_rate=1e-3)
  full.update(weight_decay=0.01, warmup_fraction=0.1, threads=1)
  full.update(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  timed = peer_runs.run_torch_flat_finetune(full, data, data)
  if not apart:
    assert timed["status"] == "unavailable" and "no attention here" in timed["reason"]
    return
  assert timed["status"] == "ok", timed
  assert 0.0 <= timed["accuracy"] <= 1.0 and timed["steps"] == 3
  hf = bench_peers.hf_config(transformers, full)
  hf.num_labels = 2
  model = transformers.BertForSequenceClassification._from_config(
      hf, attn_implementation="sdpa" if "sdpa" in apart else apart[0]
  ).eval()
  idx = np.arange(10)
  with torch.inference_mode():
    flat = peer_runs.flat_logits(model, *peer_runs.flat_batch(torch, data, idx)).numpy()
    padded = model(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
    ).logits.numpy()
  np.testing.assert_allclose(flat, padded, atol=1e-5)
