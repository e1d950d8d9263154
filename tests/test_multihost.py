"""Two processes x two CPU devices on localhost (gloo) == one process x four devices, and a
checkpoint written by two processes resumes in one."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import metrics_rows, pretrain_cmd, REPO


def _run(workdir, steps, processes: int, devices_per_process: int, port: int = 0):
  env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      PYTHONPATH=str(REPO),
      XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
      JAX_COMPILATION_CACHE_DIR=str(pathlib.Path(workdir).parent / "jax_cache"),
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  cmd = pretrain_cmd(workdir, steps) + ["--config.mesh.data=2", "--config.mesh.fsdp=-1"]
  if processes == 1:
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.returncode, out.stdout[-3000:], out.stderr[-5000:])
    return
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


@pytest.mark.slow
@pytest.mark.multihost
def test_two_processes_equal_one_process_and_checkpoints_carry_over(tmp_path, free_port):
  _run(tmp_path / "one", 8, processes=1, devices_per_process=4)
  _run(tmp_path / "two", 8, processes=2, devices_per_process=2, port=free_port())
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
