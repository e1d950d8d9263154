"""Fine-tuning end to end: restore across meshes, learn a task, write every output file."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import flax.linen as nn

from bertjax.tasks.glue import submission, tasks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER = os.path.join(REPO, "data", "tokenizer.model")
FIXTURES = os.path.join(REPO, "tests", "fixtures", "glue")

_POS = "good great wonderful excellent delightful superb charming brilliant".split()
_NEG = "bad awful terrible boring dreadful dull poor horrible".split()
_FILLER = "the film movie story acting plot was is really quite a an and this it".split()


def _sentiment_glue_dir(root, n_train=256, n_dev=64, n_test=10) -> float:
  """GLUE_DIR/SST-2 whose label is decided by one sentiment word; returns the dev majority
  rate (60% positive, so always answering "1" scores about 0.6)."""
  r = random.Random(0)
  d = os.path.join(root, "SST-2")
  os.makedirs(d)

  def sent(label):
    words = [r.choice(_FILLER) for _ in range(r.randint(3, 7))]
    words.insert(r.randint(0, len(words)), r.choice(_POS if label else _NEG))
    return " ".join(words)

  dev_labels = []
  for split, n in (("train", n_train), ("dev", n_dev)):
    with open(os.path.join(d, f"{split}.tsv"), "w") as f:
      f.write("sentence\tlabel\n")
      for _ in range(n):
        label = int(r.random() < 0.6)
        f.write(f"{sent(label)}\t{label}\n")
        if split == "dev":
          dev_labels.append(label)
  with open(os.path.join(d, "test.tsv"), "w") as f:
    f.write("index\tsentence\n")
    for i in range(n_test):
      f.write(f"{i}\t{sent(i % 2)}\n")
  return max(np.mean(dev_labels), 1 - np.mean(dev_labels))


def _save_checkpoint_from_8_devices(path):
  import jax

  from bertjax.training import pretrained, sharding

  from bertjax import model as model_lib

  assert jax.device_count() == 8
  cfg = model_lib.from_preset("tiny", vocab_size=8000, max_position_embeddings=64)
  mesh = sharding.make_mesh(data=1, fsdp=8)
  model = model_lib.BertForPreTraining(cfg)
  d = model_lib.dummy_inputs(1, 8, 2)
  init = lambda k: model.init(
      k, d["input_ids"], d["token_type_ids"], d["attention_mask"], d["masked_positions"]
  )["params"]
  shardings = sharding.state_shardings(jax.eval_shape(init, jax.random.key(1)), mesh)
  params = jax.jit(lambda k: nn.unbox(init(k)), out_shardings=nn.unbox(shardings))(
      jax.random.key(1)
  )
  emb = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert len({str(s.index) for s in emb.addressable_shards}) == 8  # really split 8 ways
  pretrained.save_pretrained(str(path), cfg, params, tokenizer_path=TOKENIZER, step=7)


def _one_device_env():
  env = dict(os.environ)
  flags = [
      f
      for f in env.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count")
  ]
  env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


@pytest.mark.slow
def test_checkpoint_from_8_devices_finetuned_on_1_beats_majority(tmp_path):
  pytest.importorskip("bertjax.training.checkpoint")
  majority = _sentiment_glue_dir(str(tmp_path / "glue"))
  _save_checkpoint_from_8_devices(tmp_path / "ckpt")
  out = tmp_path / "out"
  cmd = [
      sys.executable,
      "-m",
      "bertjax.cli",
      "glue",
      "--task",
      "sst2",
      "--init",
      str(tmp_path / "ckpt"),
      "--data",
      str(tmp_path / "glue"),
      "--workdir",
      str(out),
      "--max-seq-len",
      "16",
      "--epochs",
      "6",
      "--learning-rate",
      "1e-3",
      "--no-progress",
  ]
  proc = subprocess.run(
      cmd, env=_one_device_env(), capture_output=True, text=True, timeout=600, cwd=str(tmp_path)
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert f"bertjax:{tmp_path / 'ckpt'}" in proc.stdout  # restored, not random
  results = json.loads((out / "results.json").read_text())
  acc = results["sst2"]["accuracy"]
  assert acc > majority + 0.05, (acc, majority, proc.stdout)
  # Per-epoch dev metrics, the best epoch kept, the leaderboard file.
  history = [json.loads(l) for l in (out / "sst2" / "metrics.jsonl").read_text().splitlines()]
  assert [h["epoch"] for h in history] == list(range(1, 7))
  assert max(h["accuracy"] for h in history) == acc
  best = json.loads((out / "sst2" / "best.json").read_text())
  assert best["dev"]["accuracy"] == acc and best["init"].startswith("bertjax:")
  assert (out / "sst2" / "best").is_dir()
  lines = (out / "submission" / "SST-2.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 11
  assert [l.split("\t")[0] for l in lines[1:]] == [str(i) for i in range(10)]
  assert {l.split("\t")[1] for l in lines[1:]} <= {"0", "1"}
  assert "| sst2 | accuracy |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_hf_encoder_restored_exactly_with_a_new_head(tmp_path):
  import shutil

  import jax

  from bertjax.interop import convert

  from bertjax import model as model_lib
  from bertjax.tasks import encoder as encoder_lib, finetuning, recipe as recipe_lib
  from bertjax.tasks.glue import finetune

  cfg = model_lib.from_preset("tiny", vocab_size=8000, max_position_embeddings=32)
  d = model_lib.dummy_inputs()
  params = nn.unbox(
      model_lib.BertForPreTraining(cfg).init(
          jax.random.key(3),
          d["input_ids"],
          d["token_type_ids"],
          d["attention_mask"],
          d["masked_positions"],
      )["params"]
  )
  convert.save_hf(params, cfg, tmp_path / "hf")
  shutil.copy(TOKENIZER, tmp_path / "hf" / "tokenizer.model")
  enc = encoder_lib.load_encoder(str(tmp_path / "hf"))
  assert enc.source.startswith("hf:") and enc.tokenizer.vocab_size == 8000
  trainer = finetune.make_trainer(tasks.TASKS["mnli"], enc, finetuning.Recipe(), total_steps=10)
  state = trainer.init_state(seed=0, learning_rate=2e-5)
  for (path, got), want in zip(
      jax.tree_util.tree_leaves_with_path(state.params["bert"]), jax.tree.leaves(params["bert"])
  ):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6, err_msg=str(path))
  assert state.params["classifier"]["kernel"].shape == (cfg.hidden_size, 3)
  assert float(recipe_lib.peak_learning_rate(state.opt_state)) == pytest.approx(2e-5)
  with pytest.raises(ValueError, match="init random needs tokenizer"):
    encoder_lib.load_encoder("random")
  with pytest.raises(FileNotFoundError, match="no such checkpoint"):
    encoder_lib.load_encoder(str(tmp_path / "missing"))


def _run_cli(argv):
  from bertjax.commands import glue

  assert glue.main(argv) == 0


@pytest.mark.slow
def test_tfds_mnli_sweep_writes_matched_mismatched_ax_and_spread(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  out = tmp_path / "out"
  with tfds.testing.mock_data(num_examples=40):
    _run_cli(
        [
            "--task",
            "mnli",
            "--init",
            "random",
            "--tokenizer",
            TOKENIZER,
            "--data",
            "tfds",
            "--workdir",
            str(out),
            "--max-seq-len",
            "16",
            "--epochs",
            "1",
            "--max-steps",
            "2",
            "--sweep",
            "--learning-rates",
            "1e-4",
            "--seeds",
            "2",
            "--no-progress",
        ]
    )
  row = json.loads((out / "results.json").read_text())["mnli"]
  assert set(row) == {
      f"{m}{s}"
      for m in ("matched_accuracy", "mismatched_accuracy")
      for s in ("", "_median", "_mean", "_std", "_runs")
  }
  assert row["matched_accuracy_runs"] == 2
  assert row["matched_accuracy"] >= row["matched_accuracy_mean"]
  sweep = json.loads((out / "mnli" / "sweep.json").read_text())
  assert [(s["learning_rate"], s["seed"]) for s in sweep] == [(1e-4, 0), (1e-4, 1)]
  assert sum(s["best"] for s in sweep) == 1
  kept = [
      s["seed"] for s in sweep if (out / "mnli" / f"lr0.0001-seed{s['seed']}" / "best").is_dir()
  ]
  assert kept == [s["seed"] for s in sweep if s["best"]]  # only the best run's checkpoint
  assert "± " in (out / "results.md").read_text()
  for name in ("MNLI-m", "MNLI-mm", "AX"):
    lines = (out / "submission" / f"{name}.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 41
    assert {l.split("\t")[1] for l in lines[1:]} <= {"entailment", "neutral", "contradiction"}


@pytest.mark.slow
def test_custom_regression_task(tmp_path):
  sts = os.path.join(FIXTURES, "STS-B")
  out = tmp_path / "out"
  _run_cli(
      [
          "--task",
          "custom",
          "--name",
          "sts",
          "--train",
          os.path.join(sts, "train.tsv"),
          "--dev",
          os.path.join(sts, "dev.tsv"),
          "--test",
          os.path.join(sts, "test.tsv"),
          "--text-columns",
          "sentence1,sentence2",
          "--label-column",
          "score",
          "--regression",
          "--init",
          "random",
          "--tokenizer",
          TOKENIZER,
          "--workdir",
          str(out),
          "--max-seq-len",
          "16",
          "--epochs",
          "1",
          "--no-progress",
      ]
  )
  row = json.loads((out / "results.json").read_text())["sts"]
  assert set(row) == {"pearson", "spearman"}
  assert all(-1.0 <= v <= 1.0 for v in row.values())
  assert "STS-B/train.tsv:5: label 'n/a'" in (out / "sts" / "skipped_rows.txt").read_text()
  lines = (out / "submission" / "sts.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 3
  assert [l.split("\t")[0] for l in lines[1:]] == ["0", "1"]
  float(lines[1].split("\t")[1])


# ------------------------------------------------------------------ submission format (no jax)

# file name -> how two predictions (class ids 0 and 1, or scores) are written
_SUBMISSIONS = {
    "cola": [("CoLA", ["0", "1"])],
    "sst2": [("SST-2", ["0", "1"])],
    "mrpc": [("MRPC", ["0", "1"])],
    "qqp": [("QQP", ["0", "1"])],
    "stsb": [("STS-B", ["0.000", "5.000"])],  # clipped to the 0-5 scale
    "mnli": [
        ("MNLI-m", ["entailment", "neutral"]),
        ("MNLI-mm", ["entailment", "neutral"]),
        ("AX", ["entailment", "neutral"]),
    ],
    "qnli": [("QNLI", ["entailment", "not_entailment"])],
    "rte": [("RTE", ["entailment", "not_entailment"])],
    "wnli": [("WNLI", ["0", "1"])],
}


@pytest.mark.parametrize("name", tasks.ALL)
def test_submission_files_names_and_labels(tmp_path, name):
  task = tasks.TASKS[name]
  preds = np.array([-0.7, 5.2]) if task.is_regression else np.array([0, 1])
  written = [
      submission.write_submission(task, s, ["7", "8"], preds, str(tmp_path)) for s in task.test
  ]
  for path, (stem, labels) in zip(written, _SUBMISSIONS[name]):
    assert os.path.basename(path) == f"{stem}.tsv"
    assert open(path).read() == f"index\tprediction\n7\t{labels[0]}\n8\t{labels[1]}\n"
  all_names = {s.submission for t in tasks.TASKS.values() for s in t.test}
  assert all_names == {
      "CoLA",
      "SST-2",
      "MRPC",
      "STS-B",
      "QQP",
      "MNLI-m",
      "MNLI-mm",
      "QNLI",
      "RTE",
      "WNLI",
      "AX",
  }


def test_results_merge_and_markdown(tmp_path):
  submission.write_results(str(tmp_path), {"sst2": {"accuracy": 0.93}})
  cola = {"mcc": 0.5, "mcc_median": 0.46, "mcc_mean": 0.45, "mcc_std": 0.05, "mcc_runs": 5.0}
  submission.write_results(str(tmp_path), {"cola": cola})
  got = json.loads((tmp_path / "results.json").read_text())
  assert got == {"sst2": {"accuracy": 0.93}, "cola": cola}
  md = (tmp_path / "results.md").read_text().splitlines()
  assert md[0].startswith("| Task | Metric | Best on dev | Median over seeds |")
  assert md[2] == "| cola | mcc | 50.0 | 46.0 | 45.0 ± 5.0 (n=5) |"  # GLUE order: CoLA first
  assert md[3] == "| sst2 | accuracy | 93.0 |  |  |"
