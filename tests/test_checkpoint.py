"""Checkpoints: restore on another mesh, pretrained export/import, config mismatch, and
SIGKILL during / right after an async save followed by an exact resume."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bertjax import errors
from bertjax.training import checkpoint, loop, pretrained, sharding, train
from conftest import loop_config, metrics_rows, pretrain_cmd, REPO, run_until, tiny_config

REPO = pathlib.Path(__file__).resolve().parent.parent


def _equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


@pytest.mark.slow
def test_restore_on_another_mesh_and_load_pretrained(tmp_path):
  c = tiny_config()
  s8 = train.setup(c, sharding.make_mesh(2, 2, 2))
  state = s8.init_state(3)
  mngr = checkpoint.Manager(str(tmp_path), every_steps=1)
  meta = {"bert_config": s8.bert_config.to_dict(), "step": 7, "tokenizer": None}
  mngr.save(7, state, [{"step": 1}], meta)
  mngr.wait()
  # 8 devices (data=2 x fsdp=2 x tensor=2) -> 1 device, and -> fsdp=4 x tensor=2.
  for mesh in (sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]), sharding.make_mesh(1, 4, 2)):
    s = train.setup(c, mesh)
    restored = mngr.restore(7, s.abstract_state)
    _equal(restored.state, state)
    assert restored.state.params["mlm_bias"].sharding == s.state_shardings.params["mlm_bias"]
    assert restored.step == 7 and restored.data_states == [{"step": 1}]
    assert restored.meta == meta
  mngr.close()
  for path in (tmp_path, tmp_path / "checkpoints", tmp_path / "checkpoints" / "7"):
    pre = pretrained.load_pretrained(str(path))
    assert pre.step == 7 and pre.config == s8.bert_config
    assert pretrained.read_config(str(path)) == pre.config  # the same, without the params
    _equal(pre.params, state.params)
  # save_pretrained -> load_pretrained onto given shardings, with the tokenizer copied.
  out = tmp_path / "export"
  pretrained.save_pretrained(
      str(out), s8.bert_config, state.params, str(REPO / "data" / "tokenizer.model"), step=7
  )
  one = train.setup(c, sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
  pre = pretrained.load_pretrained(str(out), shardings=one.state_shardings.params)
  assert pretrained.read_config(str(out)) == pre.config == s8.bert_config
  assert (
      pathlib.Path(pre.tokenizer_path).read_bytes()
      == (REPO / "data" / "tokenizer.model").read_bytes()
  )
  _equal(pre.params, state.params)
  assert pre.params["mlm_bias"].sharding == one.state_shardings.params["mlm_bias"]


@pytest.mark.slow
def test_scanned_run_loads_unscanned(tmp_path):
  c = loop_config(2, **{"model.scan_layers": True, "eval.every_steps": 0})
  assert loop.train_and_evaluate(c, str(tmp_path)) == 0
  pre = pretrained.load_pretrained(str(tmp_path))
  enc = pre.params["bert"]["encoder"]
  assert set(enc) == {"layer_0", "layer_1"} and not pre.config.scan_layers
  # and continues pretraining from it (init_from) in a fresh unscanned run
  c2 = loop_config(1, **{"train.init_from": str(tmp_path), "eval.every_steps": 0})
  assert loop.train_and_evaluate(c2, str(tmp_path / "continued")) == 0


@pytest.mark.slow
def test_config_mismatch_names_the_field(tmp_path):
  run_until(loop_config(6, **{"eval.every_steps": 0}), tmp_path, 3)
  accepted = (tmp_path / "config.json").read_text()
  records = (tmp_path / "metrics.jsonl").read_text()
  c = loop_config(6, **{"model.hidden_size": 64, "model.intermediate_size": 256})
  with pytest.raises(checkpoint.CheckpointMismatchError, match=r"config.model.hidden_size=128"):
    loop.train_and_evaluate(c, str(tmp_path))
  # The rejected config never replaces the run's own, and its metrics are untouched.
  assert (tmp_path / "config.json").read_text() == accepted
  assert (tmp_path / "metrics.jsonl").read_text() == records


def _env():
  env = dict(
      os.environ,
      XLA_FLAGS="--xla_force_host_platform_device_count=4",
      JAX_PLATFORMS="cpu",
      PYTHONPATH=str(REPO),
  )
  return env


def _cached_env(tmp_path):
  """Subprocesses of one test share compiled programs through jax's persistent cache."""
  return dict(
      _env(),
      JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
  )


