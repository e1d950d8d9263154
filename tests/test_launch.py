"""launch/: dry runs print the expected gcloud/kubectl/srun commands; local launchers really run.

The multi-process tests start real processes that join one jax.distributed system over gloo
(2 processes x 4 CPU devices = one 8-device mesh), the way the scripts run on a pod.
"""

import os
import pathlib
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest

# Every test here runs a launch script (bash) or a command it starts.
pytestmark = pytest.mark.process

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
ARGS = [
    "pretrain",
    "--config",
    "experiments/pretrain.py:base",
    "--workdir",
    "gs://b/run",
    "--config.data.path=it's here",
]  # a quote and a space must survive every layer


def sh(cmd, env=None, check=True, timeout=120):
  """Runs cmd in its own process group; on a timeout the whole group (a launcher and the
  processes it started) is killed and the failure shows what they had printed."""
  full = dict(os.environ, **(env or {}))
  p = subprocess.Popen(
      cmd,
      cwd=REPO,
      env=full,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )
  try:
    out, err = p.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    out, err = p.communicate()
    raise Timeout(f"{cmd} ran past {timeout} s; it printed:\n{out[-4000:]}\n{err[-4000:]}")
  p = subprocess.CompletedProcess(cmd, p.returncode, out, err)
  if check and p.returncode != 0:
    raise AssertionError(f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
  return p


class Timeout(AssertionError):
  pass


def sh_processes(cmd, env=None, check=True, timeout=120):
  """sh() for commands whose processes meet over jax.distributed and gloo.

  Once, in a full test run on a loaded 2-core machine, the probe pair below stalled and never
  exited (no stall in about a hundred repeated runs since; the probe now also waits for every
  device and shuts jax.distributed down before exiting). What the launchers do is checked by
  the output, so a stalled attempt is reported as a warning, with what it printed, and run once
  more; a second stall fails the test.
  """
  env_of = env if callable(env) else lambda: env  # a callable gives each attempt its own env
  try:
    return sh(cmd, env_of(), check, timeout)
  except Timeout as e:
    warnings.warn(f"first attempt stalled, running again: {e}")
    return sh(cmd, env_of(), check, timeout)


def lines(out: str) -> list[list[str]]:
  """Printed commands, split as a shell would (comments dropped)."""
  return [shlex.split(l) for l in out.splitlines() if l.strip() and not l.startswith("#")]


def remote(cmd: list[str]) -> str:
  return cmd[cmd.index("--command") + 1]


# ---------------------------------------------------------------------------------- tpu_pod.sh


def test_tpu_pod_dry_run_prints_create_setup_run_delete():
  out = sh(
      [
          "bash",
          "launch/tpu_pod.sh",
          "--dry-run",
          "--no-fit-check",
          "--name",
          "bert",
          "--zone",
          "us-central2-b",
          "--accelerator",
          "v4-32",
          "--project",
          "p1",
          "--",
          *ARGS,
      ]
  ).stdout
  cmds = lines(out)
  loc = ["--zone", "us-central2-b", "--project", "p1"]
  assert cmds[0] == [
      "gcloud",
      "compute",
      "tpus",
      "tpu-vm",
      "create",
      "bert",
      *loc,
      "--accelerator-type",
      "v4-32",
      "--version",
      "tpu-ubuntu2204-base",
  ]
  assert cmds[1][:2] == ["tar", "czf"] and "--exclude=./.venv" in cmds[1]
  assert cmds[2][:7] == [
      "gcloud",
      "compute",
      "tpus",
      "tpu-vm",
      "scp",
      cmds[1][2],
      "bert:bertjax.tgz",
  ]
  ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert", *loc, "--worker=all"]
  assert cmds[3][: len(ssh)] == ssh and "pip install" in remote(cmds[3])
  assert cmds[4][: len(ssh)] == ssh
  job = remote(cmds[4])
  # The bertjax arguments reach the worker's shell intact.
  tail = shlex.split(job.split(".venv/bin/bertjax", 1)[1].split("2>&1")[0])
  assert tail == ARGS
  assert "JAX_COORDINATOR_ADDRESS" in job and "agent-worker-number" in job
  assert cmds[5] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "bert", *loc, "--quiet"]
  assert len(cmds) == 6


