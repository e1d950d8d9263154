"""`bertjax prepare` on this machine against `--runner beam` (Beam's DirectRunner), 1 and 2 workers.

    python experiments/bench_beam_prepare.py --copies 30 --workdir runs/bench_beam

writes the bundled corpus `--copies` times into one text file, prepares it with each runner and
worker count (`--processes N`: the local path's pool, the DirectRunner's worker processes) and
prints one JSON line per run: wall seconds, documents/s, tokens/s, the largest process's peak
memory, and the load average before the run (the machine may be shared). Needs the `beam`
extra (docs/data.md, "Past one host").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

# Runs one command and prints the peak memory of its largest process (it and its workers).
_MEASURE = (
    "import resource, subprocess, sys; "
    "rc = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(rc)"
)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--copies", type=int, default=30, help="copies of data/austen.txt")
  p.add_argument("--workdir", required=True)
  p.add_argument("--workers", default="1,2", help="worker counts to run, comma-separated")
  p.add_argument("--runners", default="local,beam")
  args = p.parse_args(argv)
  work = pathlib.Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  corpus = work / "corpus.txt"
  text = (REPO / "data" / "austen.txt").read_text().rstrip("\n") + "\n\n"
  corpus.write_text(text * args.copies)
  for workers in args.workers.split(","):
    for runner in args.runners.split(","):
      out = work / f"out_{runner}_{workers}"
      cmd = [sys.executable, "-m", "bertjax.cli", "prepare", "--input", str(corpus)]
      cmd += ["--tokenizer", str(REPO / "data" / "tokenizer.model"), "--output", str(out)]
      cmd += ["--overwrite", "--no-progress", "--runner", runner, "--processes", workers]
      load = os.getloadavg()[0]
      start = time.perf_counter()
      p = subprocess.run(
          [sys.executable, "-c", _MEASURE, *cmd], capture_output=True, text=True, check=False
      )
      wall = time.perf_counter() - start
      if p.returncode:
        print(p.stderr[-2000:], file=sys.stderr)
        return p.returncode
      meta = json.loads((out / "metadata.json").read_text())
      row = {
          "runner": runner,
          "workers": int(workers),
          "input_MB": round(meta["input_bytes"] / 1e6, 1),
          "documents": meta["documents"],
          "tokens": meta["tokens"],
          "wall_s": round(wall, 1),
          "docs_per_s": round(meta["documents"] / wall),
          "tokens_per_s": round(meta["tokens"] / wall),
          "peak_MB": round(int(p.stderr.strip().splitlines()[-1]) / 1024),
          "load_before": round(load, 2),
      }
      print(json.dumps(row), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