def _kill_when(workdir: pathlib.Path, ready, env, timeout=300) -> None:
  proc = subprocess.Popen(
      pretrain_cmd(workdir, 16),
      env=env,
      cwd=REPO,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  t0 = time.time()
  try:
    while proc.poll() is None and time.time() - t0 < timeout:
      if ready(workdir / "checkpoints"):
        proc.send_signal(signal.SIGKILL)
        break
      time.sleep(0.005)
  finally:
    proc.kill()
    proc.wait()


def _saving(ckpt_dir: pathlib.Path) -> bool:  # an orbax temporary step directory exists
  return ckpt_dir.exists() and any("tmp" in p.name for p in ckpt_dir.iterdir())


def _saved(ckpt_dir: pathlib.Path) -> bool:  # the first step directory is complete
  return (ckpt_dir / "4" / "commit_success.txt").exists() or (
      ckpt_dir.exists() and any(p.name.isdigit() for p in ckpt_dir.iterdir())
  )


@pytest.mark.long
@pytest.mark.slow
def test_sigkill_during_and_after_async_save_then_exact_resume(tmp_path):
  ref, env = tmp_path / "ref", _cached_env(tmp_path)
  subprocess.run(pretrain_cmd(ref, 16), env=env, cwd=REPO, check=True, capture_output=True)
  ref_rows, _ = metrics_rows(ref)
  for name, when in (("during", _saving), ("after", _saved)):
    wd = tmp_path / name
    _kill_when(wd, when, env)
    steps = (
        sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
        if (wd / "checkpoints").exists()
        else []
    )
    subprocess.run(pretrain_cmd(wd, 16), env=env, cwd=REPO, check=True, capture_output=True)
    rows, _ = metrics_rows(wd)  # later rows (the resumed run) overwrite earlier ones per step
    resumed_from = steps[-1] if steps else 0
    later = [s for s in ref_rows if s > resumed_from + 1]
    assert later, (name, resumed_from)
    for s in later:
      assert rows[s]["loss"] == ref_rows[s]["loss"], (name, s)


def _largest_file(step_dir: pathlib.Path) -> pathlib.Path:
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file()]
  return max(files, key=lambda p: p.stat().st_size)


def _damage(victim: pathlib.Path, how: str) -> None:
  if how == "flip":
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
  elif how == "truncate":
    victim.write_bytes(victim.read_bytes()[:-7])
  else:
    victim.unlink()


@pytest.mark.slow
def test_digest_finds_a_flipped_bit_a_truncation_and_a_missing_file(tmp_path):
  import shutil

  run_until(loop_config(3, **{"eval.every_steps": 0}), tmp_path / "run", 3)
  step = tmp_path / "run" / "checkpoints" / "3"
  assert checkpoint.verify_digest(step) is None
  for how, says in (("flip", "contents changed"), ("truncate", "bytes,"), ("delete", "missing")):
    copy = tmp_path / how
    shutil.copytree(step, copy)
    victim = _largest_file(copy)
    _damage(victim, how)
    problem = checkpoint.verify_digest(copy)
    assert problem is not None and problem.startswith(str(victim)) and says in problem, problem