def test_tpu_pod_dry_run_queued_spot_reuse_keep():
  base = [
      "bash",
      "launch/tpu_pod.sh",
      "--dry-run",
      "--name",
      "q",
      "--zone",
      "z",
      "--accelerator",
      "v5litepod-16",
  ]
  cmds = lines(sh(base + ["--queued", "--spot", "--", "pretrain"]).stdout)
  assert cmds[0] == [
      "gcloud",
      "compute",
      "tpus",
      "queued-resources",
      "create",
      "q",
      "--node-id",
      "q",
      "--zone",
      "z",
      "--accelerator-type",
      "v5litepod-16",
      "--runtime-version",
      "v2-alpha-tpuv5-lite",
      "--spot",
  ]
  assert cmds[1][:5] == ["gcloud", "compute", "tpus", "queued-resources", "describe"]
  assert cmds[-1] == [
      "gcloud",
      "compute",
      "tpus",
      "queued-resources",
      "delete",
      "q",
      "--zone",
      "z",
      "--force",
      "--quiet",
  ]
  cmds = lines(sh(base + ["--reuse", "--no-setup", "--keep", "--", "pretrain"]).stdout)
  assert len(cmds) == 1 and cmds[0][4] == "ssh"  # only the job itself


def test_tpu_pod_dry_run_fit_check_stops_a_config_that_does_not_fit():
  """The dry run first compiles the job for --accelerator with the TPU compiler."""
  pytest.importorskip("libtpu", reason="the fit check needs libtpu (pip install -e '.[tpu]')")
  p = sh(
      [
          "bash",
          "launch/tpu_pod.sh",
          "--dry-run",
          "--name",
          "b",
          "--zone",
          "z",
          "--accelerator",
          "v5litepod-4",
          "--",
          "pretrain",
          "--config",
          "experiments/pretrain.py:large",
          "--workdir",
          "gs://b/l",
          "--config.model.vocab_size=30522",
      ],
      check=False,
      timeout=300,
  )
  assert p.returncode == 1 and not lines(p.stdout), p.stderr[-3000:]
  assert "# fit check: compiling the train step for v5litepod-4" in p.stderr
  assert "DOES NOT FIT on v5litepod-4: phase 1 needs" in p.stderr
  assert "Traceback" not in p.stderr
  assert "the fit check for v5litepod-4 failed (exit 1, above); no commands printed" in p.stderr


def test_tpu_pod_dry_run_fit_check_skipped_without_libtpu(tmp_path):
  no_libtpu = tmp_path / "python"
  no_libtpu.write_text("#!/bin/sh\nexit 1\n")  # answers "no" to the libtpu probe
  no_libtpu.chmod(0o755)
  p = sh(
      [
          "bash",
          "launch/tpu_pod.sh",
          "--dry-run",
          "--name",
          "b",
          "--zone",
          "z",
          "--accelerator",
          "v4-8",
          "--",
          *ARGS,
      ],
      env={"BERTJAX_PYTHON": str(no_libtpu)},
  )
  assert "# fit check skipped: no libtpu" in p.stderr
  assert lines(p.stdout)[0][:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--zone", "z", "--accelerator", "v4-8", "--", "x"], "--name is required"),
        (
            ["--name", "n", "--zone", "z", "--accelerator", "v9-8", "--", "x"],
            "no default --version",
        ),
        (["--name", "n", "--zone", "z", "--accelerator", "v4-8"], "no bertjax arguments"),
        (
            ["--name", "n", "--zone", "z", "--accelerator", "v4-8", "--bogus"],
            "unknown option --bogus",
        ),
    ],
)
def test_tpu_pod_errors(argv, message):
  p = sh(["bash", "launch/tpu_pod.sh", "--dry-run", *argv], check=False)
  assert p.returncode == 2 and message in p.stderr


def test_tpu_worker_env_parses_both_endpoint_formats():
  for endpoints in ("unknown:unknown:10.0.0.5,unknown:unknown:10.0.0.6", "10.0.0.5,10.0.0.6"):
    script = textwrap.dedent(f"""
      source launch/lib.sh
      curl() {{ case "$*" in *agent-worker-number) echo 1 ;; *) echo {endpoints} ;; esac; }}
      eval "$TPU_WORKER_ENV"; echo "$W $N $C"
    """)
    assert sh(["bash", "-c", script]).stdout.strip() == "1 2 10.0.0.5"


