"""experiments/ablate.py: results parsing, tables and plot, resuming a half-finished sweep, and
one real 2-variant sweep end to end (tiny model, seq 32, a few steps, fixture GLUE task)."""

import csv
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import ablate  # noqa: E402

GLUE = str(REPO / "tests" / "fixtures" / "glue")


def write_jsonl(path, rows, tail=""):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_final_eval_needs_the_last_steps_eval(tmp_path):
  m = tmp_path / "metrics.jsonl"
  write_jsonl(
      m,
      [
          {"step": 5, "loss": 3.0},
          {"step": 5, "eval_mlm_loss": 2.0, "eval_mlm_perplexity": 7.4, "eval_nsp_accuracy": 0.6},
      ],
  )
  assert ablate.final_eval(str(tmp_path), 10) is None  # stopped half way: not done
  assert ablate.final_eval(str(tmp_path), 5) == {
      "mlm_perplexity": 7.4,
      "mlm_accuracy": None,
      "nsp_accuracy": 0.6,
      "disc_accuracy_replaced": None,
      "disc_accuracy_original": None,
  }
  # A line cut short by a kill is skipped; perplexity falls back to exp(loss).
  write_jsonl(m, [{"step": 10, "eval_mlm_loss": 1.0}], tail='{"step": 11, "lo')
  assert ablate.final_eval(str(tmp_path), 10)["mlm_perplexity"] == pytest.approx(2.71828, 1e-4)


def test_task_results_flattens_metrics(tmp_path):
  (tmp_path / "mrpc").mkdir()
  (tmp_path / "mrpc" / "results.json").write_text(
      json.dumps({"mrpc": {"accuracy": 0.8, "f1": 0.85, "accuracy_runs": 5.0}})
  )
  assert ablate.task_results(str(tmp_path), "mrpc") == {"mrpc_accuracy": 0.8, "mrpc_f1": 0.85}
  assert ablate.task_results(str(tmp_path), "sst2") is None


def args_for(out, *extra):
  return ablate.parse_args(["--sweep", "nsp", "--steps", "10", "--out", str(out), *extra])


def test_pretrain_argv_gives_every_variant_the_same_run(tmp_path):
  args = args_for(
      tmp_path, "--seq-len", "64", "--batch-size", "32", "--set", "train.learning_rate=1e-3"
  )
  argvs = [ablate.pretrain_argv(v, args, "WD", "DATA", 0) for v in ablate.variants("nsp", "tiny")]
  # Only --config differs between the variants.
  assert [a[2] for a in argvs] == [
      str(REPO / "experiments" / f) for f in ("pretrain.py:tiny", "no_nsp.py:tiny", "sop.py:tiny")
  ]
  assert all(a[3:] == argvs[0][3:] for a in argvs)
  a = argvs[0]
  for flag in (
      "--config.train.steps=10",
      "--config.seed=0",
      "--config.data.path=DATA",
      "--config.data.seq_len=64",
      "--config.data.max_predictions_per_seq=10",
      "--config.train.batch_size=32",
      "--config.train.learning_rate=1e-3",
  ):
    assert flag in a
  # Without --seq-len the config's length and predictions stay; the seed is the run's.
  a = ablate.pretrain_argv(ablate.variants("nsp", "demo")[0], args_for(tmp_path), "WD", "D", 3)
  assert "--config.seed=3" in a and not any("seq_len" in f or "max_predictions" in f for f in a)
  # The demo masks 30%: 0.3 * 64 -> 20 predictions.
  a = ablate.pretrain_argv(
      ablate.variants("nsp", "demo")[0],
      args_for(tmp_path, "--scale", "demo", "--seq-len", "64"),
      "WD",
      "D",
      0,
  )
  assert "--config.data.max_predictions_per_seq=20" in a


