"""Two processes x two CPU devices on localhost (gloo), started by launch/local_multihost.sh ==
one process x four devices, and a checkpoint written by two processes resumes in one; a
pretraining run on prepared data resumes on another process count (2 -> 1 -> 2) using every
document of the epoch once."""

import collections
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import metrics_rows, pretrain_cmd, REPO, tiny_pretrain_argv


def _run(workdir, steps, processes: int, devices_per_process: int, port: int = 0, cmd=None) -> str:
  """Runs `cmd` (default: pretrain_cmd) on `processes` local processes; process 0's output."""
  env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      PYTHONPATH=str(REPO),
      XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
      JAX_COMPILATION_CACHE_DIR=str(pathlib.Path(workdir).parent / "jax_cache"),
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  cmd = (cmd or pretrain_cmd(workdir, steps)) + ["--config.mesh.data=2", "--config.mesh.fsdp=-1"]
  if processes == 1:
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.returncode, out.stdout[-3000:], out.stderr[-5000:])
    return out.stdout
  assert port, "two or more processes need the coordinator's port"
  procs = [
      subprocess.Popen(
          cmd
          + [
              f"--coordinator_address=localhost:{port}",
              f"--num_processes={processes}",
              f"--process_id={i}",
          ],
          env=env,
          cwd=REPO,
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
      )
      for i in range(processes)
  ]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs[0]


