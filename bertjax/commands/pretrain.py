"""`bertjax pretrain --config experiments/pretrain.py:VARIANT --workdir DIR [--config.KEY=V ...]`.

Rerunning the same command with the same workdir resumes from its latest checkpoint.
Multi-host: on a TPU pod slice or under SLURM every process runs the same command and finds
the others itself; elsewhere pass --coordinator_address, --num_processes and --process_id.
"""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags


def define_flags(sys_argv: list[str]) -> flags.FlagValues:
  """A private flag set (no absl globals), so several commands can run in one process.

  `sys_argv` (program name first) is what ml_collections scans for `--config.KEY` overrides;
  it is not `sys.argv` when a command is called from Python (the demo, tests).
  """
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "experiments/pretrain.py:VARIANT",
                                  flag_values=fv, lock_config=True, sys_argv=sys_argv)
  flags.DEFINE_string("workdir", None, "output directory (local or gs://); reruns resume",
                      flag_values=fv)
  flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 (multi-host)",
                      flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "number of processes (multi-host)", flag_values=fv)
  flags.DEFINE_integer("process_id", None, "this process's index (multi-host)", flag_values=fv)
  return fv


def parse(argv: list[str], prog: str) -> flags.FlagValues | None:
  fv = define_flags([prog] + list(argv))
  if any(a in ("-h", "--help", "-help") for a in argv):
    print(__doc__)
    print(fv.main_module_help() if hasattr(fv, "main_module_help") else "")
    print(fv.get_help())
    return None
  try:
    fv([prog] + list(argv))
  except flags.Error as e:
    raise SystemExit(f"{prog}: {e}")
  if fv.config is None:
    raise SystemExit(f"{prog}: --config is required, e.g. "
                     "--config experiments/pretrain.py:tiny")
  return fv


def main(argv: list[str]) -> int:
  fv = parse(argv, "bertjax pretrain")
  if fv is None:
    return 0
  if not fv.workdir:
    print("bertjax pretrain: --workdir is required (checkpoints, logs, metrics.jsonl)",
          file=sys.stderr)
    return 2
  from bertjax import distributed

  distributed.initialize(fv.coordinator_address, fv.num_processes, fv.process_id)
  from bertjax import loop

  return loop.train_and_evaluate(fv.config, fv.workdir)