ROWS = [
    {
        "variant": "nsp",
        "pair_task": "NSP",
        "scale": "tiny",
        "steps": 10,
        "batch_size": "",
        "seq_len": 128,
        "seed": 0,
        "mlm_perplexity": 300.5,
        "mlm_accuracy": 0.1,
        "nsp_accuracy": 0.6,
        "sst2_accuracy": 0.7,
        "mrpc_accuracy": 0.6,
        "mrpc_f1": 0.7,
    },
    {
        "variant": "no_nsp",
        "pair_task": "none",
        "scale": "tiny",
        "steps": 10,
        "batch_size": "",
        "seq_len": 128,
        "seed": 0,
        "mlm_perplexity": 280.0,
        "mlm_accuracy": 0.12,
        "sst2_accuracy": 0.72,
        "mrpc_accuracy": 0.55,
        "mrpc_f1": 0.65,
    },
]


def test_csv_md_and_plot(tmp_path):
  vs = ablate.variants("nsp", "tiny")
  args = args_for(tmp_path)
  ablate.write_csv(str(tmp_path / "results.csv"), ROWS, vs)
  with open(tmp_path / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0]) == [
      "variant",
      "pair_task",
      "scale",
      "steps",
      "batch_size",
      "seq_len",
      "seed",
      "mlm_perplexity",
      "mlm_accuracy",
      "nsp_accuracy",
      "mrpc_accuracy",
      "mrpc_f1",
      "sst2_accuracy",
  ]
  assert rows[1]["nsp_accuracy"] == "" and float(rows[1]["sst2_accuracy"]) == 0.72
  ablate.write_md(str(tmp_path / "results.md"), ROWS, vs, args, "CMD")
  md = (tmp_path / "results.md").read_text().splitlines()
  assert (
      "| Pair task | seeds | MLM ppl | MLM acc | pair acc | mrpc_accuracy | mrpc_f1 | "
      "sst2_accuracy |"
  ) in md
  assert "| none | 1 | 280.00 | 0.1200 | - | 0.5500 | 0.6500 | 0.7200 |" in md
  ablate.plot(str(tmp_path / "nsp.png"), ROWS, vs, args)
  png = (tmp_path / "nsp.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_seeds_give_mean_std_and_error_bars_from_zero(tmp_path, monkeypatch):
  """Two seeds per variant: the table shows mean ± sample std, the plot draws error bars
  of that size and starts its perplexity axis at 0."""
  import matplotlib.axes

  rows = [
      dict(ROWS[0], seed=0, mlm_perplexity=300.0),
      dict(ROWS[0], seed=1, mlm_perplexity=310.0),
      dict(ROWS[1], seed=0, mlm_perplexity=280.0),
      dict(ROWS[1], seed=1, mlm_perplexity=270.0),
  ]
  vs = ablate.variants("nsp", "tiny")
  args = args_for(tmp_path, "--seeds", "0,1")
  ablate.write_md(str(tmp_path / "results.md"), rows, vs, args, "CMD")
  md = (tmp_path / "results.md").read_text()
  assert "| NSP | 2 | 305.00 ± 7.0711 |" in md and "| none | 2 | 275.00 ± 7.0711 |" in md
  calls = []
  real = matplotlib.axes.Axes.errorbar
  monkeypatch.setattr(
      matplotlib.axes.Axes,
      "errorbar",
      lambda self, x, y, yerr=None, **k: calls.append((list(y), list(yerr)))
      or real(self, x, y, yerr=yerr, **k),
  )
  real_ylim = matplotlib.axes.Axes.set_ylim
  limits = []
  monkeypatch.setattr(
      matplotlib.axes.Axes,
      "set_ylim",
      lambda self, *a, **k: limits.append(a) or real_ylim(self, *a, **k),
  )
  ablate.plot(str(tmp_path / "nsp.png"), rows, vs, args)
  assert calls[0] == ([305.0, 275.0], [pytest.approx(7.0711, 1e-4)] * 2)
  ours = [a for a in limits if len(a) == 2]  # matplotlib's own calls pass one list
  assert ours[0][0] == 0 and ours[0][1] > 310 and ours[1] == (0, 1)


class FakeBertjax:
  """Stands in for `bertjax pretrain/glue`: writes what they would, records the calls.

  `stop_at` makes a pretraining run stop early (as a kill would) the first time it is asked."""

  def __init__(self, stop_at=None):
    self.calls, self.stop_at = [], stop_at

  def __call__(self, argv, log, isolate):
    self.calls.append(argv)
    flag = lambda name: argv[argv.index(name) + 1]
    if argv[0] == "pretrain":
      wd = pathlib.Path(flag("--workdir"))
      steps = int(next(a for a in argv if a.startswith("--config.train.steps=")).split("=")[1])
      m = wd / "metrics.jsonl"
      done = len(m.read_text().splitlines()) if m.exists() else 0
      stop = self.stop_at if self.stop_at and not done else steps
      (wd / "checkpoints" / str(stop)).mkdir(parents=True, exist_ok=True)
      with open(m, "a") as f:
        f.write(json.dumps({"step": stop, "loss": 1.0}) + "\n")
        if stop == steps:
          f.write(
              json.dumps(
                  {
                      "step": stop,
                      "eval_mlm_loss": 2.0,
                      "eval_mlm_perplexity": 7.0,
                      "eval_mlm_accuracy": 0.3,
                      "eval_nsp_accuracy": 0.8,
                  }
              )
              + "\n"
          )
      self.stop_at = None
      return 0 if stop == steps else 1
    out = pathlib.Path(flag("--workdir"))
    out.mkdir(parents=True)
    task = flag("--name") if flag("--task") == "custom" else flag("--task")  # glue's results key
    (out / "results.json").write_text(json.dumps({task: {"accuracy": 0.5}}))
    return 0


def sweep(tmp_path, *extra):
  return [
      "--sweep",
      "nsp",
      "--steps",
      "10",
      "--out",
      str(tmp_path / "out"),
      "--data",
      str(tmp_path / "data"),
      "--glue-data",
      GLUE,
      *extra,
  ]


@pytest.mark.slow
def test_resume_half_finished_sweep(tmp_path, monkeypatch):
  fake = FakeBertjax(stop_at=4)  # the first variant's pretraining is "killed" at step 4
  monkeypatch.setattr(ablate, "run_bertjax", fake)
  assert ablate.main(sweep(tmp_path, "--tasks", "sst2")) == 1
  assert [c[0] for c in fake.calls] == ["pretrain"]
  # Rerun: the first variant resumes (same command: bertjax resumes from its checkpoint), ...
  fake.calls.clear()
  assert ablate.main(sweep(tmp_path, "--tasks", "sst2")) == 0
  exp = REPO / "experiments"
  assert [(c[0], c[2]) for c in fake.calls] == [
      ("pretrain", f"{exp}/pretrain.py:tiny"),
      ("glue", "sst2"),
      ("pretrain", f"{exp}/no_nsp.py:tiny"),
      ("glue", "sst2"),
      ("pretrain", f"{exp}/sop.py:tiny"),
      ("glue", "sst2"),
  ]
  # ... fine-tuning starts from the final checkpoint ...
  glue = fake.calls[1]
  assert glue[glue.index("--init") + 1] == str(
      tmp_path / "out" / "nsp" / "seed0" / "pretrain" / "checkpoints" / "10"
  )
  # ... and a third run with one more task only fine-tunes on that task.
  fake.calls.clear()
  assert ablate.main(sweep(tmp_path, "--tasks", "sst2,mrpc")) == 0
  assert [(c[0], c[2]) for c in fake.calls] == [("glue", "mrpc")] * 3
  with open(tmp_path / "out" / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["variant"] for r in rows] == ["nsp", "no_nsp", "sop"]
  assert rows[0]["mrpc_accuracy"] == "0.5" and rows[1]["nsp_accuracy"] == ""
  assert (tmp_path / "out" / "nsp.png").exists()


def test_resume_refuses_other_settings(tmp_path, monkeypatch):
  monkeypatch.setattr(ablate, "run_bertjax", FakeBertjax())
  assert ablate.main(sweep(tmp_path, "--only", "nsp")) == 0
  with pytest.raises(SystemExit, match=r"other settings.*'seeds': \(\[0\], \[1\]\)"):
    ablate.main(sweep(tmp_path, "--only", "nsp", "--seeds", "1"))
  with pytest.raises(SystemExit, match="not in sweep nsp; valid: nsp, no_nsp, sop"):
    ablate.main(sweep(tmp_path, "--only", "layers2"))


@pytest.mark.long
@pytest.mark.slow
def test_two_variant_tiny_sweep_end_to_end(tmp_path, capsys):
  """Real `bertjax pretrain` and `bertjax glue`, in this process, on the bundled corpus."""
  argv = [
      "--sweep",
      "nsp",
      "--only",
      "nsp,no_nsp",
      "--scale",
      "tiny",
      "--steps",
      "3",
      "--batch-size",
      "16",
      "--seq-len",
      "32",
      "--set",
      "eval.steps=1",
      "--glue-data",
      GLUE,
      "--tasks",
      "sst2",
      "--glue-flags",
      "--epochs 1 --batch-size 8 --eval-batch-size 8",
      "--out",
      str(tmp_path / "out"),
  ]
  assert ablate.main(argv) == 0
  out = tmp_path / "out"
  with open(out / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["variant"], r["pair_task"], r["steps"]) for r in rows] == [
      ("nsp", "NSP", "3"),
      ("no_nsp", "none", "3"),
  ]
  for r in rows:
    assert 1 < float(r["mlm_perplexity"]) < 1e5 and 0 <= float(r["sst2_accuracy"]) <= 1
  assert rows[0]["nsp_accuracy"] != "" and rows[1]["nsp_accuracy"] == ""
  assert (out / "nsp.png").stat().st_size > 5000
  assert "| NSP |" in (out / "results.md").read_text()
  # Same data for both: one prepared copy, passed to each variant.
  for v in ("nsp", "no_nsp"):
    cfg = json.loads((out / v / "seed0" / "pretrain" / "config.json").read_text())
    assert cfg["data"]["path"] == str(out / "data" / "austen") and cfg["seed"] == 0
  # Rerunning finds everything done and runs nothing.
  capsys.readouterr()
  assert ablate.main(argv) == 0
  printed = capsys.readouterr().out
  assert "$ bertjax" not in printed and printed.count("pretraining done") == 2


