#!/usr/bin/env python3
"""Write (and optionally submit) a GKE JobSet that runs `bertjax ARGS...` on TPU slices.

usage: python launch/gke_jobset.py --name NAME --image IMAGE --accelerator GEN --topology T
           [--slices S] [--apply | --dry-run] [-o FILE] -- ARGS...

  --name NAME         JobSet name (lowercase letters, digits, '-')
  --image IMAGE       container image with bertjax and jax[tpu] installed, e.g. one built
                      from this repo: FROM python:3.11; COPY . /bertjax; RUN pip install
                      -e /bertjax 'jax[tpu]'; WORKDIR /bertjax
  --accelerator GEN   v4 | v5e | v5p | v6e (the GKE TPU node pool's generation)
  --topology T        slice topology of the node pool, e.g. 2x2x4 (v4/v5p) or 4x4 (v5e/v6e)
  --slices S          number of slices (default 1); > 1 is multislice over DCN, set
                      config.mesh.dcn_data=S in ARGS
  --max-restarts R    JobSet restarts after a failure or preemption (default 3); pretraining
                      resumes from its last checkpoint, so a restart loses little work
  -o FILE             write the manifest to FILE (default: stdout)
  --apply             kubectl apply the manifest, then stream the logs of every pod
  --dry-run           print the kubectl commands (apply, logs, delete) after the manifest

One pod per TPU VM host (4 chips each); GKE sets TPU_WORKER_ID/TPU_WORKER_HOSTNAMES in every pod
and jax.distributed reads them, so ARGS need no multi-host flags. Workdir and data go on GCS.
launch/gke_jobset.yaml is this script's output for the example below (tests keep them equal):

  python launch/gke_jobset.py --name bert-base --image us-docker.pkg.dev/PROJECT/bertjax/bertjax:latest \\
    --accelerator v4 --topology 2x2x4 -o launch/gke_jobset.yaml -- pretrain \\
    --config experiments/pretrain.py:base --workdir gs://BUCKET/bert-base \\
    --config.data.path=gs://BUCKET/wiki-prepared
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sys

# generation -> (GKE node label `cloud.google.com/gke-tpu-accelerator`, topology rank)
ACCELERATORS = {
    "v4": ("tpu-v4-podslice", 3),
    "v5e": ("tpu-v5-lite-podslice", 2),
    "v5p": ("tpu-v5p-slice", 3),
    "v6e": ("tpu-v6e-slice", 2),
}
CHIPS_PER_HOST = 4  # every multi-host TPU VM of these generations has 4 chips


def manifest(
    name: str,
    image: str,
    accelerator: str,
    topology: str,
    slices: int,
    max_restarts: int,
    args: list[str],
) -> dict:
  """The JobSet as plain data: one replicated job per slice, one pod per host."""
  label, rank = ACCELERATORS[accelerator]
  dims = [int(d) for d in topology.split("x")]
  chips = math.prod(dims)
  if len(dims) != rank or chips % CHIPS_PER_HOST:
    raise ValueError(
        f"--topology {topology}: {accelerator} needs {rank} dimensions "
        f"(e.g. {'2x2x4' if rank == 3 else '4x4'}) and a multiple of "
        f"{CHIPS_PER_HOST} chips"
    )
  hosts = chips // CHIPS_PER_HOST
  env = [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "1"}]
  if slices > 1:  # multislice: the slices find each other through the first pod of slice 0
    env += [
        {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": f"{name}-slice-0-0.{name}"},
        {"name": "MEGASCALE_NUM_SLICES", "value": str(slices)},
        {
            "name": "MEGASCALE_SLICE_ID",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}
            },
        },
    ]
  container = {
      "name": "bertjax",
      "image": image,
      "command": ["bertjax"] + list(args),
      "env": env,
      "ports": [{"containerPort": 8471}, {"containerPort": 8080}],  # TPU runtime, JAX coordinator
      "securityContext": {"privileged": True},  # TPU device access
      "resources": {"limits": {"google.com/tpu": CHIPS_PER_HOST}},
  }
  pod = {
      "hostNetwork": True,
      "dnsPolicy": "ClusterFirstWithHostNet",
      "nodeSelector": {
          "cloud.google.com/gke-tpu-accelerator": label,
          "cloud.google.com/gke-tpu-topology": topology,
      },
      "containers": [container],
  }
  return {
      "apiVersion": "jobset.x-k8s.io/v1alpha2",
      "kind": "JobSet",
      "metadata": {
          "name": name,
          "annotations": {
              # one slice per node pool: two jobs never share a slice
              "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
          },
      },
      "spec": {
          "failurePolicy": {"maxRestarts": max_restarts},
          "replicatedJobs": [
              {
                  "name": "slice",
                  "replicas": slices,
                  "template": {
                      "spec": {
                          "parallelism": hosts,
                          "completions": hosts,
                          "backoffLimit": 0,
                          "template": {"spec": pod},
                      }
                  },
              }
          ],
      },
  }


def to_yaml(x, indent: int = 0) -> str:
  """Block-style YAML for dicts/lists of scalars; strings as JSON, which YAML reads as is."""
  pad = " " * indent
  if isinstance(x, dict):
    lines = []
    for k, v in x.items():
      if isinstance(v, (dict, list)) and v:
        lines.append(f"{pad}{k}:\n{to_yaml(v, indent + 2)}")
      else:
        lines.append(f"{pad}{k}: {to_yaml(v)}")
    return "\n".join(lines)
  if isinstance(x, list):
    lines = []
    for v in x:
      body = to_yaml(v, indent + 2) if isinstance(v, (dict, list)) and v else to_yaml(v)
      lines.append(f"{pad}- {body.lstrip()}")
    return "\n".join(lines)
  if isinstance(x, bool):
    return "true" if x else "false"
  if isinstance(x, int):
    return str(x)
  if (
      isinstance(x, str)
      and re.fullmatch(r"[A-Za-z0-9_./:@-]+", x)
      and not re.fullmatch(r"(true|false|yes|no|on|off|null|~|[-+.0-9e]+)", x, re.I)
  ):
    return x
  return json.dumps(x)


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(
      prog="launch/gke_jobset.py",
      description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--name", required=True)
  parser.add_argument("--image", required=True)
  parser.add_argument("--accelerator", required=True, choices=sorted(ACCELERATORS))
  parser.add_argument("--topology", required=True)
  parser.add_argument("--slices", type=int, default=1)
  parser.add_argument("--max-restarts", type=int, default=3)
  parser.add_argument("-o", "--output")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--apply", action="store_true")
  mode.add_argument("--dry-run", action="store_true")
  if "--" not in argv:
    parser.parse_args(argv)  # --help, or a clear error for a bad option
    parser.error("the bertjax arguments go after --, e.g. -- pretrain --config ...")
  split = argv.index("--")
  opts, args = parser.parse_args(argv[:split]), argv[split + 1 :]
  if not args:
    parser.error("no bertjax arguments after --")
  if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", opts.name):
    parser.error(f"--name {opts.name!r}: use lowercase letters, digits and '-' (a DNS label)")
  try:
    doc = manifest(
        opts.name, opts.image, opts.accelerator, opts.topology, opts.slices, opts.max_restarts, args
    )
  except ValueError as e:
    parser.error(str(e))
  header = (
      "# Generated by: python launch/gke_jobset.py "
      + shlex.join([a for a in argv if a not in ("--apply", "--dry-run")])
      + "\n"
  )
  text = header + to_yaml(doc) + "\n"
  if opts.output:
    with open(opts.output, "w") as f:
      f.write(text)
  else:
    sys.stdout.write(text)
  path = opts.output or "-"
  commands = [
      ["kubectl", "apply", "-f", path],
      [
          "kubectl",
          "logs",
          "-f",
          "--prefix",
          "--max-log-requests=1000",
          "-l",
          f"jobset.sigs.k8s.io/jobset-name={opts.name}",
      ],
      ["kubectl", "delete", "jobset", opts.name],  # when done (or to stop it)
  ]
  if opts.dry_run:
    for c in commands:
      print(shlex.join(c))
  elif opts.apply:
    subprocess.run(commands[0], input=None if opts.output else text, text=True, check=True)
    print(f"submitted; stop with: {shlex.join(commands[2])}", file=sys.stderr)
    return subprocess.run(commands[1]).returncode  # pods may take minutes to be scheduled
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