# ---------------------------------------------------------------------------------- GKE JobSet


def test_gke_jobset_example_is_the_scripts_output(tmp_path):
  committed = (LAUNCH / "gke_jobset.yaml").read_text()
  header, body = committed.split("\n", 1)
  argv = shlex.split(header.removeprefix("# Generated by: python "))
  out = tmp_path / "j.yaml"
  argv[argv.index("-o") + 1] = str(out)
  sh([sys.executable, *argv])
  assert out.read_text().split("\n", 1)[1] == body  # rerun the header's command to update


def test_gke_jobset_manifest(tmp_path):
  yaml = pytest.importorskip("yaml")
  p = sh(
      [
          sys.executable,
          "launch/gke_jobset.py",
          "--name",
          "bert",
          "--image",
          "img:1",
          "--accelerator",
          "v5e",
          "--topology",
          "4x4",
          "--slices",
          "2",
          "--dry-run",
          "--",
          *ARGS,
      ]
  )
  text, _, cmds = p.stdout.partition("\nkubectl apply")
  doc = yaml.safe_load(text)
  job = doc["spec"]["replicatedJobs"][0]
  assert doc["kind"] == "JobSet" and job["replicas"] == 2
  spec = job["template"]["spec"]
  assert spec["parallelism"] == spec["completions"] == 4  # 16 chips / 4 per host
  pod = spec["template"]["spec"]
  assert pod["nodeSelector"] == {
      "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
      "cloud.google.com/gke-tpu-topology": "4x4",
  }
  c = pod["containers"][0]
  assert c["command"] == ["bertjax", *ARGS]
  assert c["resources"]["limits"]["google.com/tpu"] == 4
  env = {e["name"]: e for e in c["env"]}
  assert env["MEGASCALE_NUM_SLICES"]["value"] == "2"
  assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == "bert-slice-0-0.bert"
  assert lines("kubectl apply" + cmds) == [
      ["kubectl", "apply", "-f", "-"],
      [
          "kubectl",
          "logs",
          "-f",
          "--prefix",
          "--max-log-requests=1000",
          "-l",
          "jobset.sigs.k8s.io/jobset-name=bert",
      ],
      ["kubectl", "delete", "jobset", "bert"],
  ]


def test_gke_jobset_rejects_bad_topology():
  p = sh(
      [
          sys.executable,
          "launch/gke_jobset.py",
          "--name",
          "b",
          "--image",
          "i",
          "--accelerator",
          "v4",
          "--topology",
          "4x4",
          "--",
          "pretrain",
      ],
      check=False,
  )
  assert p.returncode == 2 and "needs 3 dimensions" in p.stderr


# ---------------------------------------------------------------------------------- SLURM


def _fake_bin(tmp_path, name, body):
  path = tmp_path / "bin" / name
  path.parent.mkdir(exist_ok=True)
  path.write_text("#!/usr/bin/env bash\n" + body)
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return path.parent


SCONTROL = 'if [[ "$1 $2" == "show hostnames" ]]; then echo node-a; echo node-b; fi\n'
SLURM_ENV = {"SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2"}