@pytest.mark.process
def test_isolated_run_keeps_its_log(tmp_path, capsys):
  log = tmp_path / "x.log"
  assert ablate.run_bertjax(["--version"], str(log), isolate=True) == 0
  assert log.read_text().startswith("bertjax ") and "bertjax " in capsys.readouterr().out
  assert ablate.run_bertjax(["nonesuch"], str(log), isolate=True) == 2
  assert "unknown command 'nonesuch'" in log.read_text()


# --------------------------------------------------------------------------- the modern ladder


def modern_args(out, *extra):
  return ablate.parse_args(["--sweep", "modern", "--steps", "100", "--out", str(out), *extra])


def test_modern_variants_and_argv(tmp_path):
  from experiments import modern

  args = modern_args(tmp_path, "--seeds", "0,1")
  assert (args.scale, args.target) == ("demo", modern.TARGET_MLM_ACCURACY)
  vs = ablate.variants("modern", "demo")
  assert [v.name for v in vs] == list(modern.RUNGS)
  assert [v.settings["rung"] for v in vs] == list(range(len(vs)))
  argvs = [ablate.pretrain_argv(v, args, "WD", "DATA", 1) for v in vs]
  assert [a[2] for a in argvs] == [
      str(REPO / "experiments" / f"modern.py:demo,rung={v.name}") for v in vs
  ]
  assert all(a[3:] == argvs[0][3:] for a in argvs)  # only the rung differs
  for flag in (
      "--config.train.steps=100",
      "--config.eval.every_steps=10",  # a curve of evaluations
      "--config.log_every_steps=10",
      "--config.train.warmup_steps=10",
      f"--config.eval.target_mlm_accuracy={modern.TARGET_MLM_ACCURACY}",
  ):
    assert flag in argvs[0]
  assert "--config.train.warmup_steps=10" in argvs[0]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--scale", "base"], "the modern sweep runs at demo, tiny"),
        (["--seq-len", "64"], "the modern sweep's scale fixes them"),
    ],
)
def test_modern_refuses_what_the_ladder_fixes(tmp_path, capsys, extra, message):
  with pytest.raises(SystemExit):
    modern_args(tmp_path, *extra)
  assert message in capsys.readouterr().err
  with pytest.raises(SystemExit):
    args_for(tmp_path, "--target", "0.3")
  assert "only the modern sweep" in capsys.readouterr().err