def _launch(workdir, steps: int, processes: int, devices_per_process: int) -> str:
  """`pretrain_cmd` as a user starts N local hosts: launch/local_multihost.sh (a free port, its
  environment, its [i]-prefixed output); the launcher's output."""
  cmd = pretrain_cmd(workdir, steps) + ["--config.mesh.data=2", "--config.mesh.fsdp=-1"]
  assert cmd[:3] == [sys.executable, "-m", "bertjax.cli"], cmd[:3]
  env = dict(
      os.environ,
      BERTJAX=f"{sys.executable} -m bertjax.cli",
      PYTHONPATH=str(REPO),
      JAX_COMPILATION_CACHE_DIR=str(pathlib.Path(workdir).parent / "jax_cache"),
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  launcher = ["bash", "launch/local_multihost.sh", str(processes), "--devices"]
  out = subprocess.run(
      [*launcher, str(devices_per_process), "--", *cmd[3:]],
      env=env,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      start_new_session=True,  # the launcher's processes die with it
  )
  assert out.returncode == 0, (out.returncode, out.stdout[-3000:], out.stderr[-5000:])
  return out.stdout


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.multihost
def test_two_processes_equal_one_process_and_checkpoints_carry_over(tmp_path):
  _run(tmp_path / "one", 8, processes=1, devices_per_process=4)
  out = _launch(tmp_path / "two", 8, processes=2, devices_per_process=2)
  # Both processes ran, each prefixed by the launcher, on one 4-device mesh.
  assert "[0] " in out and "[1] " in out and "on 4 cpu devices, 2 process(es)" in out, out[-2000:]
  one, _ = metrics_rows(tmp_path / "one")
  two, _ = metrics_rows(tmp_path / "two")
  assert set(two) == set(one)
  for s in one:
    assert two[s]["loss"] == pytest.approx(one[s]["loss"], rel=1e-5), s
  # Written by 2 processes at step 8, resumed by 1 process x 4 devices to step 12.
  _run(tmp_path / "two", 12, processes=1, devices_per_process=4)
  _run(tmp_path / "one", 12, processes=1, devices_per_process=4)
  one, _ = metrics_rows(tmp_path / "one")
  two, _ = metrics_rows(tmp_path / "two")
  for s in (10, 11, 12):
    assert two[s]["loss"] == pytest.approx(one[s]["loss"], rel=1e-5), s


# ------------------------------------------------------------------ resume on another host count
#
# What the run's processes drew is made observable through the input positions every checkpoint
# holds (one per process). The test builds the same streams in this process (the run's input
# config, read from its config.json) and draws them in lockstep, as the processes draw one global
# batch per step: their states must equal the run's at every checkpoint kept, before and after
# the change of process count, where the test carries the run's own saved states over with
# `resume_states` as the loop does. A stream is a pure function of its state (test_stream_hosts,
# test_pretraining_data), so the rows the test draws are the rows the run trained on; they are
# then counted against the rows of the epoch's blocks: each exactly once.

BATCH = 128  # global rows per step: 64 per process on two
SAVED_AT = 6  # mid-epoch: 2 x 6 x 64 (or 6 x 128) of the epoch's ~2,130 rows


@pytest.fixture(scope="module")
def one_file_data(tmp_path_factory) -> pathlib.Path:
  """2,250 one-sentence documents of the bundled corpus, prepared into ONE train and ONE
  held-out file (fewer files than processes): three blocks of the stream's 1,024 documents per
  epoch, one row each at seq 32, so an epoch is ~17 steps."""
  from bertjax.data import prepare as prepare_lib

  out = tmp_path_factory.mktemp("one_file")
  text = (REPO / "data" / "austen.txt").read_text().splitlines()
  lines = [line for line in text if 20 <= len(line) <= 120][:2250]
  (out / "corpus.txt").write_text("\n\n".join(lines) + "\n")
  prepare_lib.prepare(
      prepare_lib.PrepareConfig(
          output=str(out / "data"),
          tokenizer=str(REPO / "data" / "tokenizer.model"),
          inputs=(str(out / "corpus.txt"),),
          processes=1,
          progress=False,
          num_shards=1,
          eval_fraction=0.05,
          eval_shards=1,
      )
  )
  return out / "data"


def _prepared_cmd(workdir, data, steps: int) -> list[str]:
  return tiny_pretrain_argv(workdir) + [
      f"--config.data.path={data}",
      "--config.data.seq_len=32",
      "--config.data.max_predictions_per_seq=5",
      "--config.data.workers=1",  # in the process: no worker processes
      f"--config.train.batch_size={BATCH}",
      f"--config.train.steps={steps}",
      "--config.train.warmup_steps=2",
      "--config.log_every_steps=1",
      "--config.checkpoint.every_steps=3",
      "--config.eval.every_steps=6",
      "--config.eval.steps=1",
      "--config.eval.batch_size=16",
      "--config.tensorboard=false",
  ]


def _input_config(workdir):
  """The run's input config, built from its config.json as loop.make_stream builds it."""
  from bertjax.data import pretraining

  c = json.loads((workdir / "config.json").read_text())
  d = c["data"]
  return pretraining.InputConfig(
      source=d["source"],
      path=d["path"],
      seq_len=d["seq_len"],
      max_predictions_per_seq=d["max_predictions_per_seq"],
      pair_mode=d["pair_mode"],
      mask_prob=d["mask_prob"],
      seed=c["seed"],
      vocab_size=c["model"]["vocab_size"],
      packing=d["packing"],
      max_examples_per_row=d["max_examples_per_row"],
  )


def _streams(cfg, processes: int, states: list | None = None) -> list:
  """The run's streams, drawn here with the Python reader (the same batches as the run's
  tf.data reader, tests/test_data_tf_reader.py): no tf.data iterators are left for the garbage
  collector, whose finalizing them took 30-40 s at the end of this module."""
  from bertjax.data import pretraining

  cfg = dataclasses.replace(cfg, reader="python")
  return [
      pretraining.make_stream(
          cfg,
          global_batch_size=BATCH,
          process_index=i,
          process_count=processes,
          state=states[i] if states else None,
      )
      for i in range(processes)
  ]


def _rows(batch: dict) -> list[bytes]:
  """One key per row: all its features' bytes."""
  names = sorted(batch)
  return [b"".join(batch[k][r].tobytes() for k in names) for r in range(len(batch["input_ids"]))]


def _checkpointed_states(workdir) -> dict[int, list[dict]]:
  """{step: every process's input state} of the checkpoints the run kept."""
  out = {}
  for step_dir in (workdir / "checkpoints").iterdir():
    if step_dir.name.isdigit():
      data = json.loads((step_dir / "data" / "metadata").read_text())
      assert all(p["phase"] == 0 for p in data["processes"])
      out[int(step_dir.name)] = [p["stream"] for p in data["processes"]]
  return out


def _epoch_done(streams) -> bool:
  """Every stream is past epoch 0, and past what a carry-over left it of epoch 0."""
  return all(
      s.get_state()["epoch"] >= 1 and s.plan(s.item)[0] >= len(s.plan.leftover) for s in streams
  )


def _draw(streams, seen, drawn_states, step: int) -> None:
  """One global batch from every process's stream: its rows counted, their states kept."""
  for s in streams:
    seen.update(_rows(next(s)))
  drawn_states[step] = [json.loads(json.dumps(s.get_state())) for s in streams]


def _check_saved(workdir, drawn_states) -> dict[int, list[dict]]:
  """The run's checkpointed input positions equal the streams drawn here, step by step."""
  saved = _checkpointed_states(workdir)
  for step, states in saved.items():
    assert states == drawn_states[step], step
  return saved


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.multihost
def test_resume_on_another_process_count_uses_every_row_of_the_epoch_once(
    tmp_path, free_port, one_file_data
):
  """2 processes x 4 devices train to SAVED_AT (mid-epoch, mid-block), 1 process x 8 resumes to
  2 x SAVED_AT (still mid-epoch), 2 processes resume to the epoch's end: every run's checkpointed
  positions are the streams drawn here with the positions carried over as the loop carries
  them, and every row of the epoch is drawn exactly once across both changes."""
  from bertjax.data import pretraining

  workdir = tmp_path / "run"
  # Evaluation on one held-out file with 2 processes, and training from one file, work.
  out = _run(workdir, SAVED_AT, 2, 4, free_port(), _prepared_cmd(workdir, one_file_data, SAVED_AT))
  assert "on 8 cpu devices, 2 process(es)" in out, out[-2000:]
  _, evals = metrics_rows(workdir)
  assert [r["step"] for r in evals] == [SAVED_AT]
  cfg = _input_config(workdir)

  # The same streams, drawn here; their states at each step.
  seen, drawn_states = collections.Counter(), {}
  streams = _streams(cfg, 2)
  for step in range(1, SAVED_AT + 1):
    _draw(streams, seen, drawn_states, step)
  saved = _check_saved(workdir, drawn_states)
  assert sorted(saved) == [3, SAVED_AT]
  assert all(s["epoch"] == 0 for s in saved[SAVED_AT])
  assert any(s["offset"] > 0 for s in saved[SAVED_AT])  # a block partly used: mid-block

  # The run's saved positions carried over as the loop carries them; drawn to the next stop
  # (the end of the epoch for the last run): that many more steps for the run.
  step, before = SAVED_AT, 2
  for after, until in ((1, 2 * SAVED_AT), (2, None)):
    states, what = pretraining.resume_states(saved[step], after)
    streams = _streams(cfg, after, states)
    while step < until if until else not _epoch_done(streams):
      step += 1
      _draw(streams, seen, drawn_states, step)
    port = free_port() if after > 1 else 0
    out = _run(workdir, step, after, 8 // after, port, _prepared_cmd(workdir, one_file_data, step))
    said = f"input: the position saved by {before} process(es) carries over to {after}: {what}"
    assert said in out, out[-3000:]
    assert f"on 8 cpu devices, {after} process(es)" in out and "done: checkpoints in" in out
    train, _ = metrics_rows(workdir)
    assert sorted(train) == list(range(1, step + 1))
    saved = _check_saved(workdir, drawn_states)
    assert step in saved
    before = after
  assert all(s["epoch"] == 0 for s in drawn_states[2 * SAVED_AT])  # the 1-process run: mid-epoch

  # Every row of epoch 0's blocks was drawn exactly once across the changes; here every
  # document of the epoch gives one row (rows per block == documents per block).
  builder = _streams(cfg, 1)[0].builder
  blocks = range(builder.blocks_per_epoch)
  want = collections.Counter(r for t in blocks for r in _rows(builder(t)))
  got = collections.Counter({r: seen[r] for r in want})
  assert builder.blocks_per_epoch == 3
  assert sum(want.values()) == sum(len(builder.documents(t)) for t in blocks)
  assert got == want, (sum((got - want).values()), sum((want - got).values()))