def test_slurm_dry_run(tmp_path):
  bindir = _fake_bin(tmp_path, "scontrol", SCONTROL)
  env = dict(SLURM_ENV, PATH=f"{bindir}:{os.environ['PATH']}", BERTJAX_DRY_RUN="1")
  out = sh(["bash", "launch/slurm_gpu.sbatch", *ARGS], env=env).stdout
  cmds = out.splitlines()
  srun = shlex.split(cmds[0])
  assert srun[:4] == ["srun", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
  assert srun[4:6] == ["bash", "-c"] and srun[7:] == ["bertjax", *ARGS]
  for i in (0, 1):
    assert shlex.split(cmds[1 + i].removeprefix(f"# task {i}: ")) == [
        "bertjax",
        *ARGS,
        "--coordinator_address=node-a:14242",
        "--num_processes=2",
        f"--process_id={i}",
    ]


PROBE = """
import argparse, sys
ap = argparse.ArgumentParser()
ap.add_argument("--coordinator_address"); ap.add_argument("--num_processes", type=int)
ap.add_argument("--process_id", type=int); ap.add_argument("--fail", type=int, default=-1)
a = ap.parse_args()
if a.process_id == a.fail:
  sys.exit(3)
import jax, numpy as np
from jax.experimental import multihost_utils
jax.distributed.initialize(a.coordinator_address, a.num_processes, a.process_id)
total = multihost_utils.process_allgather(np.array([a.process_id + 1])).sum()
multihost_utils.sync_global_devices("probe done")  # every device's collectives have finished
# one write per line: the tasks share a pipe, and print's text and newline can interleave
sys.stdout.write(f"process {jax.process_index()}/{jax.process_count()} "
                 f"devices {jax.device_count()} sum {total}\\n")
sys.stdout.flush()
jax.distributed.shutdown()
"""


@pytest.mark.slow
@pytest.mark.multihost
def test_slurm_script_runs_its_tasks(tmp_path, free_port):
  """A stand-in srun starts the tasks here; they must find each other as SLURM describes."""
  probe = tmp_path / "probe.py"
  probe.write_text(PROBE)
  _fake_bin(
      tmp_path,
      "scontrol",
      'if [[ "$1 $2" == "show hostnames" ]]; then echo localhost; ' "echo localhost; fi\n",
  )
  bindir = _fake_bin(
      tmp_path,
      "srun",
      textwrap.dedent("""
    n=1; while [[ "$1" == --* ]]; do [[ "$1" == --ntasks=* ]] && n=${1#--ntasks=}; shift; done
    for ((i = 0; i < n; i++)); do SLURM_PROCID=$i "$@" & done
    wait
  """),
  )
  env = dict(
      SLURM_ENV,
      PATH=f"{bindir}:{os.environ['PATH']}",
      BERTJAX=f"{sys.executable} {probe}",
      JAX_PLATFORMS="cpu",
      XLA_FLAGS="--xla_force_host_platform_device_count=2",
  )
  out = sh_processes(
      ["bash", "launch/slurm_gpu.sbatch", "--fail=-1"],
      env=lambda: dict(env, BERTJAX_PORT=str(free_port())),
  ).stdout
  assert sorted(l for l in out.splitlines() if l.startswith("process")) == [
      "process 0/2 devices 4 sum 3",
      "process 1/2 devices 4 sum 3",
  ]


# ---------------------------------------------------------------------------------- local_multihost.sh


def test_local_multihost_dry_run():
  out = sh(
      [
          "bash",
          "launch/local_multihost.sh",
          "2",
          "--devices",
          "2",
          "--port",
          "1234",
          "--dry-run",
          "--",
          *ARGS,
      ]
  ).stdout
  cmds = lines(out)
  for i, c in enumerate(cmds):
    assert c[:5] == [
        "env",
        "JAX_PLATFORMS=cpu",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo",
        "XLA_FLAGS=--xla_force_host_platform_device_count=2",
        "CUDA_VISIBLE_DEVICES=",
    ]
    assert c[5:] == [
        "bertjax",
        *ARGS,
        "--coordinator_address=localhost:1234",
        "--num_processes=2",
        f"--process_id={i}",
    ]
  assert len(cmds) == 2


@pytest.mark.slow
@pytest.mark.multihost
def test_local_multihost_processes_form_one_system(tmp_path):
  probe = tmp_path / "probe.py"
  probe.write_text(PROBE)
  env = {"BERTJAX": f"{sys.executable} {probe}"}
  out = sh_processes(
      [
          "bash",
          "launch/local_multihost.sh",
          "2",
          "--log-dir",
          str(tmp_path / "logs"),
          "--",
          "--fail=-1",
      ],
      env=env,
  ).stdout
  assert "[0] process 0/2 devices 8 sum 3" in out and "[1] process 1/2 devices 8 sum 3" in out
  assert "process 1/2" in (tmp_path / "logs" / "process_1.log").read_text()
  # One process failing stops the other (which would wait for it forever) and sets the status.
  p = sh(
      ["bash", "launch/local_multihost.sh", "2", "--", "--fail=1"], env=env, check=False, timeout=60
  )
  assert p.returncode == 3 and "stopping the others" in p.stderr