def fake_modern_run(workdir, fraction, seconds_per_eval, accs, reached=None):
  """metrics.jsonl as the loop writes it (eval rows before the same step's progress row)."""
  rows = [{"step": 1, "real_token_fraction": fraction, "elapsed_sec": 1.0}]
  for i, acc in enumerate(accs, 1):
    step = 10 * i
    ev = {
        "step": step,
        "eval_mlm_loss": 5.0,
        "eval_mlm_accuracy": acc,
        "elapsed_sec": seconds_per_eval * i,
    }
    if reached and reached["step"] == step:
      ev["time_to_target"] = reached
    rows += [ev, {"step": step, "real_token_fraction": fraction, "elapsed_sec": 1.0}]
  rows.append({"step": 10 * len(accs), "time_to_target": reached})
  write_jsonl(workdir / "metrics.jsonl", rows)


def test_modern_matched_tokens_wall_time_and_target(tmp_path):
  """Unpacked rows half real, packed rows all real: at matched real tokens the packed run is
  read half way; at matched wall time the slower run's last evaluation is the common point."""
  slow, packed = tmp_path / "slow", tmp_path / "packed"
  fake_modern_run(slow, 0.5, 20.0, [0.1, 0.2, 0.3, 0.4])
  hit = {"step": 20, "wall_s": 20.0, "tokens": 1000}
  fake_modern_run(packed, 1.0, 10.0, [0.15, 0.25, 0.35, 0.45], reached=hit)
  a = ablate.modern_results(str(slow), "demo")
  b = ablate.modern_results(str(packed), "demo")
  tokens = 40 * 128 * 32  # 40 steps of 128 x 32
  assert [p["tokens"] for p in a["_curve"]] == [tokens / 4 * k * 0.5 for k in (1, 2, 3, 4)]
  assert a["real_mtokens"] == pytest.approx(tokens * 0.5 / 1e6) and "target_step" not in a
  assert (b["target_step"], b["target_wall_s"]) == (20, 20.0)
  rows = [
      dict(a, variant="bert", rung=0, change="BERT", seed=0),
      dict(b, variant="packing", rung=7, change="packing", seed=0),
  ]
  points = ablate.matched(rows)
  assert points == {"tokens": tokens * 0.5, "wall_s": 40.0}
  assert rows[0]["acc_at_tokens"] == 0.4 and rows[1]["acc_at_tokens"] == 0.25
  assert rows[0]["acc_at_wall"] == 0.2 and rows[1]["acc_at_wall"] == 0.45
  # Table, CSV (without the curve) and plot.
  vs = ablate.variants("modern", "demo")
  args = modern_args(tmp_path)
  for r in rows:
    r.update(mlm_accuracy=r["_curve"][-1]["mlm_accuracy"], mlm_perplexity=100.0)
  ablate.write_csv(str(tmp_path / "results.csv"), rows, vs)
  with open(tmp_path / "results.csv") as f:
    head = next(csv.reader(f))
  assert head[:3] == ["variant", "rung", "change"] and "_curve" not in head
  assert {"acc_at_tokens", "acc_at_wall", "target_step", "target_wall_s"} <= set(head)
  ablate.write_md(str(tmp_path / "results.md"), rows, vs, args, "CMD", points)
  md = (tmp_path / "results.md").read_text()
  assert "0.082M real (not padding) training tokens" in md and "40 s of wall time" in md
  assert "| 0 | BERT | 1 | 100.00 | 0.4000 | 0.4000 | 0.2000 |" in md
  assert md.count("| 0/1 |") == 1 and md.count("| 1/1 |") == 1
  ablate.plot_modern(str(tmp_path / "modern.png"), rows, vs, args)
  assert (tmp_path / "modern.png").stat().st_size > 5000