def test_digest_walks_and_hashes_an_object_store_step_as_a_local_one(tmp_path, monkeypatch):
  """write_digest / verify_digest through etils.epath: `gs://` paths served from tmp_path by
  `epath.testing.mock_epath` give the digest the same files give locally."""
  from etils.epath import gpath
  from etils.epath import testing as epath_testing

  def files(root):
    (root / "state" / "d").mkdir(parents=True)
    (root / "state" / "d" / "abc").write_bytes(bytes(range(256)) * 9)
    (root / "state" / "_METADATA").write_text("{}")
    (root / "meta").mkdir()
    (root / "meta" / "metadata").write_text('{"step": 3}')

  files(tmp_path / "local" / "checkpoints" / "3")
  checkpoint.write_digest(tmp_path / "local" / "checkpoints" / "3")
  monkeypatch.chdir(tmp_path)  # gs://b/run is tmp_path/gs:/b/run
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # the mock's backend, not TF's
  remote = tmp_path / "gs:" / "b" / "run"
  files(remote / "checkpoints" / "3")
  with epath_testing.mock_epath():
    step = "gs://b/run/checkpoints/3"
    checkpoint.write_digest(step)
    digest = json.loads((remote / "checkpoints" / "3" / checkpoint.DIGEST_NAME).read_text())
    local = tmp_path / "local" / "checkpoints" / "3" / checkpoint.DIGEST_NAME
    assert digest == json.loads(local.read_text())
    assert sorted(digest["files"]) == ["meta/metadata", "state/_METADATA", "state/d/abc"]
    assert checkpoint.verify_digest(step) is None
    (remote / "checkpoints" / "3" / "state" / "d" / "abc").write_bytes(b"x" * 2304)
    assert checkpoint.verify_digest(step) == (
        f"{step}/state/d/abc: contents changed since it was saved (SHA-256 differs)"
    )


@pytest.mark.slow
def test_damaged_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path, capsys):
  """A damaged array file of the newest step is found by its digest, named by file and step,
  set aside (kept), and the run resumes from the step before: exactly where an uninterrupted
  run would be."""
  damage = "flip"
  kw = {"eval.every_steps": 0, "checkpoint.max_to_keep": 5}
  ref = tmp_path / "ref"
  assert loop.train_and_evaluate(loop_config(9, **kw), str(ref)) == 0
  ref_rows, _ = metrics_rows(ref)
  wd = tmp_path / "run"
  run_until(loop_config(9, **kw), wd, 6)
  assert (wd / "checkpoints" / "6" / checkpoint.DIGEST_NAME).exists()
  victim = _largest_file(wd / "checkpoints" / "6")
  _damage(victim, damage)
  capsys.readouterr()
  assert loop.train_and_evaluate(loop_config(9, **kw), str(wd)) == 0
  out = capsys.readouterr().out
  assert f"step 6 is damaged ({victim}" in out and "resuming from step 3" in out
  assert (wd / "bad_checkpoints" / "6").is_dir()  # kept for inspection, not deleted
  rows, _ = metrics_rows(wd)
  assert [rows[s]["loss"] for s in range(4, 10)] == [ref_rows[s]["loss"] for s in range(4, 10)]


@pytest.mark.slow
def test_no_good_checkpoint_is_one_error(tmp_path):
  kw = {"eval.every_steps": 0}
  run_until(loop_config(9, **kw), tmp_path, 6)
  for step in ("3", "6"):
    _largest_file(tmp_path / "checkpoints" / step).write_bytes(b"garbage")
  with pytest.raises(
      checkpoint.NoGoodCheckpointError, match=r"no good checkpoint in .*step 6: .*step 3: "
  ):
    loop.train_and_evaluate(loop_config(9, **kw), str(tmp_path))
  with pytest.raises(errors.InputNotFoundError, match="no checkpoint found"):  # both set aside
    pretrained.load_pretrained(str(tmp_path))


@pytest.mark.slow
def test_disk_full_during_a_save_is_one_line_and_removes_the_partial_step(
    tmp_path, capsys, monkeypatch
):
  """Orbax's out-of-space failure (as it raises it: a ValueError from tensorstore carrying
  ENOSPC) ends the run with exit 1 and one line naming the workdir and its free space; the
  partial step directory is gone and the previous step is intact."""
  import orbax.checkpoint as ocp

  real_save = ocp.CheckpointManager.save

  def save(self, step, *a, **k):
    if step == 6:
      (pathlib.Path(str(self.directory)) / "6.orbax-checkpoint-tmp").mkdir()
      raise ValueError(
          'RESOURCE_EXHAUSTED: Error writing local file "x": Failed to write 844 '
          "bytes to file 12: No space left on device [os_error_code='28']"
      )
    return real_save(self, step, *a, **k)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  assert loop.train_and_evaluate(loop_config(9, **{"eval.every_steps": 0}), str(tmp_path)) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith(
      f"bertjax pretrain: disk full while saving a checkpoint to {tmp_path} ("
  )
  assert (
      "GiB free); removed the partial step (6.orbax-checkpoint-tmp); newest complete "
      "checkpoint: 3" in err[-1]
  )
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3"]
