#!/usr/bin/env bash
# Run `bertjax ARGS...` on every worker of a Cloud TPU VM slice: create, set up, run, tear down.
#
# usage: launch/tpu_pod.sh --name NAME --zone ZONE --accelerator TYPE [options] -- ARGS...
#
#   --name NAME          TPU VM (or queued resource) name
#   --zone ZONE          e.g. us-central2-b (v4), us-west4-a (v5e), us-east5-a (v5p)
#   --accelerator TYPE   e.g. v4-32, v5litepod-16, v5p-16, v6e-16 (hosts = chips / 4)
#   --project PROJECT    gcloud project (default: gcloud's configured project)
#   --version VERSION    TPU software version (default: picked from TYPE, see below)
#   --queued             ask for the slice as a queued resource and wait until it is ACTIVE
#   --spot               spot capacity (preemptible; pretraining resumes from its checkpoint)
#   --reuse              the slice exists: skip creation (and setup, with --no-setup)
#   --no-setup           skip copying the code and installing it
#   --keep               leave the slice up afterwards (default: delete it, even on failure)
#   --detach             start the job in the background on the workers and return; implies --keep
#   --env KEY=VALUE      environment variable for the job (repeatable)
#   --dry-run            print the commands instead of running them; first compiles a
#                        `pretrain --config ...` job for TYPE with the TPU compiler and stops
#                        if it does not fit (skipped without libtpu; see fit_check in lib.sh)
#   --no-fit-check       skip that compile
#
# The code of this checkout is copied to ~/bertjax on every worker and installed into
# ~/bertjax/.venv with jax[tpu]. Every worker then runs `bertjax ARGS...`; jax.distributed finds
# the other workers from the TPU metadata (JAX_COORDINATOR_ADDRESS is set to worker 0), so ARGS
# need no multi-host flags.
# Workdirs and data should be on GCS (gs://...; `bertjax prepare --runner beam` prepares there).
#
# example:
#   launch/tpu_pod.sh --name bert-base --zone us-central2-b --accelerator v4-32 --queued -- \
#     pretrain --config experiments/pretrain.py:base --workdir gs://BUCKET/bert-base \
#     --config.data.path=/home/$USER/data/wiki
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"

NAME="" ZONE="" ACCEL="" PROJECT="" VERSION="" QUEUED=0 SPOT=0 REUSE=0 SETUP=1 KEEP=0 DETACH=0
FIT_CHECK=1
ENVS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need_value "$1" $#; NAME=$2; shift 2 ;;
    --zone) need_value "$1" $#; ZONE=$2; shift 2 ;;
    --accelerator) need_value "$1" $#; ACCEL=$2; shift 2 ;;
    --project) need_value "$1" $#; PROJECT=$2; shift 2 ;;
    --version) need_value "$1" $#; VERSION=$2; shift 2 ;;
    --env) need_value "$1" $#; ENVS+=("$2"); shift 2 ;;
    --queued) QUEUED=1; shift ;;
    --spot) SPOT=1; shift ;;
    --reuse) REUSE=1; shift ;;
    --no-setup) SETUP=0; shift ;;
    --keep) KEEP=1; shift ;;
    --detach) DETACH=1; KEEP=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --no-fit-check) FIT_CHECK=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1; the bertjax arguments go after --" ;;
  esac
done
ARGS=("$@")
[[ -n "$NAME" ]] || die "--name is required"
[[ -n "$ZONE" ]] || die "--zone is required"
[[ -n "$ACCEL" ]] || die "--accelerator is required (e.g. v4-32, v5litepod-16)"
[[ ${#ARGS[@]} -gt 0 ]] || die "no bertjax arguments after -- (e.g. -- pretrain --config ...)"

if [[ -z "$VERSION" ]]; then
  # Runtime images per generation (cloud.google.com/tpu/docs/runtimes).
  case "$ACCEL" in
    v4-*) VERSION=tpu-ubuntu2204-base ;;
    v5litepod-*|v5e-*) VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) VERSION=v2-alpha-tpuv5 ;;
    v6e-*) VERSION=v2-alpha-tpuv6e ;;
    *) die "no default --version for accelerator $ACCEL; pass --version" ;;
  esac
fi

if [[ "$DRY_RUN" == 1 && "$FIT_CHECK" == 1 ]]; then
  fit_check "$ACCEL" "${ARGS[@]}"
fi