@pytest.mark.long
@pytest.mark.slow
def test_two_rung_modern_sweep_end_to_end(tmp_path):
  """Real `bertjax pretrain` of rung 0 (BERT) and rung 7 (packing: every change before it
  too) on the bundled corpus, a few steps: the curve, the matched points and the table."""
  argv = [
      "--sweep",
      "modern",
      "--only",
      "bert,packing",
      "--steps",
      "4",
      "--set",
      "eval.steps=1",
      "--target",
      "0.0",  # reached at the first evaluation
      "--out",
      str(tmp_path / "out"),
  ]
  assert ablate.main(argv) == 0
  out = tmp_path / "out"
  with open(out / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["variant"], r["rung"], r["steps"]) for r in rows] == [
      ("bert", "0", "4"),
      ("packing", "7", "4"),
  ]
  for r in rows:
    assert 0 <= float(r["acc_at_tokens"]) <= 1 and 0 <= float(r["acc_at_wall"]) <= 1
    assert r["target_step"] == "1" and "nsp_accuracy" not in r  # single-segment eval
  # Packing puts more real tokens into the same 4 steps of 128 x 32.
  assert float(rows[1]["real_mtokens"]) > float(rows[0]["real_mtokens"])
  assert float(rows[0]["real_mtokens"]) <= 4 * 128 * 32 / 1e6
  for v in ("bert", "packing"):
    cfg = json.loads((out / v / "seed0" / "pretrain" / "config.json").read_text())
    assert (cfg["eval"]["mask_prob"], cfg["eval"]["pair_mode"], cfg["eval"]["packing"]) == (
        0.15,
        "none",
        False,
    )
  assert (out / "modern.png").stat().st_size > 5000
  assert "| 7 | packing | 1 |" in (out / "results.md").read_text()


# --------------------------------------------------------------------------- whole-word masking


def test_wwm_arms_differ_only_in_the_training_masking(tmp_path, capsys):
  from bertjax.commands import pretrain as pretrain_cmd
  from bertjax.training import loop

  args = ablate.parse_args(
      ["--sweep", "wwm", "--steps", "10", "--seeds", "0,1", "--out", str(tmp_path)]
  )
  assert (args.scale, args.tasks) == ("demo", ["zh_reviews"])  # the bundled Chinese task
  vs = ablate.variants("wwm", args.scale)
  assert [v.name for v in vs] == ["char", "wwm"]
  configs = {}
  for v in vs:
    argv = ablate.pretrain_argv(v, args, str(tmp_path / v.name), str(tmp_path / "data"), 1)
    configs[v.name] = pretrain_cmd.parse(argv[1:], "bertjax pretrain").config
  char, wwm = configs["char"], configs["wwm"]
  # Training masks characters in one arm, whole segmenter words in the other ...
  assert (char.data.whole_word_mask, wwm.data.whole_word_mask) == (False, True)
  # ... and the held-out stream masks single characters in both: the same scored positions.
  for c in (char, wwm):
    assert loop._held_out(c, "eval", "whole_word_mask", c.data.whole_word_mask) is False
  # Everything else is the same run: data, seed (so data order), steps, batch, model.
  a, b = char.to_dict(), wwm.to_dict()
  a["data"].pop("whole_word_mask"), b["data"].pop("whole_word_mask")
  assert a == b and char.seed == 1 and char.data.path == str(tmp_path / "data")
  # The downstream task is the bundled Chinese one, and its files exist.
  glue = ablate.glue_argv("zh_reviews", args, "INIT", "OUT", 0)
  assert glue[:5] == ["glue", "--task", "custom", "--name", "zh_reviews"]
  for flag in ("--train", "--dev"):
    assert pathlib.Path(glue[glue.index(flag) + 1]).is_file()