G=(gcloud compute tpus)
LOC=(--zone "$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project "$PROJECT")
SSH=("${G[@]}" tpu-vm ssh "$NAME" "${LOC[@]}" --worker=all)

teardown() {
  if [[ "$QUEUED" == 1 ]]; then
    run "${G[@]}" queued-resources delete "$NAME" "${LOC[@]}" --force --quiet
  else
    run "${G[@]}" tpu-vm delete "$NAME" "${LOC[@]}" --quiet
  fi
}

# ---------------------------------------------------------------------------------------------
# 1. The slice.
if [[ "$REUSE" == 0 ]]; then
  SPOT_FLAG=()
  [[ "$SPOT" == 1 ]] && SPOT_FLAG=(--spot)
  if [[ "$QUEUED" == 1 ]]; then
    run "${G[@]}" queued-resources create "$NAME" --node-id "$NAME" "${LOC[@]}" \
      --accelerator-type "$ACCEL" --runtime-version "$VERSION" "${SPOT_FLAG[@]}"
    if [[ "$DRY_RUN" == 1 ]]; then
      echo "# then poll until the state is ACTIVE:"
      run "${G[@]}" queued-resources describe "$NAME" "${LOC[@]}" --format='value(state.state)'
    else
      while :; do
        state=$("${G[@]}" queued-resources describe "$NAME" "${LOC[@]}" --format='value(state.state)')
        echo "queued resource $NAME: $state" >&2
        case "$state" in
          ACTIVE) break ;;
          FAILED|SUSPENDED) die "queued resource $NAME is $state" ;;
        esac
        sleep 30
      done
    fi
  else
    run "${G[@]}" tpu-vm create "$NAME" "${LOC[@]}" --accelerator-type "$ACCEL" \
      --version "$VERSION" "${SPOT_FLAG[@]}"
  fi
fi
if [[ "$KEEP" == 0 && "$DRY_RUN" == 0 ]]; then
  trap teardown EXIT  # a failed or interrupted run must not leave a slice billing
fi

# ---------------------------------------------------------------------------------------------
# 2. The code, on every worker.
if [[ "$SETUP" == 1 ]]; then
  SRC=$(cd "$HERE/.." && pwd)
  TARBALL=${TMPDIR:-/tmp}/bertjax-$NAME.tgz
  run tar czf "$TARBALL" -C "$SRC" --exclude=./.venv --exclude=./.git --exclude=./runs \
    --exclude=__pycache__ .
  run "${G[@]}" tpu-vm scp "$TARBALL" "$NAME:bertjax.tgz" "${LOC[@]}" --worker=all
  run "${SSH[@]}" --command "set -e; mkdir -p ~/bertjax && tar xzf ~/bertjax.tgz -C ~/bertjax && \
cd ~/bertjax && python3 -m venv .venv && .venv/bin/pip install -q -U pip && \
.venv/bin/pip install -q -e . 'jax[tpu]'"
fi

# ---------------------------------------------------------------------------------------------
# 3. The job: the same command on every worker, output streamed here and kept in ~/bertjax.log.
# JAX_COORDINATOR_ADDRESS (worker 0, jax's default TPU port) makes bertjax join the distributed
# system; jax reads this worker's index and the worker count from the metadata itself.
JOB="$TPU_WORKER_ENV; export JAX_COORDINATOR_ADDRESS=\${JAX_COORDINATOR_ADDRESS:-\$C:8482}; cd ~/bertjax && env $(shq "${ENVS[@]}" TF_CPP_MIN_LOG_LEVEL=1) .venv/bin/bertjax $(shq "${ARGS[@]}")"
if [[ "$DETACH" == 1 ]]; then
  run "${SSH[@]}" --command "nohup setsid bash -c $(shq "$JOB") > ~/bertjax.log 2>&1 < /dev/null &"
  echo "# started; follow worker 0 with:" >&2
  echo "$(shq "${G[@]}" tpu-vm ssh "$NAME" "${LOC[@]}" --worker=0 --command 'tail -F ~/bertjax.log')" >&2
else
  run "${SSH[@]}" --command "set -o pipefail; $JOB 2>&1 | tee ~/bertjax.log"
fi

# ---------------------------------------------------------------------------------------------
# 4. Tear down (the EXIT trap, when running for real).
if [[ "$KEEP" == 0 && "$DRY_RUN" == 1 ]]; then
  teardown
fi