def test_wwm_needs_segmented_data_and_owns_the_masking(tmp_path, capsys):
  meta = {"tokenizer": {"vocab_size": 10}}
  (tmp_path / "metadata.json").write_text(json.dumps(meta))
  with pytest.raises(SystemExit, match="prepare it with --word-segmenter jieba"):
    ablate.check_segmented(str(tmp_path))
  meta["word_segmenter"] = {"name": "jieba", "version": "0.42.1"}
  (tmp_path / "metadata.json").write_text(json.dumps(meta))
  ablate.check_segmented(str(tmp_path))  # accepted
  with pytest.raises(SystemExit):
    ablate.parse_args(
        [
            "--sweep",
            "wwm",
            "--steps",
            "9",
            "--out",
            str(tmp_path),
            "--set",
            "data.whole_word_mask=true",
        ]
    )
  assert "the wwm sweep sets the masking itself" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    ablate.parse_args(["--sweep", "wwm", "--steps", "9", "--out", str(tmp_path), "--scale", "base"])
  assert "the wwm sweep runs at demo, tiny" in capsys.readouterr().err


def test_wwm_table_and_plot_show_the_mean_over_fine_tuning_seeds(tmp_path):
  vs = ablate.variants("wwm", "demo")
  args = ablate.parse_args(
      ["--sweep", "wwm", "--steps", "9", "--seeds", "0,1", "--out", str(tmp_path)]
  )
  rows = [
      {"variant": v.name, **v.settings, "seed": s, "mlm_accuracy": 0.1 + 0.01 * s + 0.05 * i}
      | {"zh_reviews_accuracy": 0.9, "zh_reviews_accuracy_mean": 0.7 + 0.02 * s}
      | {"zh_reviews_accuracy_std": 0.01, "zh_reviews_accuracy_median": 0.7}
      for i, v in enumerate(vs)
      for s in (0, 1)
  ]
  ablate.write_md(str(tmp_path / "results.md"), rows, vs, args, "CMD")
  md = (tmp_path / "results.md").read_text()
  head = next(l for l in md.splitlines() if l.startswith("| Masking"))
  # The best-of-seeds pick, medians and stds are left to the CSV.
  assert head.endswith("| MLM acc | zh_reviews_accuracy_mean |")
  assert "| character | 2 | 0.1050 ± 0.0071 | 0.7100 ± 0.0141 |" in md
  assert "| whole word (jieba) | 2 | 0.1550 ± 0.0071 |" in md
  ablate.plot(str(tmp_path / "wwm.png"), rows, vs, args)
  assert (tmp_path / "wwm.png").stat().st_size > 5000


def test_objective_arms_get_equal_model_flops_and_share_one_architecture(tmp_path, austen_shards):
  """--steps is BERT's MLM arm's; every other pretrained arm runs the steps of the same model
  FLOPs (ELECTRA's generator included), and an ELECTRA arm's encoder is its MLM arm's network."""
  from absl import flags
  from ml_collections import config_flags

  from bertjax.training import train

  args = ablate.parse_args(["--sweep", "objective", "--steps", "2000", "--out", str(tmp_path)])
  assert (args.scale, args.tasks) == ("demo", ["movie_snippets"])
  data = str(austen_shards)
  vs = {v.name: v for v in ablate.variants("objective", "demo")}
  budget = 2000 * ablate.step_flops(vs["mlm_bert"], args, data)
  for name in ("electra_bert", "mlm_modern", "electra_modern"):
    steps, per_step = ablate.variant_steps(vs[name], args, data), ablate.step_flops(
        vs[name], args, data
    )
    assert abs(steps * per_step - budget) <= per_step / 2, name
    assert steps < 2000, name  # each costs more per step than BERT's MLM at 15%
  # ELECTRA's step is dearer than its MLM arm's on the same block: the generator
  assert ablate.step_flops(vs["electra_bert"], args, data) > ablate.step_flops(
      vs["mlm_bert"], args, data
  )

  def model(v):
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=fv)
    fv(["x", f"--config={REPO / v.config}"])
    c = fv.config
    c.model.vocab_size = 8000
    return c, train.model_config(c)

  for block in ("bert", "modern"):
    (cm, mm), (ce, me) = model(vs[f"mlm_{block}"]), model(vs[f"electra_{block}"])
    assert mm == me and (cm.objective, ce.objective) == ("mlm", "electra")
    assert train.electra_generator_config(ce, me).hidden_size == me.hidden_size // 4
    assert vs[f"random_{block}"].random_init_of == f"mlm_{block}"


def test_objective_sweep_fine_tunes_random_init_with_the_arms_architecture(tmp_path, monkeypatch):
  """The random-init rows fine-tune the MLM arm's architecture and tokenizer with fresh weights,
  each row seed its own fine-tuning seeds; the pretrained arms get the 3-seed lr grid on the
  bundled task; table and plot carry every arm."""
  fake = FakeBertjax()
  monkeypatch.setattr(ablate, "run_bertjax", fake)
  flops = {"mlm_bert": 10.0, "electra_bert": 12.5, "mlm_modern": 11.0, "electra_modern": 13.0}
  monkeypatch.setattr(ablate, "step_flops", lambda v, args, data: flops[v.name])
  argv = ["--sweep", "objective", "--steps", "10", "--seeds", "0,1", "--out", str(tmp_path / "o")]
  assert ablate.main(argv + ["--data", str(tmp_path / "data")]) == 0
  pre = {c[c.index("--workdir") + 1]: c for c in fake.calls if c[0] == "pretrain"}
  steps = {w.split("/")[-3]: next(a for a in c if "train.steps=" in a) for w, c in pre.items()}
  assert steps == {
      "mlm_bert": "--config.train.steps=10",
      "electra_bert": "--config.train.steps=8",
      "mlm_modern": "--config.train.steps=9",
      "electra_modern": "--config.train.steps=8",
  }
  glue = [c for c in fake.calls if c[0] == "glue"]
  assert len(glue) == 12  # 6 rows x 2 seeds
  flag = lambda c, f: c[c.index(f) + 1]
  for c in glue:
    assert flag(c, "--name") == "movie_snippets" and "--sweep" in c
    assert flag(c, "--learning-rates") == "1e-3,3e-4"
  rand = [c for c in glue if flag(c, "--init") == "random"]
  assert [flag(c, "--seeds") for c in rand] == ["0,1,2", "0,1,2", "3,4,5", "3,4,5"]
  out = tmp_path / "o"
  assert flag(rand[2], "--preset") == str(
      out / "mlm_bert" / "seed1" / "pretrain" / "checkpoints" / "10"
  )
  assert flag(rand[2], "--tokenizer") == str(out / "mlm_bert" / "seed1" / "pretrain" / "tokenizer")
  assert {flag(c, "--seeds") for c in glue if flag(c, "--init") != "random"} == {"0,1,2"}
  md = (out / "results.md").read_text()
  for label in (
      "| ELECTRA | BERT | 2 | 8 |",
      "| none (random init) | modern | 2 | 0 |",
      "train TFLOPs",
  ):
    assert label in md
  assert (out / "objective.png").stat().st_size > 0
